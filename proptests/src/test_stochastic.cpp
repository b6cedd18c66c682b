// Stochastic rounding: the exact counting law (for small k every one of the 2^k random-bit values
// is tried) and, with Philox random bits, frequencies and means within binomial bounds.
#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/proptest/generators.hpp>
#include <lowbit/reference/round.hpp>

#include "support.hpp"

namespace {

namespace ref = lowbit::reference;
namespace emu = lowbit::emu;
namespace pt = lowbit::proptest;
using pt::test::check_property;
using pt::test::describe_input;
using pt::test::hex_code;
using ref::integer;
using ref::rational;

// floor(t * 2^k) for t = (a - lo) / (hi - lo), exactly.
integer floor_t_2k(const emu::format& f, const rational& a, int k) {
  const ref::bracket b = ref::neighbours(f, a);
  if (b.lo == b.hi)
    return 0;
  const rational scaled = (a - b.lo) / (b.hi - b.lo) * rational(integer(1) << k);
  return boost::multiprecision::numerator(scaled) / boost::multiprecision::denominator(scaled);
}

// For k <= 10, all 2^k values of r: only the two neighbours appear, hi exactly floor(t 2^k) times
// (the definition read as a count), and bits above the low k make no difference.
TEST(stochastic, exact_count_over_all_random_bits) {
  for (const auto& nf : pt::test::all_formats()) {
    const emu::format f = nf.fmt;
    check_property(nf.name + "/stochastic_count", 60, [f, nf] {
      const double x = *pt::edge_values<double>(f);
      RC_PRE(std::isfinite(x) && x != 0 && (f.is_signed || x > 0));
      const rational a = ref::exact(std::fabs(x));
      // Only where the magnitude lies between two grid points (lo may be 0): not below the
      // smallest value of a format without zero, not beyond max + ulp.
      RC_PRE((f.has_zero || a >= ref::min_positive(f)) && a <= ref::grid_above_max(f));
      const int k = *pt::uniform<int>(1, 10);
      const std::uint32_t high = *pt::uniform<std::uint32_t>(0, 0xFFFFFFFFu) << k;
      const emu::policy p = emu::stochastic(
          k, *rc::gen::element(emu::overflow::saturate, emu::overflow::nonsaturating));
      // The codes of the two neighbours: r = 0 never rounds up, r = 2^k - 1 rounds up unless t = 0.
      const std::uint32_t down = ref::round(f, x, p, 0);
      const std::uint32_t up = ref::round(f, x, p, (1u << k) - 1);
      std::set<std::uint32_t> seen;
      integer ups = 0;
      for (std::uint32_t r = 0; r < (1u << k); ++r) {
        const std::uint32_t c = emu::encode(f, x, p, r);
        RC_ASSERT(emu::encode(f, x, p, r | high) == c);
        seen.insert(c);
        if (c == up && up != down)
          ++ups;
      }
      const std::string where = nf.name + " k=" + std::to_string(k) + " " + describe_input(x);
      bool only_neighbours = true;
      for (std::uint32_t c : seen)
        only_neighbours &= c == down || c == up;
      if (!only_neighbours)
        RC_FAIL(where + ": a code other than the neighbours " + hex_code(down) + ", " +
                hex_code(up));
      if (up != down) {
        const integer expected = floor_t_2k(f, a, k);
        if (ups != expected)
          RC_FAIL(where + ": hi chosen " + ups.str() + " times, floor(t 2^k) = " + expected.str());
      }
    });
  }
}

struct case_t {
  emu::format f;
  double x;
  int k;
};

// Frequencies with Philox bits. With p = floor(t 2^k) / 2^k exactly the probability of hi for
// uniform r, the count of hi over N independent draws is Binomial(N, p): we require
// |count - N p| <= 6 sqrt(N p (1 - p)) + 1. A 6-sigma band fails by chance with probability
// below 1e-8 per check (normal tail; the +1 absorbs the lattice of a degenerate p), and the
// seeds are fixed, so the test is deterministic; a bias of one part in 2^k would still show.
TEST(stochastic, frequency_and_mean_within_binomial_bounds) {
  const case_t cases[] = {
      {emu::e4m3fn, 1.3, 8},   {emu::e4m3fn, 1.3, 32},   {emu::e4m3fn, -0.0123, 16},
      {emu::e5m2, 3.1e-5, 3},  {emu::e5m2, 50000.0, 12}, {emu::e2m1fn, 1.25, 1},
      {emu::e2m1fn, 5.9, 5},   {emu::bfloat16, 0.1, 20}, {emu::float16, 1e-7, 32},
      {emu::e8m0fnu, 3.0, 24}, {emu::e3m2fn, 0.3, 2},    {emu::e2m3fn, -0.17, 7},
  };
  constexpr std::uint64_t n = 1 << 18;
  std::uint64_t seed = 0x5eed;
  for (const case_t& c : cases) {
    const emu::policy p = emu::stochastic(c.k, emu::overflow::saturate);
    const rational a = ref::exact(std::fabs(c.x));
    const ref::bracket b = ref::neighbours(c.f, a);
    ASSERT_NE(b.lo, b.hi) << "pick x off the grid";
    const double pr = static_cast<double>(floor_t_2k(c.f, a, c.k)) / std::ldexp(1.0, c.k);
    const double lo = b.lo.convert_to<double>(), hi = b.hi.convert_to<double>();
    const emu::random_stream rng{++seed, 7};
    std::uint64_t ups = 0;
    double sum = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint32_t code = emu::encode(c.f, c.x, p, rng.bits(i));
      const double v = std::fabs(emu::decode<double>(c.f, code));
      ASSERT_TRUE(v == lo || v == hi) << "x " << c.x << " gave " << v;
      ups += v == hi;
      sum += v;
    }
    const double np = n * pr, sd = std::sqrt(n * pr * (1 - pr));
    EXPECT_LE(std::fabs(static_cast<double>(ups) - np), 6 * sd + 1)
        << emu::format_name(c.f) << " x=" << c.x << " k=" << c.k << " p=" << pr;
    // Mean of the magnitudes: lo + (hi - lo) * ups / n, so its bound is the count's bound scaled
    // by (hi - lo) / n. Against |x| it is also off by the truncation of t to k bits: t - p lies
    // in [0, 2^-k), a bias of at most (hi - lo) 2^-k toward zero.
    const double mean = sum / n, step = hi - lo;
    const double bound = (6 * sd + 1) * step / n;
    EXPECT_LE(std::fabs(mean - (lo + pr * step)), bound + 1e-12 * hi) << emu::format_name(c.f);
    EXPECT_LE(std::fabs(mean - std::fabs(c.x)), bound + step * std::ldexp(1.0, -c.k) + 1e-12 * hi)
        << emu::format_name(c.f) << " x=" << c.x << " k=" << c.k;
  }
}

} // namespace
