// The one converter: every (source, target format, policy) goes through encode(); every code
// comes back through decode(). Sources are float and double read bit by bit (a float is never
// widened and re-rounded, a double is never narrowed to float first: one rounding, exactly), or a
// code of another format, decoded exactly first. Results are codes in the low bits of a uint32.
//
// The rules implemented here are defined in docs/rounding.md; the reference in reference/ checks
// them by enumeration and exact arithmetic.
#pragma once

#include <cstdint>

#include <lowbit/emu/config.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/policy.hpp>

namespace lowbit::emu {

namespace detail {

template <class T>
struct binary_traits;

template <>
struct binary_traits<float> {
  using bits_type = std::uint32_t;
  static constexpr int width = 32, man = 23, bias = 127;
};

template <>
struct binary_traits<double> {
  using bits_type = std::uint64_t;
  static constexpr int width = 64, man = 52, bias = 1023;
};

// True when rounding r of a value of the given sign moves toward zero, which decides whether a
// finite overflow stops at the largest finite value (IEEE 754 section 7.4).
LOWBIT_HD LOWBIT_INLINE constexpr bool rounds_toward_zero(rounding r, bool negative) {
  // Bitwise operators keep the per-element code free of branches.
  return (r == rounding::toward_zero) | (r == rounding::odd) | ((r == rounding::down) & !negative) |
         ((r == rounding::up) & negative);
}

// Rounds sig * 2^-shift to an integer under policy p, without data-dependent branches (the hot
// loops vectorize). `negative` is the sign of the value (directed modes), rbits the caller's
// random bits (stochastic). Requires 0 <= shift and sig < 2^(width-1); any shift is allowed.
template <class U>
LOWBIT_HD LOWBIT_INLINE constexpr U round_shifted(U sig, int shift, bool negative,
                                                  const policy& p, std::uint32_t rbits) {
  constexpr int width = static_cast<int>(sizeof(U) * 8);
  // Past width-1 every bit of sig is discarded and rem < half either way, so clamp the shift.
  const int sc = shift < width - 1 ? shift : width - 1;
  const U kept = static_cast<U>(sig >> sc);
  const U rem = static_cast<U>(sig & ((U{1} << sc) - 1u));
  const U half = static_cast<U>((U{1} << sc) >> 1);
  const U inexact = rem != 0;
  // Bitwise rather than logical operators: no data-dependent branches.
  const U gt = rem > half, eq = rem == half;
  const U neg = negative;
  switch (p.round) {
    case rounding::nearest_even: return kept + ((gt | (eq & kept)) & inexact & 1u);
    case rounding::nearest_away: return kept + ((gt | eq) & inexact);
    case rounding::toward_zero: return kept;
    case rounding::up: return kept + (inexact & (neg ^ 1u));
    case rounding::down: return kept + (inexact & neg);
    case rounding::odd: return static_cast<U>(kept | inexact);
    case rounding::stochastic: {
      // floor(t * 2^k) + r >= 2^k, with t = rem / 2^shift exactly (docs/rounding.md); rem is the
      // whole discarded part also when the shift was clamped.
      const int k = p.random_bits;
      const int down_shift = shift - k;
      const std::uint64_t tk = down_shift >= 0
                                   ? (down_shift < 64 ? static_cast<std::uint64_t>(rem) >> down_shift : 0u)
                                   : static_cast<std::uint64_t>(rem) << -down_shift;
      const std::uint64_t one = std::uint64_t{1} << k;
      return kept + static_cast<U>(tk + (rbits & (one - 1u)) >= one);
    }
  }
  return kept;
}

LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t sign_code(const format& f, bool negative) {
  return f.is_signed ? static_cast<std::uint32_t>(negative) << (f.exp_bits + f.man_bits) : 0u;
}

}  // namespace detail

// ---- special results, shared by encode and the kernels ---------------------------------------

// The NaN a conversion produces: all magnitude bits set (the canonical NaN of NVIDIA's hardware
// conversions), signed where the format has signed NaNs and the policy keeps the sign; the
// negative-zero code for fnuz; +0 for formats without NaN (documented in docs/rounding.md).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t nan_code(const format& f, bool negative, const policy& p) {
  switch (f.special) {
    case specials::ieee:
    case specials::fn:
      return f.mag_mask() | detail::sign_code(f, negative & (p.nan == nan_sign::preserve));
    case specials::fnuz: return f.sign_mask();
    case specials::none: return 0u;
  }
  return 0u;
}

// Result for a value beyond the finite range: +-max under saturation, for formats without NaN,
// and when the rounding direction points toward zero; otherwise Inf, or NaN where there is no Inf.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t overflow_code(const format& f, bool negative, const policy& p,
                                                bool infinite_input = false) {
  const bool to_max = (p.over == overflow::saturate) | !f.has_nan() |
                      (!infinite_input & detail::rounds_toward_zero(p.round, negative));
  if (to_max) return f.max_code() | detail::sign_code(f, negative);
  if (f.has_inf()) return (f.mag_mask() - f.man_mask()) | detail::sign_code(f, negative);
  return nan_code(f, negative, p);
}

// Result for an exact zero input (and for results that round or flush to zero).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t zero_code(const format& f, bool negative, const policy& p) {
  if (!f.has_zero)  // no zero to return: NaN, or the smallest value under saturation
    return (p.over == overflow::saturate || !f.has_nan()) ? 0u : nan_code(f, false, p);
  return f.has_negative_zero() ? detail::sign_code(f, negative) : 0u;
}

// Result for a negative number (not -0) in an unsigned format: NaN, or the smallest value
// (code 0) under saturation or where there is no NaN.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t negative_unsigned_code(const format& f, const policy& p) {
  return (p.over == overflow::saturate || !f.has_nan()) ? 0u : nan_code(f, false, p);
}

// ---- encode ------------------------------------------------------------------------------------

// Rounds x (float or double) to format f under policy p. rbits: random bits for stochastic
// rounding (the low p.random_bits bits are used). Returns the code in the low f.bits() bits.
template <class T>
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t encode(const format& f, T x, const policy& p,
                                                       std::uint32_t rbits = 0) {
  using tr = detail::binary_traits<T>;
  using U = typename tr::bits_type;
  constexpr U sign_bit = U{1} << (tr::width - 1);
  constexpr U inf_bits = ((U{1} << (tr::width - 1 - tr::man)) - 1u) << tr::man;
  constexpr U man_mask = (U{1} << tr::man) - 1u;
  constexpr int src_emin = 1 - tr::bias;

  const U b = detail::bit_cast<U>(x);
  const bool neg = (b & sign_bit) != 0;
  const U a = b & ~sign_bit;

  // The finite, nonzero path, computed for every input; rare cases patch the result below.
  // |x| = sig * 2^e with 2^E <= |x| < 2^(E+1).
  const int src_field = static_cast<int>(a >> tr::man);
  const U sig = (a & man_mask) | (src_field != 0 ? U{1} << tr::man : U{0});
  const int e = (src_field != 0 ? src_field : 1) - tr::bias - tr::man;
  int big_e = src_field - tr::bias;  // a subnormal source gets src_emin - 1: below it, enough...
  if (f.emin() < src_emin && src_field == 0)  // ...unless the target's normals reach that low
    big_e = e + detail::bit_width(sig) - 1;
  const bool below_normal = big_e < f.emin();
  // Quantum of the target grid around x: 2^(max(E, emin) - man). The source has at least as many
  // mantissa bits as any target, so the shift is never negative.
  const int eff = below_normal ? f.emin() : big_e;
  const U m = detail::round_shifted<U>(sig, eff - f.man_bits - e, neg, p, rbits);
  // m is in [2^man, 2^(man+1)] on the normal grid (a carry moves into the exponent field) and in
  // [0, 2^man] below it, where eff + bias == 1 makes the same formula give the code m.
  const std::uint32_t code = (static_cast<std::uint32_t>(eff + f.bias) << f.man_bits) +
                             static_cast<std::uint32_t>(m) - (1u << f.man_bits);
  const bool overflowed = big_e > f.emax() || (!below_normal && code > f.max_code());

  std::uint32_t r = code | detail::sign_code(f, neg);
  if (f.has_zero && code == 0) r = zero_code(f, neg, p);
  if (below_normal && f.has_zero && p.sub == subnormals::flush) r = zero_code(f, neg, p);
  if (below_normal && !f.has_zero) r = 0u;  // no zero, no subnormals: the smallest value (docs)
  if (overflowed) r = overflow_code(f, neg, p);
  if (a == 0) r = zero_code(f, neg, p);
  if (a == inf_bits) r = overflow_code(f, neg, p, /*infinite_input=*/true);
  if (neg && a != 0 && !f.is_signed) r = negative_unsigned_code(f, p);
  if (a > inf_bits) r = nan_code(f, neg, p);
  return r;
}

// ---- decode ------------------------------------------------------------------------------------

namespace detail {

// 2^k as T, for k in T's normal exponent range.
template <class T>
LOWBIT_HD LOWBIT_INLINE constexpr T pow2(int k) {
  using tr = binary_traits<T>;
  using U = typename tr::bits_type;
  return bit_cast<T>(static_cast<U>(static_cast<U>(k + tr::bias) << tr::man));
}

template <class T>
LOWBIT_HD LOWBIT_INLINE constexpr T quiet_nan(bool negative) {
  using tr = binary_traits<T>;
  using U = typename tr::bits_type;
  const U bits = (((U{1} << (tr::width - tr::man)) - 1u) << (tr::man - 1)) |
                 (negative ? U{1} << (tr::width - 1) : U{0});
  return bit_cast<T>(bits);
}

template <class T>
LOWBIT_HD LOWBIT_INLINE constexpr T infinity(bool negative) {
  using tr = binary_traits<T>;
  using U = typename tr::bits_type;
  const U bits = (((U{1} << (tr::width - 1 - tr::man)) - 1u) << tr::man) |
                 (negative ? U{1} << (tr::width - 1) : U{0});
  return bit_cast<T>(bits);
}

}  // namespace detail

// True when `code` is a NaN of format f.
LOWBIT_HD LOWBIT_INLINE constexpr bool is_nan_code(const format& f, std::uint32_t code) {
  const std::uint32_t mag = code & f.mag_mask();
  switch (f.special) {
    case specials::ieee: return (mag & ~f.man_mask()) == (f.mag_mask() & ~f.man_mask()) &&
                                (mag & f.man_mask()) != 0;
    case specials::fn: return mag == f.mag_mask();
    case specials::fnuz: return (code & (f.sign_mask() | f.mag_mask())) == f.sign_mask();
    case specials::none: return false;
  }
  return false;
}

LOWBIT_HD LOWBIT_INLINE constexpr bool is_inf_code(const format& f, std::uint32_t code) {
  return f.has_inf() && (code & f.mag_mask()) == f.mag_mask() - f.man_mask();
}

// The exact value of `code` as T (float or double). Exact for double always; for float when
// f.fits_float() (a precondition). Bits above f.bits() are ignored.
template <class T = double>
LOWBIT_HD LOWBIT_INLINE constexpr T decode(const format& f, std::uint32_t code) {
  using tr = detail::binary_traits<T>;
  const bool neg = (code & f.sign_mask()) != 0;
  if (is_nan_code(f, code)) return detail::quiet_nan<T>(f.special != specials::fnuz && neg);
  if (is_inf_code(f, code)) return detail::infinity<T>(neg);
  const std::uint32_t mag = code & f.mag_mask();
  const int field = static_cast<int>(mag >> f.man_bits);
  std::uint32_t m = mag & f.man_mask();
  int k;  // value = m * 2^k
  if (f.has_zero && field == 0) {
    k = f.emin() - f.man_bits;
  } else {
    m |= 1u << f.man_bits;
    k = field - f.bias - f.man_bits;
  }
  constexpr int lowest = 1 - tr::bias;  // smallest normal exponent of T
  T v = static_cast<T>(m);              // exact: m < 2^24
  if (k >= lowest) {
    v *= detail::pow2<T>(k);
  } else {  // the result may be a subnormal T: two exact steps
    v *= detail::pow2<T>(k + 64);
    v *= detail::pow2<T>(-64);
  }
  return neg ? -v : v;
}

// Converts a code of format `from` to format `to`: exact decode, then one rounding.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t convert(const format& from, std::uint32_t code,
                                          const format& to, const policy& p,
                                          std::uint32_t rbits = 0) {
  if (from.fits_float()) return encode(to, decode<float>(from, code), p, rbits);
  return encode(to, decode<double>(from, code), p, rbits);
}

// ---- format facts derived from the codes ---------------------------------------------------

LOWBIT_HD LOWBIT_INLINE constexpr double max_value(const format& f) { return decode<double>(f, f.max_code()); }
LOWBIT_HD LOWBIT_INLINE constexpr double min_normal(const format& f) {
  return decode<double>(f, f.min_normal_code());
}
LOWBIT_HD LOWBIT_INLINE constexpr double min_positive(const format& f) {
  return decode<double>(f, f.min_positive_code());
}
// Distance from 1 to the next larger value: 2^-man_bits.
LOWBIT_HD LOWBIT_INLINE constexpr double epsilon(const format& f) { return detail::pow2<double>(-f.man_bits); }

static_assert(max_value(e4m3fn) == 448.0 && max_value(e5m2) == 57344.0);
static_assert(max_value(e4m3fnuz) == 240.0 && max_value(e2m1fn) == 6.0);
static_assert(max_value(e3m2fn) == 28.0 && max_value(e2m3fn) == 7.5);
static_assert(max_value(float16) == 65504.0 && min_positive(e2m1fn) == 0.5);
static_assert(encode(e4m3fn, 448.0f, rne) == 0x7E && encode(e4m3fn, 464.0f, rne) == 0x7E);
static_assert(encode(e4m3fn, 465.0f, rne) == 0x7F && encode(e4m3fn, 465.0f, rne_sat) == 0x7E);
static_assert(encode(e5m2, 1.0, rne) == 0x3C && encode(float16, 1.0f / 3.0f, rne) == 0x3555);

}  // namespace lowbit::emu
