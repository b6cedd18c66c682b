// Per-element and per-group quantization code shared by the CPU twin and the CUDA kernels. Every
// result bit comes from here; the two drivers only decide which elements form a group.
#pragma once

#include <cstdint>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/kernels/quantize.hpp>

#include "../common/dispatch.hpp"
#include "../common/element_ops.hpp"

namespace lowbit::kernels::quant_ops {

using emu::detail::bit_cast;

// |x| as float bits. The maximum of these over a group is its amax with NaN propagating:
// NaN bits > Inf bits > every finite value. Max is exact and order-free, so every reduction tree
// (threads, warps, atomics) gives the same bits.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t abs_bits(float x) {
  return bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
}

// floor(log2(amax)) for finite amax > 0.
LOWBIT_HD LOWBIT_INLINE constexpr int floor_log2(std::uint32_t amax_bits) {
  const int field = static_cast<int>(amax_bits >> 23);
  if (field != 0)
    return field - 127;
  return emu::detail::bit_width(amax_bits) - 1 - 149;
}

struct group_scale {
  float q; // quantization multiplier
  float d; // dequantization factor, stored per group
};

LOWBIT_HD LOWBIT_INLINE constexpr float pow2f(int k) { // 2^k, k in [-126, 127]
  return bit_cast<float>(static_cast<std::uint32_t>(k + 127) << 23);
}

// The 24-bit significand of a finite positive float, leading one at bit 23 (subnormals
// normalized), so that two floats' significands compare like their values at equal exponents.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t significand(std::uint32_t bits) {
  if (bits >= 0x00800000u)
    return (bits & 0x007FFFFFu) | 0x00800000u;
  return bits << (24 - emu::detail::bit_width(bits));
}

// The scale rule of quantize.hpp. target_max is float(max_value()).
LOWBIT_HD LOWBIT_INLINE group_scale scale_from_amax(std::uint32_t amax_bits, float target_max,
                                                    scaling sc) {
  constexpr float flt_max = 3.40282347e38f;
  if (amax_bits >= 0x7F800000u) {
    const float nan = bit_cast<float>(0x7FC00000u);
    return {nan, nan};
  }
  if (amax_bits == 0)
    return {1.0f, 1.0f};
  const float amax = bit_cast<float>(amax_bits);
  if (sc.pow2) {
    // q = 2^(floor(log2(max / amax)) - margin), computed exactly from the two significands
    // (a float quotient could round up across a power of two), kept a normal float.
    const std::uint32_t tb = bit_cast<std::uint32_t>(target_max);
    const int k0 = floor_log2(tb) - floor_log2(amax_bits);
    int k = k0 - (significand(tb) < significand(amax_bits) ? 1 : 0) - sc.margin;
    k = k < -126 ? -126 : (k > 127 ? 127 : k);
    const float q = pow2f(k);
    return {q, 1.0f / q}; // exact: q is a power of two
  }
  // margin within [-126, 126] (checked by the host API) keeps 2^margin a normal float.
  const float shrink = pow2f(-sc.margin), grow = pow2f(sc.margin);
  float q = target_max / amax * shrink;
  if (q > flt_max)
    q = flt_max; // amax so small that max/amax overflows
  return {q, amax / target_max * grow};
}

// The result of x * q, with NaNs made the same on every machine (CPUs carry an input NaN's payload
// through arithmetic, NVIDIA GPUs return one canonical NaN): a NaN product is positive when the
// scale is NaN (a poisoned group), and otherwise carries sign(x) * sign(q) like any other product
// (so under a positive scale a NaN input keeps its sign). Only the sign of a NaN reaches a code.
// A finite x whose product overflows float is a finite overflow, not an infinite input: it is
// taken as +-FLT_MAX, which every target overflows from in the same direction as from the exact
// product (so toward-zero roundings still give +-max, as for the exact value). Nearest roundings
// and integer targets treat +-Inf and +-FLT_MAX alike, so they skip that step (FixOverflow false).
template <bool FixOverflow = true> LOWBIT_HD LOWBIT_INLINE float scaled(float x, float q) {
  const float y = x * q;
  if (y != y) {
    const std::uint32_t sign =
        (bit_cast<std::uint32_t>(x) ^ bit_cast<std::uint32_t>(q)) & 0x80000000u;
    return bit_cast<float>(q != q ? 0x7FC00000u : (0x7FC00000u | sign));
  }
  if constexpr (FixOverflow) {
    const std::uint32_t yb = bit_cast<std::uint32_t>(y);
    if ((yb & 0x7FFFFFFFu) == 0x7F800000u &&
        (bit_cast<std::uint32_t>(x) & 0x7F800000u) != 0x7F800000u)
      return bit_cast<float>((yb & 0x80000000u) | 0x7F7FFFFFu);
  }
  return y;
}

// Whether a (format, policy) pair needs scaled()'s finite-overflow step.
template <class FormatTag, class PolicyTag>
inline constexpr bool needs_overflow_fix = [] {
  if constexpr (detail::is_fixed_int<FormatTag>)
    return false;
  else if constexpr (PolicyTag::fixed)
    return PolicyTag::mode != emu::rounding::nearest_even &&
           PolicyTag::mode != emu::rounding::nearest_away;
  else
    return true;
}();

// Whether encode(x * q) may take emu's symmetric nearest-even encoder directly (see below).
template <class FormatTag, class PolicyTag>
inline constexpr bool symmetric_rne = [] {
  if constexpr (detail::is_fixed_int<FormatTag> || !FormatTag::fixed || !PolicyTag::fixed)
    return false;
  else
    return PolicyTag::mode == emu::rounding::nearest_even &&
           emu::detail::rne_symmetric(FormatTag::get());
}();

// One element: encode(x * q) as the target's code (integers in two's complement, low bits).
// Integer targets map every NaN to 0, so they need none of scaled()'s NaN rule. The symmetric
// nearest-even encoder takes |x * q| = |x| * |q| and the sign of x XOR q (none under a NaN
// scale), which is scaled()'s rule for NaNs too: the same bits with no per-element NaN test.
template <class FormatTag, class PolicyTag>
LOWBIT_HD LOWBIT_INLINE std::uint32_t quantize_element(const target& t, FormatTag ft, PolicyTag pt,
                                                       float x, float q, std::uint32_t rbits) {
  if constexpr (detail::is_fixed_int<FormatTag>) {
    if constexpr (PolicyTag::fixed)
      return static_cast<std::uint32_t>(emu::quantize_int(ft.get_int(), x * q, pt.get(), rbits)) &
             0xFFu;
    else
      return static_cast<std::uint32_t>(
                 detail::quantize_int_generic(ft.get_int(), x * q, pt.get(), rbits)) &
             0xFFu;
  } else if constexpr (symmetric_rne<FormatTag, PolicyTag>) {
    const auto enc = emu::detail::rne_encoder::make(ft.get(), pt.get());
    const std::uint32_t xb = bit_cast<std::uint32_t>(x), qb = bit_cast<std::uint32_t>(q);
    const float ax = bit_cast<float>(xb & 0x7FFFFFFFu), aq = bit_cast<float>(qb & 0x7FFFFFFFu);
    // A NaN scale makes every product NaN, and positive: the sign is dropped.
    const std::uint32_t sign_mask = q != q ? 0u : 0xFFFFFFFFu;
    return enc(ft.get(), bit_cast<std::uint32_t>(ax * aq), (xb ^ qb) & sign_mask);
  } else {
    if (t.is_int)
      return static_cast<std::uint32_t>(
                 detail::quantize_int_generic(t.ifmt, x * q, pt.get(), rbits)) &
             0xFFu;
    const float y = scaled<needs_overflow_fix<FormatTag, PolicyTag>>(x, q);
    return detail::encode(ft, pt, y, rbits);
  }
}

// Dequantized value v * d with the same NaN rule (a NaN code keeps its sign).
LOWBIT_HD LOWBIT_INLINE float descaled(float v, float d) {
  if (v != v)
    return v;
  if (d != d)
    return bit_cast<float>(0x7FC00000u);
  return v * d;
}

// The value of a code before scaling.
// (static: one copy per translation unit; several CUDA ones include this header.)
LOWBIT_HD static LOWBIT_OUTLINE_ON_DEVICE float element_value(const target& t, std::uint32_t code) {
  if (t.is_int) {
    const auto c = static_cast<std::uint8_t>(code);
    return t.ifmt.is_signed ? static_cast<float>(static_cast<std::int8_t>(c))
                            : static_cast<float>(c);
  }
  return emu::decode<float>(t.fmt, code);
}

// The same through a format tag (common/dispatch.hpp): inline where the target is a
// compile-time constant, the out-of-line function above otherwise.
template <class FormatTag>
LOWBIT_HD LOWBIT_INLINE float element_value(const target& t, FormatTag, std::uint32_t code) {
  if constexpr (detail::is_fixed_int<FormatTag>)
    return FormatTag::get_int().is_signed
               ? static_cast<float>(static_cast<std::int8_t>(static_cast<std::uint8_t>(code)))
               : static_cast<float>(static_cast<std::uint8_t>(code));
  else if constexpr (FormatTag::fixed)
    return emu::decode<float>(FormatTag::get(), code);
  else
    return element_value(t, code);
}

// ---- OCP MX ------------------------------------------------------------------------------------

// E8M0 code of the shared scale: floor(log2(amax)) - emax_elem, clamped to [-127, 127];
// 0xFF (NaN) for a NaN or Inf in the block; 2^-127 (code 0) for an all-zero block.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t mx_scale_code(std::uint32_t amax_bits, int emax) {
  // Written as selects (no branch on the GPU); amax 0 gives floor_log2 = -150, below -127, and
  // is clamped with the rest.
  int s = floor_log2(amax_bits) - emax;
  s = s < -127 ? -127 : (s > 127 ? 127 : s);
  const std::uint32_t code = amax_bits == 0 ? 0u : static_cast<std::uint32_t>(s + 127);
  return amax_bits >= 0x7F800000u ? 0xFFu : code;
}

// Element code of x / 2^s: dividing by a power of two is the same as encoding x into the format
// with bias lowered by s, which keeps the division exact (no float underflow) at no cost.
template <class FormatTag, class PolicyTag>
LOWBIT_HD LOWBIT_INLINE std::uint32_t mx_element(const target& t, FormatTag ft, PolicyTag pt,
                                                 float x, std::uint32_t scale_code,
                                                 std::uint32_t rbits) {
  if constexpr (FormatTag::fixed && PolicyTag::fixed && !detail::is_fixed_int<FormatTag>) {
    if constexpr (emu::detail::rne_short_path(FormatTag::get())) {
      // Nearest-even into a format whose subnormals stop at 2^-125: x * 2^-s in float is exact
      // unless it falls below 2^-126, where it rounds to zero either way. Two factors keep each
      // power of two a normal float. No branch: a NaN scale (code 0xFF, s = 128) still gives
      // normal factors, and its result is then replaced.
      const int s = static_cast<int>(scale_code) - 127;
      const int s1 = s / 2, s2 = s - s1;
      const std::uint32_t c = emu::encode(
          ft.get(), (x * quant_ops::pow2f(-s1)) * quant_ops::pow2f(-s2), pt.get(), rbits);
      return scale_code == 0xFFu ? emu::nan_code(FormatTag::get(), false, pt.get()) : c;
    }
  }
  // The format tag settles whether the target is an integer where it is fixed.
  const bool is_int = detail::is_fixed_int<FormatTag> || (!FormatTag::fixed && t.is_int);
  if (scale_code == 0xFFu) {
    if (is_int)
      return 0u;
    return emu::nan_code(t.fmt, false, pt.get());
  }
  const int s = static_cast<int>(scale_code) - 127;
  if (is_int) {
    // MXINT8: value = int8 * 2^-6, so the integer is x * 2^(6 - s), exact in double.
    const double y = static_cast<double>(x) * emu::detail::pow2<double>(6 - s);
    return static_cast<std::uint32_t>(detail::quantize_int_generic(t.ifmt, y, pt.get(), rbits)) &
           0xFFu;
  }
  if constexpr (!detail::is_fixed_int<FormatTag>) {
    emu::format f = ft.get(); // exact for every policy: x / 2^s is x in the format with bias - s
    f.bias -= s;
    return detail::encode_generic(f, x, pt.get(), rbits);
  } else {
    return 0u; // not reached: an integer tag took the branch above
  }
}

LOWBIT_HD static LOWBIT_OUTLINE_ON_DEVICE float mx_value(const target& t, std::uint32_t code,
                                                         std::uint32_t scale_code) {
  if (scale_code == 0xFFu)
    return bit_cast<float>(0x7FC00000u);
  if (!t.is_int && emu::is_nan_code(t.fmt, code))
    return emu::decode<float>(t.fmt, code);
  const int s = static_cast<int>(scale_code) - 127;
  if (t.is_int) {
    const double v = static_cast<double>(static_cast<std::int8_t>(static_cast<std::uint8_t>(code)));
    return static_cast<float>(v * emu::detail::pow2<double>(s - 6));
  }
  return static_cast<float>(emu::decode<double>(t.fmt, code) * emu::detail::pow2<double>(s));
}

} // namespace lowbit::kernels::quant_ops
