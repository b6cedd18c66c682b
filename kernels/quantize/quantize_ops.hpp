// Per-element and per-group quantization code shared by the CPU twin and the CUDA kernels. Every
// result bit comes from here; the two drivers only decide which elements form a group.
#pragma once

#include <cstdint>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/kernels/quantize.hpp>

#include "../cast/cast_ops.hpp"
#include "../common/dispatch.hpp"

namespace lowbit::kernels::quant_ops {

using emu::detail::bit_cast;

// |x| as float bits. The maximum of these over a group is its amax with NaN propagating:
// NaN bits > Inf bits > every finite value. Max is exact and order-free, so every reduction tree
// (threads, warps, atomics) gives the same bits.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t abs_bits(float x) {
  return bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
}

struct group_scale {
  float q;  // quantization multiplier
  float d;  // dequantization factor, stored per group
};

LOWBIT_HD LOWBIT_INLINE constexpr float pow2f(int k) {  // 2^k, k in [-126, 127]
  return bit_cast<float>(static_cast<std::uint32_t>(k + 127) << 23);
}

// Largest power of two <= v, for finite v > 0.
LOWBIT_HD LOWBIT_INLINE constexpr float pow2_floor(float v) {
  const std::uint32_t b = bit_cast<std::uint32_t>(v);
  if (b >= 0x00800000u) return bit_cast<float>(b & 0xFF800000u);
  return bit_cast<float>(std::uint32_t{1} << (emu::detail::bit_width(b) - 1));  // subnormal
}

// The scale rule of quantize.hpp. target_max is float(max_value()).
LOWBIT_HD LOWBIT_INLINE group_scale scale_from_amax(std::uint32_t amax_bits, float target_max,
                                                     scaling sc) {
  constexpr float flt_max = 3.40282347e38f;
  if (amax_bits >= 0x7F800000u) {
    const float nan = bit_cast<float>(0x7FC00000u);
    return {nan, nan};
  }
  if (amax_bits == 0) return {1.0f, 1.0f};
  const float amax = bit_cast<float>(amax_bits);
  // margin within [-126, 126] (checked by the host API) keeps 2^margin a normal float.
  const float shrink = pow2f(-sc.margin), grow = pow2f(sc.margin);
  float q = target_max / amax * shrink;
  if (sc.pow2) {
    q = q > flt_max ? pow2f(127) : pow2_floor(q);
    return {q, 1.0f / q};  // exact: q is a power of two
  }
  if (q > flt_max) q = flt_max;  // amax so small that max/amax overflows
  return {q, amax / target_max * grow};
}

// One element: encode(x * q) as the target's code (integers in two's complement, low bits).
template <class FormatTag, class PolicyTag>
LOWBIT_HD LOWBIT_INLINE std::uint32_t quantize_element(const target& t, FormatTag ft,
                                                       PolicyTag pt, float x, float q,
                                                       std::uint32_t rbits) {
  const float y = x * q;
  if (t.is_int)
    return static_cast<std::uint32_t>(detail::quantize_int_generic(t.ifmt, y, pt.get(), rbits)) &
           0xFFu;
  return detail::encode(ft, pt, y, rbits);
}

// The value of a code before scaling.
LOWBIT_HD LOWBIT_OUTLINE_ON_DEVICE float element_value(const target& t, std::uint32_t code) {
  if (t.is_int) {
    const auto c = static_cast<std::uint8_t>(code);
    return t.ifmt.is_signed ? static_cast<float>(static_cast<std::int8_t>(c))
                            : static_cast<float>(c);
  }
  return emu::decode<float>(t.fmt, code);
}

// ---- OCP MX ------------------------------------------------------------------------------------

// floor(log2(amax)) for finite amax > 0.
LOWBIT_HD LOWBIT_INLINE constexpr int floor_log2(std::uint32_t amax_bits) {
  const int field = static_cast<int>(amax_bits >> 23);
  if (field != 0) return field - 127;
  return emu::detail::bit_width(amax_bits) - 1 - 149;
}

// E8M0 code of the shared scale: floor(log2(amax)) - emax_elem, clamped to [-127, 127];
// 0xFF (NaN) for a NaN or Inf in the block; 2^-127 (code 0) for an all-zero block.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t mx_scale_code(std::uint32_t amax_bits, int emax) {
  if (amax_bits >= 0x7F800000u) return 0xFFu;
  if (amax_bits == 0) return 0u;
  int s = floor_log2(amax_bits) - emax;
  s = s < -127 ? -127 : (s > 127 ? 127 : s);
  return static_cast<std::uint32_t>(s + 127);
}

// Element code of x / 2^s: dividing by a power of two is the same as encoding x into the format
// with bias lowered by s, which keeps the division exact (no float underflow) at no cost.
template <class FormatTag, class PolicyTag>
LOWBIT_HD LOWBIT_INLINE std::uint32_t mx_element(const target& t, FormatTag ft, PolicyTag pt, float x,
                                                 std::uint32_t scale_code, std::uint32_t rbits) {
  if (scale_code == 0xFFu) {
    if (t.is_int) return 0u;
    return emu::nan_code(t.fmt, false, pt.get());
  }
  const int s = static_cast<int>(scale_code) - 127;
  if (t.is_int) {
    // MXINT8: value = int8 * 2^-6, so the integer is x * 2^(6 - s), exact in double.
    const double y = static_cast<double>(x) * emu::detail::pow2<double>(6 - s);
    return static_cast<std::uint32_t>(detail::quantize_int_generic(t.ifmt, y, pt.get(), rbits)) &
           0xFFu;
  }
  emu::format f = ft.get();  // only the bias is a run-time value when the tag is fixed
  f.bias -= s;
  if constexpr (FormatTag::fixed && PolicyTag::fixed)
    return emu::encode(f, x, pt.get(), rbits);
  else
    return detail::encode_generic(f, x, pt.get(), rbits);
}

LOWBIT_HD LOWBIT_OUTLINE_ON_DEVICE float mx_value(const target& t, std::uint32_t code,
                                       std::uint32_t scale_code) {
  if (scale_code == 0xFFu) return bit_cast<float>(0x7FC00000u);
  const int s = static_cast<int>(scale_code) - 127;
  if (t.is_int) {
    const double v = static_cast<double>(static_cast<std::int8_t>(static_cast<std::uint8_t>(code)));
    return static_cast<float>(v * emu::detail::pow2<double>(s - 6));
  }
  return static_cast<float>(emu::decode<double>(t.fmt, code) * emu::detail::pow2<double>(s));
}

}  // namespace lowbit::kernels::quant_ops
