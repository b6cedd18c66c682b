// Per-element split and join of residual master weights (Lewandowski and Kosson, "Memory
// Efficient Mixed-Precision Optimizers", 2023), shared by the CPU twin, the CUDA kernel and the
// optimizer steps of kernels/optim: a float32 value x is kept as a 16-bit weight w (bfloat16 or
// float16; what the forward pass reads) and a k-bit signed residual r (1 <= k <= 16) that holds
// the bits w lost. docs/techniques/residual.md has the rule, the tie rule's proof and the bounds;
// in short, on magnitudes as integers (the float32 bit patterns without the sign, which order
// the non-negative floats and step by one float32 ulp):
//
//   w     = x rounded to the nearest 16-bit value, ties away from zero (overflow: Inf)
//   d     = |x|bits - |w|bits, the signed distance from w to x in float32 steps
//   r     = round(d / q) (ties up), saturated to [-2^(k-1), 2^(k-1) - 1], q = 2^max(0, e - k)
//           with e = 16 for bfloat16, 13 for float16 (the mantissa bits float32 has over w's)
//   join  = sign(w) * ( |w|bits + r q )
//
// For bfloat16, d lies in [-2^15, 2^15 - 1] (ties away: a tie has d = -2^15 after rounding up;
// ties to even would also give +2^15), so k = 16 reconstructs every non-NaN float32 exactly.
// NaN: w is the quiet NaN of x's sign, r = 0, and join gives float32's quiet NaN of w's sign.
// float16 overflow (|x| >= 65520): w = Inf, r = 0, join Inf.
#pragma once

#include <cstdint>

#include <lowbit/emu/convert.hpp>

namespace lowbit::kernels::residual_ops {

enum class weight_kind : std::uint8_t { bf16, f16 };

// The float32 steps that w's dtype drops: the natural width of an exact residual.
LOWBIT_HD LOWBIT_INLINE int extra_bits(weight_kind t) {
  return t == weight_kind::bf16 ? 16 : 13;
}

// log2 of the residual's quantum q (0 when k bits hold every remainder of the normal range).
LOWBIT_HD LOWBIT_INLINE int quantum_shift(weight_kind t, int bits) {
  const int s = extra_bits(t) - bits;
  return s > 0 ? s : 0;
}

struct parts {
  std::uint16_t w; // the 16-bit weight's bits
  std::int32_t r;  // the residual, in [-2^(k-1), 2^(k-1) - 1]
};

LOWBIT_HD LOWBIT_INLINE std::uint32_t bits_of(float x) {
  return emu::detail::bit_cast<std::uint32_t>(x);
}

// The float32 bit pattern of a 16-bit weight (exact: both formats embed in float32).
LOWBIT_HD LOWBIT_INLINE std::uint32_t widen(weight_kind t, std::uint16_t w) {
  if (t == weight_kind::bf16)
    return static_cast<std::uint32_t>(w) << 16;
  constexpr emu::format f16 = emu::float16;
  return bits_of(emu::decode<float>(f16, w));
}

// x rounded to the nearest 16-bit value, ties away from zero, overflow to Inf (not NaN).
LOWBIT_HD LOWBIT_INLINE std::uint16_t round16(weight_kind t, float x) {
  const std::uint32_t u = bits_of(x), sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
  if (t == weight_kind::bf16)
    return static_cast<std::uint16_t>((sign >> 16) | ((mag + 0x8000u) >> 16));
  constexpr emu::format f16 = emu::float16;
  return static_cast<std::uint16_t>(emu::encode(f16, x, emu::policy{emu::rounding::nearest_away}));
}

LOWBIT_HD LOWBIT_INLINE bool is_nan_bits(std::uint32_t u) {
  return (u & 0x7FFFFFFFu) > 0x7F800000u;
}

LOWBIT_HD LOWBIT_INLINE parts split(weight_kind t, int bits, float x) {
  const std::uint32_t u = bits_of(x), sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) // NaN: a quiet NaN of x's sign, no residual
    return {static_cast<std::uint16_t>(t == weight_kind::bf16 ? (sign >> 16) | 0x7FC0u
                                                              : (sign >> 16) | 0x7E00u),
            0};
  const std::uint16_t w = round16(t, x);
  const std::uint32_t wmag = widen(t, w) & 0x7FFFFFFFu;
  if (t == weight_kind::f16 && wmag == 0x7F800000u) // float16 overflow: Inf, and so is the join
    return {w, 0};
  // 32-bit arithmetic suffices: magnitudes are at most 0x7F800000, so |d| < 2^31, and a
  // saturated residual times its quantum is below 2^15.
  const std::int32_t d = static_cast<std::int32_t>(mag) - static_cast<std::int32_t>(wmag);
  const int s = quantum_shift(t, bits);
  const std::int32_t hi = static_cast<std::int32_t>((1u << (bits - 1)) - 1u), lo = -hi - 1;
  // round(d / q), ties up: floor((d + q/2) / q); d + q/2 stays below 2^31 (q <= 2^15).
  const std::int32_t half = s > 0 ? (1 << (s - 1)) : 0;
  std::int32_t r = (d + half) >> s;    // C++20: >> of a negative value is floor division
  r = r > hi ? hi : (r < lo ? lo : r); // float16 below 2^-14 (k <= 13) or 2^-17 (k = 16)
  return {w, r};
}

LOWBIT_HD LOWBIT_INLINE float join(weight_kind t, int bits, std::uint16_t w, std::int32_t r) {
  const std::uint32_t wide = widen(t, w);
  const std::uint32_t sign = wide & 0x80000000u;
  if (is_nan_bits(wide))
    return emu::detail::bit_cast<float>(sign | 0x7FC00000u);
  const int s = quantum_shift(t, bits);
  // In 32 bits: |w| is at most 0x7F800000 and |r q| below 2^23 for any residual of its dtype
  // (int8 for k <= 8, q <= 2^15; int16 above, q <= 2^7), so the sum cannot overflow.
  std::int32_t mag = static_cast<std::int32_t>(wide & 0x7FFFFFFFu) + r * (1 << s);
  // Only pairs that split never makes get here (a residual past 0 or past Inf): kept in range.
  mag = mag < 0 ? 0 : (mag > 0x7F800000 ? 0x7F800000 : mag);
  return emu::detail::bit_cast<float>(sign | static_cast<std::uint32_t>(mag));
}

// The 16-bit weight as float32 (what the forward pass computes with).
LOWBIT_HD LOWBIT_INLINE float weight_value(weight_kind t, std::uint16_t w) {
  return emu::detail::bit_cast<float>(widen(t, w));
}

} // namespace lowbit::kernels::residual_ops
