// Fits emu's block_fixed_point model to the fp8 accumulation probe's output (fp8_accum_probe's
// JSON lines on stdin): every model of the parameter grid replays every probe through
// emu::accumulator (fed the operands, add(a, b)), and the models that reproduce all results bit
// for bit are printed, per mode (fast accumulation on and off), with their mismatches per probe
// family; where none is exact, the model matching the longest prefix of probes, with its
// mismatches per family. The model is emu's own code, so a fitted model is the one the CPU twin
// and simt run.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <lowbit/emu/accumulate.hpp>
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>

namespace {

namespace emu = lowbit::emu;

struct sample {
  bool fast = false;
  std::string family;
  std::vector<float> a, b;    // the operands' values
  int emin_a = 0, emin_b = 0; // their formats' minimum normal exponents
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

// The line's operand format ("a_fmt" / "b_fmt": e4m3fn, the probes' own, where the line names
// none, or e5m2).
emu::format format_of(const std::string& fmt) {
  if (fmt.empty() || fmt == "e4m3fn")
    return emu::e4m3fn;
  if (fmt == "e5m2")
    return emu::e5m2;
  throw std::runtime_error("operand format " + fmt + ": expected e4m3fn or e5m2");
}

float value(std::uint8_t c, const emu::format& f) {
  return emu::decode<float>(f, c);
}

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

float replay(const emu::accumulation& m, const sample& s) {
  emu::accumulator acc(m, s.emin_a, s.emin_b);
  for (std::size_t i = 0; i < s.a.size(); ++i)
    acc.add(s.a[i], s.b[i]);
  return acc.finish();
}

const char* name(emu::term_rounding t) {
  return t == emu::term_rounding::toward_zero ? "toward_zero" : "nearest_even";
}
const char* name(emu::register_rounding r) {
  return r == emu::register_rounding::toward_zero ? "toward_zero" : "nearest_even";
}

const char* name(emu::product_exponent e) {
  switch (e) {
  case emu::product_exponent::of_product: return "of_product";
  case emu::product_exponent::of_operands: return "of_operands";
  default: return "of_operand_fields";
  }
}

void print_model(const char* what, const emu::accumulation& m) {
  std::printf("  %s: k=%d f=%d align_with_register=%d terms=%s reg=%s N=%d register_bits=%d "
              "exponent=%s\n",
              what, m.block, m.fraction_bits, m.align_with_register ? 1 : 0, name(m.terms),
              name(m.reg), m.promote_every, m.register_bits, name(m.exponent));
}

// The model's mismatches per probe family over all of `mine`.
void print_mismatches(const emu::accumulation& m, const std::vector<const sample*>& mine) {
  std::map<std::string, std::pair<int, int>> fam; // family: (mismatches, probes)
  for (const sample* s : mine) {
    auto& c = fam[s->family];
    ++c.second;
    c.first += bits_of(replay(m, *s)) != s->bits ? 1 : 0;
  }
  std::printf("    mismatches per family:");
  for (const auto& [f, c] : fam)
    std::printf(" %s %d/%d", f.c_str(), c.first, c.second);
  std::printf("\n");
}

} // namespace

int main() {
  std::vector<sample> samples;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.find("\"result_bits\"") == std::string::npos)
      continue;
    sample s;
    s.fast = field(line, "fast") == "true";
    s.family = field(line, "family");
    const auto a = codes(field(line, "a")), b = codes(field(line, "b"));
    const emu::format fa = format_of(field(line, "a_fmt")), fb = format_of(field(line, "b_fmt"));
    s.emin_a = fa.emin();
    s.emin_b = fb.emin();
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
      s.a.push_back(value(a[i], fa)); // the products are exact: fp8 products fit float32
      s.b.push_back(value(b[i], fb));
    }
    s.bits = static_cast<std::uint32_t>(std::stoul(field(line, "result_bits")));
    samples.push_back(std::move(s));
  }
  std::printf("%zu probe results read\n", samples.size());
  const int blocks[] = {1, 2, 4, 8, 16, 32, 64};
  const int promotions[] = {0, 1, 2, 4, 8, 16, 32, 64};
  const int register_bits[] = {12, 13, 14, 15, 16, 24};
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
              for (const int n : promotions)
                for (const int rb : register_bits)
                  for (const auto e :
                       {emu::product_exponent::of_product, emu::product_exponent::of_operands,
                        emu::product_exponent::of_operand_fields}) {
                    const emu::accumulation m = emu::block_fixed_point(k, f, align, t, r, n, rb, e);
                    std::size_t matched = 0;
                    for (const sample* s : mine) {
                      if (bits_of(replay(m, *s)) != s->bits)
                        break; // the first mismatch rules the model out
                      ++matched;
                    }
                    if (matched == mine.size()) {
                      ++exact_fits;
                      print_model("fits", m);
                    } else if (matched > best) {
                      best = matched;
                      best_model = m;
                    }
                  }
    if (exact_fits == 0) {
      std::printf("  no model fits every probe; the longest prefix of probes matched (%zu):\n",
                  best);
      print_model("best", best_model);
      print_mismatches(best_model, mine);
    }
    // The models of lowbit's Hopper preset, against this mode's probes.
    print_model("emu::hopper_fp8_accumulation", emu::hopper_fp8_accumulation(fast));
    print_mismatches(emu::hopper_fp8_accumulation(fast), mine);
  }
  return 0;
}
