// Fits emu's block_fixed_point model to the fp8 accumulation probe's output (fp8_accum_probe's
// JSON lines on stdin): every model of the parameter grid replays every probe through
// emu::accumulate, and the models that reproduce all results bit for bit are printed, per mode
// (fast accumulation on and off), with the best partial matches where none is exact. The model
// is emu's own code, so a fitted model is the one the CPU twin and simt run.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <lowbit/emu/accumulate.hpp>
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>

namespace {

namespace emu = lowbit::emu;

struct sample {
  bool fast = false;
  std::vector<float> products;
  std::uint32_t bits = 0;
};

// The text after "key": in a line of fp8_accum_probe's output (its own fixed format).
std::string field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\": ";
  const auto at = line.find(k);
  if (at == std::string::npos)
    return {};
  auto v = at + k.size();
  if (line[v] == '"') {
    const auto end = line.find('"', v + 1);
    return line.substr(v + 1, end - v - 1);
  }
  const auto end = line.find_first_of(",}", v);
  return line.substr(v, end - v);
}

std::vector<std::uint8_t> codes(const std::string& hex) {
  std::vector<std::uint8_t> c(hex.size() / 2);
  for (std::size_t i = 0; i < c.size(); ++i)
    c[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return c;
}

float value(std::uint8_t c) {
  constexpr emu::format f = emu::e4m3fn;
  return emu::decode<float>(f, c);
}

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

} // namespace

int main() {
  std::vector<sample> samples;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.find("\"result_bits\"") == std::string::npos)
      continue;
    sample s;
    s.fast = field(line, "fast") == "true";
    const auto a = codes(field(line, "a")), b = codes(field(line, "b"));
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
      s.products.push_back(value(a[i]) * value(b[i])); // exact: e4m3 products fit float32
    s.bits = static_cast<std::uint32_t>(std::stoul(field(line, "result_bits")));
    samples.push_back(std::move(s));
  }
  std::printf("%zu probe results read\n", samples.size());
  const int blocks[] = {1, 2, 4, 8, 16, 32, 64};
  const int promotions[] = {0, 1, 2, 4, 8, 16, 32, 64};
  for (const bool fast : {true, false}) {
    std::vector<const sample*> mine;
    for (const sample& s : samples)
      if (s.fast == fast)
        mine.push_back(&s);
    std::size_t best = 0;
    emu::accumulation best_model{};
    int exact_fits = 0;
    std::printf("fast accumulation %s (%zu probes):\n", fast ? "on" : "off", mine.size());
    for (const int k : blocks)
      for (int f = 0; f <= emu::accumulation_max_fraction_bits; ++f)
        for (const bool align : {false, true})
          for (const auto t : {emu::term_rounding::toward_zero, emu::term_rounding::nearest_even})
            for (const auto r :
                 {emu::register_rounding::nearest_even, emu::register_rounding::toward_zero})
              for (const int n : promotions) {
                const emu::accumulation m = emu::block_fixed_point(k, f, align, t, r, n);
                std::size_t matched = 0;
                for (const sample* s : mine) {
                  const float got = emu::accumulate(m, s->products.data(),
                                                    static_cast<std::int64_t>(s->products.size()));
                  if (bits_of(got) != s->bits)
                    break; // the first mismatch rules the model out
                  ++matched;
                }
                if (matched == mine.size()) {
                  ++exact_fits;
                  std::printf(
                      "  fits: k=%d f=%d align_with_register=%d terms=%s reg=%s N=%d\n", k, f,
                      align ? 1 : 0,
                      t == emu::term_rounding::toward_zero ? "toward_zero" : "nearest_even",
                      r == emu::register_rounding::toward_zero ? "toward_zero" : "nearest_even", n);
                } else if (matched > best) {
                  best = matched;
                  best_model = m;
                }
              }
    if (exact_fits == 0)
      std::printf("  no model fits every probe; the longest prefix of probes matched (%zu) by k=%d "
                  "f=%d align=%d N=%d\n",
                  best, best_model.block, best_model.fraction_bits,
                  best_model.align_with_register ? 1 : 0, best_model.promote_every);
  }
  return 0;
}
