// Exhaustive sweeps (ctest label `exhaustive`): every code of every format of at most 16 bits
// (exact decode, round trip), every float16 and bfloat16 value into every format of at most 8
// bits under every deterministic policy (emu and the cast twin), and every one of the 2^32 float
// inputs into e4m3fn and e5m2 (nearest-even, saturating and not). Expected results come from the
// reference through breakpoint tables (support.hpp). Each test prints its wall time.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>

#include <gtest/gtest.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/reference/round.hpp>

#include "support.hpp"

namespace {

namespace ref = lowbit::reference;
namespace emu = lowbit::emu;
namespace kn = lowbit::kernels;
namespace pt = lowbit::proptest;
using pt::test::breakpoint_table;
using pt::test::describe;
using pt::test::describe_input;
using pt::test::hex_code;

// Collects the first few mismatches of a sweep (from any thread) for the failure message.
class mismatches {
public:
  void add(const std::string& what) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (++count_ <= 20)
      text_ += what + "\n";
  }
  void expect_none(const char* sweep) {
    EXPECT_EQ(count_, 0u) << sweep << ": " << count_ << " mismatches; the first ones:\n" << text_;
  }

private:
  std::mutex mu_;
  std::uint64_t count_ = 0;
  std::string text_;
};

class timer {
public:
  explicit timer(const char* name) : name_(name), start_(pt::test::now_seconds()) {}
  ~timer() { std::printf("[wall time] %s: %.1f s\n", name_, pt::test::now_seconds() - start_); }

private:
  const char* name_;
  double start_;
};

// Every code: decode<double> is the exact value of the definition, with the sign of zero, NaN and
// Inf recognized as the definition says; decode<float> agrees where the format fits float.
TEST(exhaustive, decode_every_code) {
  const timer t("decode_every_code");
  mismatches bad;
  const auto formats = pt::test::formats_up_to(16);
  pt::test::on_threads(2, [&](int tid) {
    for (std::size_t i = static_cast<std::size_t>(tid); i < formats.size(); i += 2) {
      const emu::format f = formats[i].fmt;
      for (std::uint32_t c = 0; c < (1u << f.bits()); ++c) {
        const double d = emu::decode<double>(f, c);
        bool ok;
        if (ref::is_nan(f, c))
          ok = std::isnan(d) && emu::is_nan_code(f, c);
        else if (ref::is_inf(f, c))
          ok = std::isinf(d) && std::signbit(d) == ref::sign_of(f, c) && emu::is_inf_code(f, c);
        else
          ok = !std::isnan(d) && !std::isinf(d) && ref::exact(d) == ref::value_of(f, c) &&
               std::signbit(d) == ref::sign_of(f, c) && !emu::is_nan_code(f, c) &&
               !emu::is_inf_code(f, c);
        if (ok && f.fits_float()) {
          const float x = emu::decode<float>(f, c);
          ok = std::isnan(d) ? std::isnan(x)
                             : (static_cast<double>(x) == d && std::signbit(x) == std::signbit(d));
        }
        if (!ok)
          bad.add(formats[i].name + " code " + hex_code(c) + " decodes to " + describe_input(d));
      }
    }
  });
  bad.expect_none("decode");
}

// encode(decode(code)) gives the code back under every deterministic policy, from float and from
// double; the documented exceptions: Inf saturates to max, a subnormal code flushes to the zero of
// its sign, NaN codes give a NaN.
TEST(exhaustive, round_trip_every_code) {
  const timer t("round_trip_every_code");
  mismatches bad;
  const auto formats = pt::test::formats_up_to(16);
  const auto policies = pt::test::deterministic_policies();
  pt::test::on_threads(2, [&](int tid) {
    for (std::size_t i = static_cast<std::size_t>(tid); i < formats.size(); i += 2) {
      const emu::format f = formats[i].fmt;
      const ref::rational min_normal = ref::min_normal(f);
      // -0 exists where the sign bit alone is a number (not fnuz's NaN).
      const bool has_negative_zero = f.is_signed && f.has_zero && !ref::is_nan(f, f.sign_mask());
      for (std::uint32_t c = 0; c < (1u << f.bits()); ++c) {
        const bool nan = ref::is_nan(f, c), inf = ref::is_inf(f, c);
        const bool subnormal =
            !nan && !inf && ref::value_of(f, c) != 0 && abs(ref::value_of(f, c)) < min_normal;
        const double d = emu::decode<double>(f, c);
        for (const emu::policy& p : policies) {
          std::uint32_t want = c;
          if (inf && p.over == emu::overflow::saturate)
            want = f.max_code() | (ref::sign_of(f, c) ? f.sign_mask() : 0u);
          if (subnormal && p.sub == emu::subnormals::flush)
            want = ref::sign_of(f, c) && has_negative_zero ? f.sign_mask() : 0u;
          const std::uint32_t from_double = emu::encode(f, d, p);
          const std::uint32_t from_float =
              f.fits_float() ? emu::encode(f, emu::decode<float>(f, c), p) : from_double;
          const bool ok = nan ? ref::is_nan(f, from_double) && ref::is_nan(f, from_float)
                              : from_double == want && from_float == want;
          if (!ok)
            bad.add(formats[i].name + " " + describe(p) + " code " + hex_code(c) + " -> " +
                    hex_code(from_double) + " (double), " + hex_code(from_float) + " (float)");
        }
      }
    }
  });
  bad.expect_none("round trip");
}

// Every float16 and every bfloat16 value into every format of at most 8 bits, under every
// deterministic rounding x overflow x subnormals, through emu (float and double) and through the
// cast twin reading 16-bit inputs, against the reference's breakpoint table.
TEST(exhaustive, every_float16_and_bfloat16_into_small_formats) {
  const timer t("every_float16_and_bfloat16_into_small_formats");
  mismatches bad;
  const auto formats = pt::test::formats_up_to(8);
  std::vector<std::pair<emu::format, emu::policy>> jobs;
  for (const auto& nf : formats)
    for (const emu::policy& p : pt::test::deterministic_policies())
      if (p.nan == emu::nan_sign::preserve)
        jobs.push_back({nf.fmt, p});
  std::atomic<std::size_t> next{0};
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t b = 0; b < 65536; ++b)
    all[b] = static_cast<std::uint16_t>(b);
  pt::test::on_threads(2, [&](int) {
    std::vector<std::uint8_t> out(65536);
    for (std::size_t j; (j = next++) < jobs.size();) {
      const auto& [f, p] = jobs[j];
      const breakpoint_table table = pt::test::make_breakpoint_table(f, p);
      for (const auto& [src, type] : {std::pair{emu::float16, kn::dtype::float16},
                                      std::pair{emu::bfloat16, kn::dtype::bfloat16}}) {
        kn::cast(kn::tensor_view::contiguous(all.data(), type, {65536}),
                 kn::tensor_view::contiguous(out.data(), kn::dtype::uint8, {65536}), f, p, {},
                 kn::exec{1});
        for (std::uint32_t b = 0; b < 65536; ++b) {
          const double x = emu::decode<double>(src, b);
          const std::uint32_t want = table.expected(x);
          const std::uint32_t from_double = emu::encode(f, x, p);
          const std::uint32_t from_float = emu::encode(f, static_cast<float>(x), p);
          if (from_double != want || from_float != want || out[b] != want)
            bad.add(emu::format_name(f) + " " + describe(p) + " " + emu::format_name(src) + " " +
                    hex_code(b) + " = " + describe_input(x) + ": emu " + hex_code(from_double) +
                    " (double), " + hex_code(from_float) + " (float), twin " + hex_code(out[b]) +
                    ", reference " + hex_code(want));
        }
      }
    }
  });
  bad.expect_none("16-bit sources");
}

// ---- every float into e4m3fn and e5m2 ----------------------------------------------------------

template <emu::format F, emu::policy P> struct config {
  static constexpr emu::format fmt = F;
  static constexpr emu::policy pol = P;
  static std::uint32_t encode(float x) { return emu::encode(F, x, P); }
};
using c0 = config<emu::e4m3fn, emu::rne>;
using c1 = config<emu::e4m3fn, emu::rne_sat>;
using c2 = config<emu::e5m2, emu::rne>;
using c3 = config<emu::e5m2, emu::rne_sat>;

float float_of(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// [start, next segment's start): the table's result is `code` for every float there.
struct segment {
  std::uint32_t start;
  std::uint32_t code;
};

// The finite floats of one sign, bits [base, base + 0x7F800000), cut where the table's result
// may change. Magnitudes grow with the bits, so each breakpoint is found by bisection with exact
// comparisons; a float equal to a breakpoint gets a segment of its own.
std::vector<segment> segments(const breakpoint_table& t, int s) {
  const std::uint32_t base = s == 0 ? 0u : 0x80000000u, end = base + 0x7F800000u;
  std::vector<segment> out;
  std::uint32_t cur = base;
  for (std::size_t j = 0; j < t.points.size(); ++j) {
    std::uint32_t lo = cur, hi = end; // first bits in [cur, end) with |x| >= points[j]
    while (lo < hi) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
      if (std::fabs(static_cast<double>(float_of(mid))) < t.points[j])
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo > cur)
      out.push_back({cur, t.between[s][j]});
    cur = lo;
    if (cur < end && std::fabs(static_cast<double>(float_of(cur))) == t.points[j])
      out.push_back({cur++, t.at[s][j]});
  }
  if (cur < end)
    out.push_back({cur, t.between[s][t.points.size()]});
  return out;
}

TEST(exhaustive, every_float_into_e4m3fn_and_e5m2) {
  const timer t("every_float_into_e4m3fn_and_e5m2");
  const breakpoint_table tables[4] = {pt::test::make_breakpoint_table(c0::fmt, c0::pol),
                                      pt::test::make_breakpoint_table(c1::fmt, c1::pol),
                                      pt::test::make_breakpoint_table(c2::fmt, c2::pol),
                                      pt::test::make_breakpoint_table(c3::fmt, c3::pol)};
  mismatches bad;
  std::atomic<std::uint64_t> checked{0};
  // Thread s sweeps the floats with sign bit s, one pass computing all four configurations.
  pt::test::on_threads(2, [&](int s) {
    std::vector<segment> seg[4];
    for (int c = 0; c < 4; ++c)
      seg[c] = segments(tables[c], s);
    const std::uint32_t base = s == 0 ? 0u : 0x80000000u, end = base + 0x7F800000u;
    std::size_t k[4] = {0, 0, 0, 0};
    // Re-runs a range [from, from + count) that had a mismatch, recording each one.
    const auto report = [&](std::uint32_t from, std::uint32_t count, const std::uint32_t want[4]) {
      for (std::uint32_t i = 0; i < count; ++i) {
        const float x = float_of(from + i);
        const std::uint32_t got[4] = {c0::encode(x), c1::encode(x), c2::encode(x), c3::encode(x)};
        const breakpoint_table* tb[4] = {&tables[0], &tables[1], &tables[2], &tables[3]};
        for (int c = 0; c < 4; ++c)
          if (got[c] != want[c])
            bad.add(emu::format_name(tb[c]->fmt) + " " + describe(tb[c]->pol) + " " +
                    describe_input(x) + ": emu " + hex_code(got[c]) + ", reference " +
                    hex_code(want[c]));
      }
    };
    std::uint64_t n = 0;
    for (std::uint32_t pos = base; pos < end;) {
      std::uint32_t next = end;
      std::uint32_t want[4];
      for (int c = 0; c < 4; ++c) {
        want[c] = seg[c][k[c]].code;
        if (k[c] + 1 < seg[c].size())
          next = std::min(next, seg[c][k[c] + 1].start);
      }
      bool any = false;
      for (std::uint32_t b = pos; b < next; ++b) {
        const float x = float_of(b);
        any |= (c0::encode(x) != want[0]) | (c1::encode(x) != want[1]) |
               (c2::encode(x) != want[2]) | (c3::encode(x) != want[3]);
      }
      if (any)
        report(pos, next - pos, want);
      n += next - pos;
      pos = next;
      for (int c = 0; c < 4; ++c)
        if (k[c] + 1 < seg[c].size() && seg[c][k[c] + 1].start == pos)
          ++k[c];
    }
    // Inf, then the NaNs of this sign.
    std::uint32_t want_inf[4], want_nan[4];
    for (int c = 0; c < 4; ++c) {
      want_inf[c] = tables[c].infinity[s];
      want_nan[c] = tables[c].nan[s];
    }
    report(end, 1, want_inf);
    constexpr std::uint32_t nan_count = 0x7FFFFFu; // mantissa != 0 under the all-ones exponent
    bool any = false;
    for (std::uint32_t i = 0; i < nan_count; ++i) {
      const float x = float_of(end + 1 + i);
      any |= (c0::encode(x) != want_nan[0]) | (c1::encode(x) != want_nan[1]) |
             (c2::encode(x) != want_nan[2]) | (c3::encode(x) != want_nan[3]);
    }
    if (any)
      report(end + 1, nan_count, want_nan);
    checked += n + 1 + nan_count;
  });
  EXPECT_EQ(checked.load(), std::uint64_t{1} << 32);
  bad.expect_none("every float");
}

} // namespace
