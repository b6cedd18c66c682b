// Value types fp<F, P>: every +, -, *, / of random code pairs is the reference's rounding of the
// exact rational result; sqrt is checked against a 200-bit square root whose side of every
// rounding boundary is confirmed by exact squaring; numeric_limits matches the enumeration.
#include <cmath>
#include <utility>

#include <boost/multiprecision/cpp_bin_float.hpp>
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
using pt::test::describe;
using pt::test::hex_code;
using ref::integer;
using ref::rational;
using wide = boost::multiprecision::number<
    boost::multiprecision::cpp_bin_float<200, boost::multiprecision::digit_base_2>>;

enum class op { add, sub, mul, div };
const char* op_name(op o) {
  switch (o) {
  case op::add: return "+";
  case op::sub: return "-";
  case op::mul: return "*";
  case op::div: return "/";
  }
  return "?";
}

// What fp's operation must return for operand codes ca, cb. Finite operands with a finite exact
// result: the reference's rounding of the exact rational. Specials (NaN, Inf operands, division
// by zero) and the sign of an exact zero follow IEEE 754 arithmetic in double, in which
// docs/rounding.md says fp computes; exact zero sums get their IEEE 754 section 6.3 sign (-0 under
// rounding down). NaN results are compared
// as "some NaN" (the sign of a NaN produced by arithmetic is unspecified).
std::uint32_t expected(const emu::format& f, const emu::policy& p, op o, std::uint32_t ca,
                       std::uint32_t cb, bool& nan_expected) {
  const double a = emu::decode<double>(f, ca), b = emu::decode<double>(f, cb);
  nan_expected = false;
  const auto via_double = [&](double r) {
    nan_expected = std::isnan(r);
    return ref::round(f, r, p);
  };
  if (ref::is_nan(f, ca) || ref::is_nan(f, cb) || ref::is_inf(f, ca) || ref::is_inf(f, cb) ||
      (o == op::div && b == 0)) {
    switch (o) {
    case op::add: return via_double(a + b);
    case op::sub: return via_double(a - b);
    case op::mul: return via_double(a * b);
    case op::div: return via_double(a / b);
    }
  }
  const rational x = ref::value_of(f, ca), y = ref::value_of(f, cb);
  rational r;
  switch (o) {
  case op::add: r = x + y; break;
  case op::sub: r = x - y; break;
  case op::mul: r = x * y; break;
  case op::div: r = x / y; break;
  }
  if (r != 0)
    return ref::round(f, r, r < 0, p);
  // An exact zero: its sign as IEEE 754 gives it. Products and quotients carry the xor of the
  // signs; an exact zero sum is -0 under rounding down (unless both addends are +0), else +0,
  // except that x + x keeps x's sign (section 6.3).
  const double bb = o == op::sub ? -b : b;
  bool negative;
  if (o == op::mul || o == op::div) {
    negative = std::signbit(a) != std::signbit(b);
  } else if (a == 0 && bb == 0 && std::signbit(a) == std::signbit(bb)) {
    negative = std::signbit(a);
  } else {
    negative = p.round == emu::rounding::down;
  }
  return ref::round(f, rational(0), negative, p);
}

// The exact square root's rounding, from a 200-bit root. A root that is not exact lies at least
// ~2^-60 (relative) from every grid point and midpoint of a <= 24-bit format, far beyond the
// 2^-200 error of the wide root; the exact squaring below confirms it case by case.
std::uint32_t expected_sqrt(const emu::format& f, const emu::policy& p, std::uint32_t ca,
                            bool& nan_expected) {
  const double a = emu::decode<double>(f, ca);
  nan_expected = std::isnan(a) || a < 0;
  if (nan_expected || std::isinf(a) || a == 0)
    return ref::round(f, std::sqrt(a), p);
  const rational v = ref::value_of(f, ca);
  wide w(v.convert_to<double>()); // exact: every value of the format is a double
  w = boost::multiprecision::sqrt(w);
  int e = 0;
  const wide m = boost::multiprecision::frexp(w, &e); // w = m 2^e, 0.5 <= m < 1, 200 bits
  const integer n = boost::multiprecision::ldexp(m, 210).convert_to<integer>();
  rational s = rational(n) * (e >= 210 ? rational(integer(1) << (e - 210))
                                       : rational(integer(1), integer(1) << (210 - e)));
  // Confirm the decisive comparisons exactly: the root's bracket and the midpoint between.
  if (s <= ref::grid_above_max(f)) {
    const ref::bracket br = ref::neighbours(f, s);
    if (br.lo == br.hi) {
      if (br.lo * br.lo != v)
        throw std::logic_error("wide root landed on a grid point inexactly");
      s = br.lo;
    } else {
      const rational mid = (br.lo + br.hi) / 2;
      if (!(br.lo * br.lo < v && v < br.hi * br.hi) || (s < mid) != (v < mid * mid) ||
          (s == mid) != (v == mid * mid))
        throw std::logic_error("wide root on the wrong side of a rounding boundary");
    }
  }
  return ref::round(f, s, false, p);
}

// Operand pairs: two random finite codes, a code and a near neighbour (cancellation), or any
// codes including NaN and Inf.
rc::Gen<std::pair<std::uint32_t, std::uint32_t>> operand_pairs(const emu::format& f) {
  const auto pair_of = [](rc::Gen<std::uint32_t> a, rc::Gen<std::uint32_t> b) {
    return rc::gen::apply([](std::uint32_t x, std::uint32_t y) { return std::make_pair(x, y); },
                          std::move(a), std::move(b));
  };
  const rc::Gen<std::pair<std::uint32_t, std::uint32_t>> near = rc::gen::apply(
      [f](std::uint32_t a, int d, bool flip) {
        const std::int64_t mag = static_cast<std::int64_t>(a & f.mag_mask()) + d;
        const auto m = static_cast<std::uint32_t>(std::clamp<std::int64_t>(mag, 0, f.max_code()));
        return std::make_pair(a, ((a & f.sign_mask()) ^ (flip ? f.sign_mask() : 0u)) | m);
      },
      pt::finite_code(f), pt::uniform<int>(-3, 3), pt::coin());
  return rc::gen::weightedOneOf<std::pair<std::uint32_t, std::uint32_t>>({
      {5, pair_of(pt::finite_code(f), pt::finite_code(f))},
      {3, near},
      {1, pair_of(pt::any_code(f), pt::any_code(f))},
  });
}

template <emu::format F, emu::policy P> void check_value_type(int cases) {
  using T = emu::fp<F, P>;
  const std::string id = emu::format_name(F) + " " + describe(P);
  check_property(id + "/arith", cases, [id] {
    const auto [ca, cb] = *operand_pairs(F);
    const T a = T::from_bits(ca), b = T::from_bits(cb);
    const std::pair<op, T> results[] = {
        {op::add, a + b}, {op::sub, a - b}, {op::mul, a * b}, {op::div, a / b}};
    for (const auto& [o, r] : results) {
      bool nan = false;
      // fnuz has one unsigned NaN; formats without NaN return +0 for a NaN result.
      const std::uint32_t want = expected(F, P, o, ca, cb, nan);
      const bool ok =
          nan ? (F.has_nan() ? ref::is_nan(F, r.bits()) : r.bits() == want) : r.bits() == want;
      if (!ok)
        RC_FAIL(id + ": " + hex_code(ca) + " " + op_name(o) + " " + hex_code(cb) + " = " +
                hex_code(r.bits()) + ", reference " + hex_code(want));
    }
    bool nan = false;
    const std::uint32_t want = expected_sqrt(F, P, ca, nan);
    const std::uint32_t got = sqrt(a).bits();
    const bool ok = nan ? (F.has_nan() ? ref::is_nan(F, got) : got == want) : got == want;
    if (!ok)
      RC_FAIL(id + ": sqrt(" + hex_code(ca) + ") = " + hex_code(got) + ", reference " +
              hex_code(want));
  });
}

constexpr emu::policy pol(emu::rounding r, emu::overflow o = emu::overflow::nonsaturating,
                          emu::subnormals s = emu::subnormals::keep) {
  return emu::policy{r, o, s, emu::nan_sign::preserve, 0};
}

template <emu::format F> void check_all_policies(int cases) {
  using emu::rounding;
  check_value_type<F, pol(rounding::nearest_even)>(cases);
  check_value_type<F, pol(rounding::nearest_away)>(cases);
  check_value_type<F, pol(rounding::toward_zero)>(cases);
  check_value_type<F, pol(rounding::up)>(cases);
  check_value_type<F, pol(rounding::down)>(cases);
  check_value_type<F, pol(rounding::odd)>(cases);
  check_value_type<F, pol(rounding::nearest_even, emu::overflow::saturate)>(cases);
  check_value_type<F, pol(rounding::nearest_even, emu::overflow::nonsaturating,
                          emu::subnormals::flush)>(cases);
}

TEST(fp, e4m3fn) {
  check_all_policies<emu::e4m3fn>(300);
}
TEST(fp, e5m2) {
  check_all_policies<emu::e5m2>(300);
}
TEST(fp, e4m3fnuz) {
  check_all_policies<emu::e4m3fnuz>(300);
}
TEST(fp, e2m1fn) {
  check_all_policies<emu::e2m1fn>(200);
}
TEST(fp, e3m2fn) {
  check_all_policies<emu::e3m2fn>(200);
}
TEST(fp, e8m0fnu) {
  check_all_policies<emu::e8m0fnu>(200);
}
TEST(fp, float16) {
  check_all_policies<emu::float16>(400);
}
TEST(fp, bfloat16) {
  check_all_policies<emu::bfloat16>(400);
}

// numeric_limits against the reference's enumeration of the values.
template <emu::format F> void check_limits() {
  using T = emu::fp<F>;
  using L = std::numeric_limits<T>;
  const auto& v = ref::finite_values(F);
  const std::string name = emu::format_name(F);
  const auto value = [](T x) { return ref::value_of(F, x.bits()); };
  EXPECT_EQ(value(L::max()), v.back().first) << name;
  EXPECT_EQ(value(L::lowest()), v.front().first) << name;
  EXPECT_EQ(value(L::min()), ref::min_normal(F)) << name;
  EXPECT_EQ(value(L::denorm_min()), ref::min_positive(F)) << name;
  // epsilon: the distance from 1 to the next value.
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    if (v[i].first == 1) {
      EXPECT_EQ(value(L::epsilon()), v[i + 1].first - 1) << name;
    }
  }
  bool any_inf = false, any_nan = false;
  for (std::uint32_t c = 0; c < (1u << F.bits()); ++c) {
    any_inf |= ref::is_inf(F, c);
    any_nan |= ref::is_nan(F, c);
  }
  EXPECT_EQ(L::has_infinity, any_inf) << name;
  EXPECT_EQ(L::has_quiet_NaN, any_nan) << name;
  if (any_inf) {
    EXPECT_TRUE(ref::is_inf(F, L::infinity().bits())) << name;
    EXPECT_FALSE(ref::sign_of(F, L::infinity().bits())) << name;
  }
  if (any_nan) {
    EXPECT_TRUE(ref::is_nan(F, L::quiet_NaN().bits())) << name;
  }
  EXPECT_EQ(L::is_signed, v.front().first < 0) << name;
  EXPECT_EQ(L::digits, F.man_bits + 1) << name;
}

TEST(fp, numeric_limits) {
  check_limits<emu::e4m3fn>();
  check_limits<emu::e5m2>();
  check_limits<emu::e4m3fnuz>();
  check_limits<emu::e5m2fnuz>();
  check_limits<emu::e8m0fnu>();
  check_limits<emu::e3m2fn>();
  check_limits<emu::e2m3fn>();
  check_limits<emu::e2m1fn>();
  check_limits<emu::float16>();
  check_limits<emu::bfloat16>();
  check_limits<emu::format{4, 4, 7, emu::specials::fn, false}>();
}

} // namespace
