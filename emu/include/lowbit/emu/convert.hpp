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

template <class T> struct binary_traits;

template <> struct binary_traits<float> {
  using bits_type = std::uint32_t;
  static constexpr int width = 32, man = 23, bias = 127;
};

template <> struct binary_traits<double> {
  using bits_type = std::uint64_t;
  static constexpr int width = 64, man = 52, bias = 1023;
};

// 2^k as T, for k in T's normal exponent range.
template <class T> LOWBIT_HD LOWBIT_INLINE constexpr T pow2(int k) {
  using tr = binary_traits<T>;
  using U = typename tr::bits_type;
  return bit_cast<T>(static_cast<U>(static_cast<U>(k + tr::bias) << tr::man));
}

template <class T> LOWBIT_HD LOWBIT_INLINE constexpr T quiet_nan(bool negative) {
  using tr = binary_traits<T>;
  using U = typename tr::bits_type;
  const U bits = (((U{1} << (tr::width - tr::man)) - 1u) << (tr::man - 1)) |
                 (negative ? U{1} << (tr::width - 1) : U{0});
  return bit_cast<T>(bits);
}

template <class T> LOWBIT_HD LOWBIT_INLINE constexpr T infinity(bool negative) {
  using tr = binary_traits<T>;
  using U = typename tr::bits_type;
  const U bits = (((U{1} << (tr::width - 1 - tr::man)) - 1u) << tr::man) |
                 (negative ? U{1} << (tr::width - 1) : U{0});
  return bit_cast<T>(bits);
}

// True when rounding r of a value of the given sign moves toward zero, which decides whether a
// finite overflow stops at the largest finite value (IEEE 754 section 7.4).
LOWBIT_HD LOWBIT_INLINE constexpr bool rounds_toward_zero(rounding r, bool negative) {
  // Bitwise operators keep the per-element code free of branches.
  return (r == rounding::toward_zero) | (r == rounding::odd) | ((r == rounding::down) & !negative) |
         ((r == rounding::up) & negative);
}

// Rounds sig * 2^-shift to an integer under policy p. Written as "add an increment, then shift"
// with bitwise operators only, so it has no data-dependent branches (CPU loops vectorize, GPU
// warps do not diverge) and costs a handful of instructions. `negative` is the sign of the value
// (directed modes), rbits the caller's random bits (stochastic). Requires shift >= 0 and
// sig < 2^(width-2); any shift is allowed.
template <class U>
LOWBIT_HD LOWBIT_INLINE constexpr U round_shifted(U sig, int shift, bool negative, const policy& p,
                                                  std::uint32_t rbits) {
  constexpr int width = static_cast<int>(sizeof(U) * 8);
  // Past width-1 every bit of sig is discarded and it is below half either way: clamp the shift.
  const int sc = shift < width - 1 ? shift : width - 1;
  const U mask = (U{1} << sc) - 1u;
  const U half = (U{1} << sc) >> 1;
  const U neg = negative;
  switch (p.round) {
  case rounding::nearest_even: {
    // rem + half - 1 + lsb carries into bit sc exactly when rem > half, or rem == half and the
    // kept part is odd. With sc == 0 (nothing discarded) the increment must be 0, not lsb - 1.
    const U lsb = (sig >> sc) & 1u;
    const U inc = half + lsb > 0u ? half + lsb - 1u : U{0};
    return (sig + inc) >> sc;
  }
  case rounding::nearest_away: return (sig + half) >> sc;
  case rounding::toward_zero: return sig >> sc;
  case rounding::up: return (sig + (mask & (neg - 1u))) >> sc;
  case rounding::down: return (sig + (mask & (U{0} - neg))) >> sc;
  case rounding::odd: return (sig >> sc) | static_cast<U>((sig & mask) != 0);
  case rounding::stochastic: {
    // floor(t * 2^k) + r >= 2^k with t = rem / 2^shift (docs/rounding.md). For shift >= k this
    // is a carry out of (rem with its low shift-k bits cleared) + (r << (shift-k)); for
    // shift < k it is rem + (r >> (k-shift)) >= 2^shift, the dropped low bits of r never
    // reaching the carry.
    const int k = p.random_bits;
    const U rem = sig & mask;
    const std::uint64_t r = rbits & ((std::uint64_t{1} << k) - 1u);
    const int d = shift - k;
    std::uint64_t carry;
    if (d >= 0) {
      // t*2^k = rem >> d (0 when d passes the width: rem < 2^(width-2) then).
      const std::uint64_t tk = d < 64 ? static_cast<std::uint64_t>(rem) >> d : 0u;
      carry = (tk + r) >> k;
    } else {
      carry = (static_cast<std::uint64_t>(rem) + (r >> -d)) >> shift;
    }
    return (sig >> sc) + static_cast<U>(carry != 0);
  }
  }
  return sig >> sc;
}

LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t sign_code(const format& f, bool negative) {
  return f.is_signed ? static_cast<std::uint32_t>(negative) << (f.exp_bits + f.man_bits) : 0u;
}

} // namespace detail

// ---- special results, shared by encode and the kernels ---------------------------------------

// The NaN a conversion produces: all magnitude bits set (the canonical NaN of NVIDIA's hardware
// conversions), signed where the format has signed NaNs and the policy keeps the sign; the
// negative-zero code for fnuz; +0 for formats without NaN (documented in docs/rounding.md).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t nan_code(const format& f, bool negative,
                                                         const policy& p) {
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
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t
overflow_code(const format& f, bool negative, const policy& p, bool infinite_input = false) {
  const bool to_max = (p.over == overflow::saturate) | !f.has_nan() |
                      (!infinite_input & detail::rounds_toward_zero(p.round, negative));
  if (to_max)
    return f.max_code() | detail::sign_code(f, negative);
  if (f.has_inf())
    return (f.mag_mask() - f.man_mask()) | detail::sign_code(f, negative);
  return nan_code(f, negative, p);
}

// Result for an exact zero input (and for results that round or flush to zero).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t zero_code(const format& f, bool negative,
                                                          const policy& p) {
  if (!f.has_zero) // no zero to return: NaN, or the smallest value under saturation
    return (p.over == overflow::saturate || !f.has_nan()) ? 0u : nan_code(f, false, p);
  return f.has_negative_zero() ? detail::sign_code(f, negative) : 0u;
}

// Result for a negative number (not -0) in an unsigned format: NaN, or the smallest value
// (code 0) under saturation or where there is no NaN.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t negative_unsigned_code(const format& f,
                                                                       const policy& p) {
  return (p.over == overflow::saturate || !f.has_nan()) ? 0u : nan_code(f, false, p);
}

// ---- encode ------------------------------------------------------------------------------------

namespace detail {

// Formats for which float -> format under nearest-even takes the short path below: at least one
// mantissa bit (with none, every significand is odd and ties go away from zero, which the float
// bit trick would not do), a normal binade range inside float's, subnormals no finer than
// 2^-125 (so float subnormal inputs, and any flush-to-zero of them by a CPU's DAZ mode, round to
// zero either way), and a subnormal quantum whose magic number 2^(emin - man + 23) is a finite
// float (a format of very low bias, such as an MX element format with its block's bias shift of
// 105 or more, would overflow it to Inf and round its subnormal range wrong).
LOWBIT_HD LOWBIT_INLINE constexpr bool rne_short_path(const format& f) {
  return f.man_bits >= 1 && f.man_bits < 23 && f.emax() <= 127 && f.emin() >= -126 && f.has_zero &&
         f.emin() - f.man_bits >= -125 && f.emin() - f.man_bits + 23 <= 127;
}

// The result of a special case as (code for +, sign bits to add for -): every special result is
// its positive code plus, for a negative input, the sign bit or nothing. Depends on the format and
// the policy only, so kernels compute it once, outside their loops.
struct signed_result {
  std::uint32_t base;
  std::uint32_t sign;
  template <class Fn> LOWBIT_HD LOWBIT_INLINE static constexpr signed_result of(Fn code) {
    const std::uint32_t pos = code(false);
    return {pos, code(true) ^ pos};
  }
};

// Formats whose every special result is a magnitude plus the input's sign (signed, with a
// negative zero: the IEEE-like, fn and no-special formats), except NaNs that the policy makes
// positive. For them nearest-even needs no per-element branch on the policy at all: the
// constants below depend on (format, policy) only, so kernels hoist them out of their loops
// (quantization kernels also adjust nan_keep per group, see quantize_ops.hpp).
LOWBIT_HD LOWBIT_INLINE constexpr bool rne_symmetric(const format& f) {
  return rne_short_path(f) && f.is_signed && f.has_negative_zero();
}

// |x| bits of f's smallest normal binade.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t rne_min_normal_bits(const format& f) {
  return static_cast<std::uint32_t>(f.emin() + 127) << 23;
}

// The nearest-even code of |x| (float bits a) on f's grid, before special cases: on the normal
// grid the float's own bits rounded at the target's last mantissa place (the carry runs into the
// exponent by itself) and re-biased; below it, one float addition of 2^(emin - man + 23) lines the
// target's subnormal quantum up with float's last place, and the FPU's nearest-even rounding does
// the rest. Flushing subnormals (tininess before rounding) makes every a below the normal range
// 0. Above max (Inf and NaN included) the code exceeds max_code(). (A one-addition form for both
// ranges, with the binade's own magic number, ran 10 % slower on an H200:
// docs/techniques/quantization.md.)
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t rne_grid_code(const format& f, std::uint32_t a,
                                                              bool flush) {
  const int s = 23 - f.man_bits;
  const std::uint32_t normal = ((a + ((1u << (s - 1)) - 1u) + ((a >> s) & 1u)) >> s) -
                               (static_cast<std::uint32_t>(127 - f.bias) << f.man_bits);
  const float magic = pow2<float>(f.emin() - f.man_bits + 23);
  const std::uint32_t sub =
      flush ? 0u
            : bit_cast<std::uint32_t>(bit_cast<float>(a) + magic) - bit_cast<std::uint32_t>(magic);
  return a < rne_min_normal_bits(f) ? sub : normal;
}

struct rne_encoder {
  bool flush;                  // subnormals flush to zero
  std::uint32_t over;          // overflow magnitude: max, or max + 1 (Inf, or fn's NaN)
  std::uint32_t special_above; // |x| bits above which the result is `nan`: NaN inputs, and
                               // overflows too where they give a NaN the policy makes positive
  std::uint32_t nan;           // magnitude of the NaN result (0 where the format has no NaN)
  std::uint32_t nan_keep;      // sign bit kept on it: the format's sign mask, or 0

  LOWBIT_HD LOWBIT_INLINE static constexpr rne_encoder make(const format& f, const policy& p) {
    const int s = 23 - f.man_bits;
    const std::uint32_t over = overflow_code(f, false, p);
    const bool over_signed = overflow_code(f, true, p) != over;
    // Smallest |x| bits rounding past max: the midpoint above max, or one above it where
    // nearest-even keeps the tie at an even max.
    const std::uint32_t max_bits =
        (f.max_code() + (static_cast<std::uint32_t>(127 - f.bias) << f.man_bits)) << s;
    std::uint32_t first_over = max_bits + (1u << (s - 1)) + ((f.max_code() & 1u) ^ 1u);
    if (first_over > 0x7F800000u)
      first_over = 0x7F800000u; // Inf overflows in any format
    const std::uint32_t nan = nan_code(f, false, p);
    return {p.sub == subnormals::flush, over, over_signed ? 0x7F800000u : first_over - 1u, nan,
            nan_code(f, true, p) ^ nan};
  }

  // a: |x| as float bits (any NaN > 0x7F800000); sign: x's sign in bit 31, other bits ignored.
  LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t operator()(const format& f, std::uint32_t a,
                                                             std::uint32_t sign) const {
    std::uint32_t mag = rne_grid_code(f, a, flush);
    mag = mag < over ? mag : over; // Inf included
    const bool special = a > special_above;
    const std::uint32_t keep = special ? nan_keep : f.sign_mask();
    mag = special ? nan : mag;
    return mag | ((sign >> (31 - (f.exp_bits + f.man_bits))) & keep);
  }
};

// float -> f, nearest-even, in about a dozen operations: the grid code of rne_grid_code (one
// float addition rounds, integer additions re-bias), overflow (Inf included) a min with the
// overflow code, NaN a select, the sign one mask. Formats without negative zero or without sign
// take the general form below.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t encode_rne_float(const format& f, float x,
                                                                 const policy& p) {
  const auto b = bit_cast<std::uint32_t>(x);
  const std::uint32_t a = b & 0x7FFFFFFFu;
  if (rne_symmetric(f))
    return rne_encoder::make(f, p)(f, a, b);
  const bool below_normal = a < rne_min_normal_bits(f);
  const std::uint32_t code = rne_grid_code(f, a, p.sub == subnormals::flush);
  std::uint32_t base = code;
  std::uint32_t sign = f.is_signed ? f.sign_mask() : 0u;
  if (!f.has_negative_zero() && code == 0)
    sign = 0u;
  if (!below_normal && code > f.max_code()) { // Inf included
    const auto r = signed_result::of([&](bool n) { return overflow_code(f, n, p); });
    base = r.base;
    sign = r.sign;
  }
  if (!f.is_signed && (b >> 31) != 0 && a != 0) {
    base = negative_unsigned_code(f, p);
    sign = 0u;
  }
  if (a > 0x7F800000u) {
    const auto r = signed_result::of([&](bool n) { return nan_code(f, n, p); });
    base = r.base;
    sign = r.sign;
  }
  // The input's sign bit moved onto the format's sign position, kept where `sign` allows.
  const std::uint32_t sbit = f.is_signed ? (b >> 31) << (f.exp_bits + f.man_bits) : 0u;
  return base | (sbit & sign);
}

// Formats that are float with fewer mantissa bits (bfloat16, TensorFloat-32): the same exponent
// field, so rounding float's bits at the target's last place is the whole conversion, subnormals
// and the overflow to Inf included (the carry runs into the exponent, then into all ones).
LOWBIT_HD LOWBIT_INLINE constexpr bool float_prefix(const format& f) {
  return f.exp_bits == 8 && f.bias == 127 && f.special == specials::ieee && f.is_signed &&
         f.has_zero && f.man_bits >= 1 && f.man_bits < 23;
}

LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t encode_rne_float_prefix(const format& f, float x,
                                                                        const policy& p) {
  const auto b = bit_cast<std::uint32_t>(x);
  const bool neg = (b >> 31) != 0;
  const std::uint32_t a = b & 0x7FFFFFFFu;
  const int s = 23 - f.man_bits;
  const std::uint32_t code = (a + ((1u << (s - 1)) - 1u) + ((a >> s) & 1u)) >> s;
  std::uint32_t r = code | sign_code(f, neg);
  if (a < 0x00800000u && p.sub == subnormals::flush)
    r = zero_code(f, neg, p);
  if (code > f.max_code())
    r = overflow_code(f, neg, p); // Inf included
  if (a > 0x7F800000u)
    r = nan_code(f, neg, p);
  return r;
}

} // namespace detail

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

  if constexpr (sizeof(T) == 4) {
    if (p.round == rounding::nearest_even && detail::rne_short_path(f))
      return detail::encode_rne_float(f, x, p);
    if (p.round == rounding::nearest_even && detail::float_prefix(f))
      return detail::encode_rne_float_prefix(f, x, p);
  }
  const U b = detail::bit_cast<U>(x);
  const bool neg = (b & sign_bit) != 0;
  const U a = b & ~sign_bit;

  // The finite, nonzero path, computed for every input; rare cases patch the result below.
  // |x| = sig * 2^(fld - bias - man) in source terms: fld is the exponent field (1 for
  // subnormals, which have no implicit bit).
  const int src_field = static_cast<int>(a >> tr::man);
  U sig = (a & man_mask) | (src_field != 0 ? U{1} << tr::man : U{0});
  int fld = src_field != 0 ? src_field : 1;
  // The target's smallest normal binade, as a source exponent field.
  const int emin_field = f.emin() + tr::bias;
  if (emin_field < 1 && src_field == 0 && sig != 0) {
    // Only formats whose normals reach below the source's (never the named ones): normalize.
    const int lz = tr::man + 1 - detail::bit_width(sig);
    sig <<= lz;
    fld = 1 - lz;
  }
  // Quantum of the target grid at x: the target's normal quantum, or its subnormal quantum below
  // the smallest normal binade. The source has at least as many mantissa bits as any target, so
  // the shift is never negative.
  // A subnormal source is below the target's normals also when they start at the source's own
  // smallest normal binade (fld == emin_field == 1): only tininess differs, not the quantum.
  const bool below_normal = fld < emin_field || (src_field == 0 && emin_field >= 1);
  const int eff = below_normal ? emin_field : fld;
  const U kept = detail::round_shifted<U>(sig, eff - fld + tr::man - f.man_bits, neg, p, rbits);
  // kept counts target quanta: [2^man, 2^(man+1)] on a normal binade (a carry moves into the
  // exponent field by itself), [0, 2^man] below it. Formats without zero have no field-0 offset.
  const U code = (static_cast<U>(eff - emin_field) << f.man_bits) + kept -
                 (f.has_zero ? U{0} : U{1} << f.man_bits);

  std::uint32_t r = static_cast<std::uint32_t>(code) | detail::sign_code(f, neg);
  if (!f.has_negative_zero() && f.has_zero && code == 0)
    r = 0u;
  if (below_normal && f.has_zero && p.sub == subnormals::flush)
    r = zero_code(f, neg, p);
  if (code > f.max_code())
    r = overflow_code(f, neg, p);
  // No zero, no subnormals: the smallest value (docs); `code` wrapped around below 0 here.
  if (below_normal && !f.has_zero)
    r = 0u;
  if (a == 0)
    r = zero_code(f, neg, p);
  if (a == inf_bits)
    r = overflow_code(f, neg, p, /*infinite_input=*/true);
  if (neg && a != 0 && !f.is_signed)
    r = negative_unsigned_code(f, p);
  if (a > inf_bits)
    r = nan_code(f, neg, p);
  return r;
}

// ---- decode ------------------------------------------------------------------------------------

// True when `code` is a NaN of format f.
LOWBIT_HD LOWBIT_INLINE constexpr bool is_nan_code(const format& f, std::uint32_t code) {
  const std::uint32_t mag = code & f.mag_mask();
  switch (f.special) {
  case specials::ieee:
    return (mag & ~f.man_mask()) == (f.mag_mask() & ~f.man_mask()) && (mag & f.man_mask()) != 0;
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
namespace detail {

// decode<float> without branches for formats whose values are normal floats or whose subnormal
// quantum is a normal float: a normal code is the float's bits with the exponent re-biased, a
// subnormal code an exact integer times 2^(emin - man).
LOWBIT_HD LOWBIT_INLINE constexpr bool float_decode_short_path(const format& f) {
  return f.fits_float() && f.emin() >= -126 && f.emin() - f.man_bits >= -126;
}

LOWBIT_HD LOWBIT_INLINE constexpr float decode_float_short(const format& f, std::uint32_t code) {
  const std::uint32_t mag = code & f.mag_mask();
  const std::uint32_t sign = (code & f.sign_mask()) != 0 ? 0x80000000u : 0u;
  const std::uint32_t normal =
      (mag << (23 - f.man_bits)) + (static_cast<std::uint32_t>(127 - f.bias) << 23);
  const float sub = static_cast<float>(mag) * pow2<float>(f.emin() - f.man_bits);
  const bool is_sub = f.has_zero && (mag >> f.man_bits) == 0;
  std::uint32_t v = (is_sub ? bit_cast<std::uint32_t>(sub) : normal) | sign;
  if (is_inf_code(f, code))
    v = 0x7F800000u | sign;
  if (is_nan_code(f, code))
    v = 0x7FC00000u | (f.special == specials::fnuz ? 0u : sign);
  return bit_cast<float>(v);
}

} // namespace detail

template <class T = double>
LOWBIT_HD LOWBIT_INLINE constexpr T decode(const format& f, std::uint32_t code) {
  using tr = detail::binary_traits<T>;
  if constexpr (sizeof(T) == 4) {
    if (detail::float_decode_short_path(f))
      return detail::decode_float_short(f, code);
  }
  const bool neg = (code & f.sign_mask()) != 0;
  if (is_nan_code(f, code))
    return detail::quiet_nan<T>(f.special != specials::fnuz && neg);
  if (is_inf_code(f, code))
    return detail::infinity<T>(neg);
  const std::uint32_t mag = code & f.mag_mask();
  const int field = static_cast<int>(mag >> f.man_bits);
  std::uint32_t m = mag & f.man_mask();
  int k; // value = m * 2^k
  if (f.has_zero && field == 0) {
    k = f.emin() - f.man_bits;
  } else {
    m |= 1u << f.man_bits;
    k = field - f.bias - f.man_bits;
  }
  constexpr int lowest = 1 - tr::bias; // smallest normal exponent of T
  T v = static_cast<T>(m);             // exact: m < 2^24
  if (k >= lowest) {
    v *= detail::pow2<T>(k);
  } else { // the result may be a subnormal T: two exact steps
    v *= detail::pow2<T>(k + 64);
    v *= detail::pow2<T>(-64);
  }
  return neg ? -v : v;
}

// Converts a code of format `from` to format `to`: exact decode, then one rounding.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t convert(const format& from, std::uint32_t code,
                                                        const format& to, const policy& p,
                                                        std::uint32_t rbits = 0) {
  if (from.fits_float())
    return encode(to, decode<float>(from, code), p, rbits);
  return encode(to, decode<double>(from, code), p, rbits);
}

// ---- format facts derived from the codes ---------------------------------------------------

LOWBIT_HD LOWBIT_INLINE constexpr double max_value(const format& f) {
  return decode<double>(f, f.max_code());
}
LOWBIT_HD LOWBIT_INLINE constexpr double min_normal(const format& f) {
  return decode<double>(f, f.min_normal_code());
}
LOWBIT_HD LOWBIT_INLINE constexpr double min_positive(const format& f) {
  return decode<double>(f, f.min_positive_code());
}
// Distance from 1 to the next larger value: 2^-man_bits.
LOWBIT_HD LOWBIT_INLINE constexpr double epsilon(const format& f) {
  return detail::pow2<double>(-f.man_bits);
}

static_assert(max_value(e4m3fn) == 448.0 && max_value(e5m2) == 57344.0);
static_assert(max_value(e4m3fnuz) == 240.0 && max_value(e2m1fn) == 6.0);
static_assert(max_value(e3m2fn) == 28.0 && max_value(e2m3fn) == 7.5);
static_assert(max_value(float16) == 65504.0 && min_positive(e2m1fn) == 0.5);
static_assert(encode(e4m3fn, 448.0f, rne) == 0x7E && encode(e4m3fn, 464.0f, rne) == 0x7E);
static_assert(encode(e4m3fn, 465.0f, rne) == 0x7F && encode(e4m3fn, 465.0f, rne_sat) == 0x7E);
static_assert(encode(e5m2, 1.0, rne) == 0x3C && encode(float16, 1.0f / 3.0f, rne) == 0x3555);

} // namespace lowbit::emu
