// Value types: fp<F, P> holds one code of format F and behaves like a number whose every result
// is rounded to F under policy P. Arithmetic is exact-then-rounded-once for +, -, *, / and sqrt:
// the double result is corrected to round-to-odd with an error-free transformation, and rounding
// a round-to-odd value with at least two extra bits equals rounding the exact value, for every
// deterministic rounding mode (F has at most 24 significand bits; double has 53).
#pragma once

#include <cmath>
#include <compare>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <lowbit/emu/config.hpp>
#include <lowbit/emu/convert.hpp>

namespace lowbit::emu {

namespace detail {

LOWBIT_HD inline double fused_multiply_add(double a, double b, double c) {
#if LOWBIT_ON_DEVICE
  return ::fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// s + tail is the exact result (tail's sign is all that matters); returns s rounded to odd.
LOWBIT_HD inline double to_odd(double s, double tail) {
  auto bits = bit_cast<std::uint64_t>(s);
  if (tail == 0.0 || (bits & 1u) != 0 || s != s || s - s != 0.0)
    return s;
  // Move one ulp toward the exact value; s != 0 here (an exact-zero s has no tail).
  const bool away = (tail > 0.0) == (s > 0.0);
  bits = away ? bits + 1u : bits - 1u;
  return bit_cast<double>(bits);
}

// `down`: the result will be rounded toward -Inf, under which IEEE 754 (section 6.3) gives an
// exact zero sum the sign -0 unless both operands are +0; double arithmetic here rounds to
// nearest, which gives +0.
LOWBIT_HD inline double odd_add(double a, double b, bool down) {
  const double s = a + b; // TwoSum (Knuth): s + t == a + b exactly
  if (s == 0.0) {
    const bool both_plus_zero = bit_cast<std::uint64_t>(a) == 0 && bit_cast<std::uint64_t>(b) == 0;
    return down && !both_plus_zero ? -0.0 : s;
  }
  const double bb = s - a;
  const double t = (a - (s - bb)) + (b - bb);
  return to_odd(s, t);
}
LOWBIT_HD inline double odd_mul(double a, double b) {
  const double s = a * b;
  return to_odd(s, fused_multiply_add(a, b, -s));
}
LOWBIT_HD inline double odd_div(double a, double b) {
  const double q = a / b;
  const double r = fused_multiply_add(-q, b, a); // a - q*b, exact
  return to_odd(q, (b > 0.0) ? r : -r);
}
LOWBIT_HD inline double odd_sqrt(double a) {
#if LOWBIT_ON_DEVICE
  const double s = ::sqrt(a);
#else
  const double s = std::sqrt(a);
#endif
  return to_odd(s, fused_multiply_add(-s, s, a));
}

} // namespace detail

template <format F, policy P = rne> class fp {
  static_assert(is_valid(F), "invalid format");
  static_assert(P.round != rounding::stochastic,
                "value types round deterministically; use encode() with random bits");

public:
  using storage_type = detail::code_storage<F.bits()>;
  static constexpr format fmt = F;
  static constexpr policy pol = P;

  constexpr fp() = default;
  LOWBIT_HD constexpr explicit fp(float x) : bits_(static_cast<storage_type>(encode(F, x, P))) {}
  LOWBIT_HD constexpr explicit fp(double x) : bits_(static_cast<storage_type>(encode(F, x, P))) {}
  LOWBIT_HD constexpr explicit fp(int x) : fp(static_cast<double>(x)) {}
  template <format G, policy Q>
  LOWBIT_HD constexpr explicit fp(fp<G, Q> other)
      : bits_(static_cast<storage_type>(convert(G, other.bits(), F, P))) {}

  LOWBIT_HD static constexpr fp from_bits(std::uint32_t code) {
    fp r;
    r.bits_ = static_cast<storage_type>(code);
    return r;
  }
  LOWBIT_HD constexpr storage_type bits() const { return bits_; }

  LOWBIT_HD constexpr explicit operator double() const { return decode<double>(F, bits_); }
  LOWBIT_HD constexpr explicit operator float() const {
    static_assert(F.fits_float(), "this format does not fit in float; convert to double");
    return decode<float>(F, bits_);
  }

  LOWBIT_HD constexpr bool is_nan() const { return is_nan_code(F, bits_); }
  LOWBIT_HD constexpr bool is_inf() const { return is_inf_code(F, bits_); }

  LOWBIT_HD friend fp operator+(fp a, fp b) {
    return fp(detail::odd_add(a.d(), b.d(), P.round == rounding::down));
  }
  LOWBIT_HD friend fp operator-(fp a, fp b) {
    return fp(detail::odd_add(a.d(), -b.d(), P.round == rounding::down));
  }
  LOWBIT_HD friend fp operator*(fp a, fp b) { return fp(detail::odd_mul(a.d(), b.d())); }
  LOWBIT_HD friend fp operator/(fp a, fp b) { return fp(detail::odd_div(a.d(), b.d())); }
  LOWBIT_HD friend fp sqrt(fp a) { return fp(detail::odd_sqrt(a.d())); }
  LOWBIT_HD friend fp abs(fp a) { return fp(a.d() < 0 ? -a.d() : a.d()); }
  LOWBIT_HD constexpr fp operator-() const { return fp(-d()); }
  LOWBIT_HD constexpr fp operator+() const { return *this; }
  LOWBIT_HD fp& operator+=(fp o) { return *this = *this + o; }
  LOWBIT_HD fp& operator-=(fp o) { return *this = *this - o; }
  LOWBIT_HD fp& operator*=(fp o) { return *this = *this * o; }
  LOWBIT_HD fp& operator/=(fp o) { return *this = *this / o; }

  // Numeric comparison: NaN is unordered, +0 == -0.
  LOWBIT_HD friend constexpr bool operator==(fp a, fp b) { return a.d() == b.d(); }
  LOWBIT_HD friend constexpr std::partial_ordering operator<=>(fp a, fp b) {
    return a.d() <=> b.d();
  }

private:
  LOWBIT_HD constexpr double d() const { return decode<double>(F, bits_); }
  storage_type bits_ = 0;
};

// Convenience aliases for the named formats, rounding to nearest-even without saturation.
using float8_e4m3fn = fp<e4m3fn>;
using float8_e5m2 = fp<e5m2>;
using float8_e4m3fnuz = fp<e4m3fnuz>;
using float8_e5m2fnuz = fp<e5m2fnuz>;
using float8_e8m0fnu = fp<e8m0fnu>;
using float6_e3m2fn = fp<e3m2fn>;
using float6_e2m3fn = fp<e2m3fn>;
using float4_e2m1fn = fp<e2m1fn>;
using half = fp<float16>;
using bfloat16_t = fp<bfloat16>;

} // namespace lowbit::emu

template <lowbit::emu::format F, lowbit::emu::policy P>
class std::numeric_limits<lowbit::emu::fp<F, P>> {
  using T = lowbit::emu::fp<F, P>;

public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = F.is_signed;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = F.has_inf();
  static constexpr bool has_quiet_NaN = F.has_nan();
  static constexpr bool has_signaling_NaN = false;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style =
      P.round == lowbit::emu::rounding::nearest_even  ? std::round_to_nearest
      : P.round == lowbit::emu::rounding::toward_zero ? std::round_toward_zero
      : P.round == lowbit::emu::rounding::up          ? std::round_toward_infinity
      : P.round == lowbit::emu::rounding::down        ? std::round_toward_neg_infinity
                                                      : std::round_indeterminate;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = F.man_bits + 1;
  static constexpr int digits10 = (F.man_bits * 30103) / 100000; // floor((digits-1)*log10 2)
  static constexpr int max_digits10 = 2 + ((F.man_bits + 1) * 30103 + 99999) / 100000;
  static constexpr int radix = 2;
  static constexpr int min_exponent = F.emin() + 1;
  static constexpr int max_exponent = F.emax() + 1;
  static constexpr int min_exponent10 = (F.emin() * 30103) / 100000;
  static constexpr int max_exponent10 = (F.emax() * 30103) / 100000;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = true;

  static constexpr T min() noexcept { return T::from_bits(F.min_normal_code()); }
  static constexpr T max() noexcept { return T::from_bits(F.max_code()); }
  static constexpr T lowest() noexcept {
    return T::from_bits(F.is_signed ? (F.max_code() | F.sign_mask()) : 0u);
  }
  static constexpr T epsilon() noexcept { return T(lowbit::emu::epsilon(F)); }
  static constexpr T round_error() noexcept { return T(0.5); }
  static constexpr T infinity() noexcept {
    return T::from_bits(F.has_inf() ? F.mag_mask() - F.man_mask() : 0u);
  }
  static constexpr T quiet_NaN() noexcept {
    return T::from_bits(lowbit::emu::nan_code(F, false, lowbit::emu::rne));
  }
  static constexpr T signaling_NaN() noexcept { return quiet_NaN(); }
  static constexpr T denorm_min() noexcept { return T::from_bits(F.min_positive_code()); }
};
