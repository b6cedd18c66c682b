// Integer quantization targets (int8 symmetric and full range, uint8, int4): round a value that is
// already scaled to an integer under a rounding policy, then clamp. Integer targets always
// saturate; NaN maps to 0. The scaling itself (127 * x / absmax, ...) belongs to the kernels.
#pragma once

#include <cstdint>

#include <lowbit/emu/config.hpp>
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/policy.hpp>

namespace lowbit::emu {

struct int_format {
  int bits = 8;
  bool is_signed = true;
  bool symmetric = false; // signed range [-(2^(bits-1) - 1), 2^(bits-1) - 1]: no lone -2^(bits-1)

  friend constexpr bool operator==(const int_format&, const int_format&) = default;

  LOWBIT_HD constexpr std::int32_t max() const {
    return is_signed ? (std::int32_t{1} << (bits - 1)) - 1 : (std::int32_t{1} << bits) - 1;
  }
  LOWBIT_HD constexpr std::int32_t min() const {
    return is_signed ? (symmetric ? -max() : -max() - 1) : 0;
  }
};

constexpr const char* check_int_format(const int_format& f) {
  if (f.bits < 2 || f.bits > 16)
    return "integer formats have 2..16 bits";
  if (f.symmetric && !f.is_signed)
    return "only signed integer formats can be symmetric";
  return nullptr;
}

inline constexpr int_format int8{8, true, false};
inline constexpr int_format int8_sym{8, true, true};
inline constexpr int_format uint8{8, false, false};
inline constexpr int_format int4{4, true, false};
inline constexpr int_format int4_sym{4, true, true};
inline constexpr int_format uint4{4, false, false};

// round(x) under p.round (stochastic: with rbits), clamped to [f.min(), f.max()]; NaN -> 0.
template <class T>
LOWBIT_HD LOWBIT_INLINE constexpr std::int32_t
quantize_int(const int_format& f, T x, const policy& p, std::uint32_t rbits = 0) {
  using tr = detail::binary_traits<T>;
  using U = typename tr::bits_type;
  constexpr U sign_bit = U{1} << (tr::width - 1);
  constexpr U inf_bits = ((U{1} << (tr::width - 1 - tr::man)) - 1u) << tr::man;
  if constexpr (sizeof(T) == 4) {
    if (p.round == rounding::nearest_even) {
      // Clamp into [min, max] (integers, so clamping and rounding commute), then let the FPU
      // round: adding 1.5 * 2^23 leaves round-half-even(c) in the low bits, for |c| < 2^22.
      const float lo = static_cast<float>(f.min()), hi = static_cast<float>(f.max());
      float c = x < lo ? lo : x;
      c = c > hi ? hi : c;
      const auto r =
          static_cast<std::int32_t>(detail::bit_cast<std::uint32_t>(c + 12582912.0f) - 0x4B400000u);
      return x != x ? 0 : r;
    }
  }
  const U b = detail::bit_cast<U>(x);
  const bool neg = (b & sign_bit) != 0;
  const U a = b & ~sign_bit;
  if (a > inf_bits)
    return 0;
  if (a == 0)
    return 0;
  const int src_field = static_cast<int>(a >> tr::man);
  // Anything at or beyond 2^bits clamps whatever the rounding (also subnormal-free: field != 0).
  if (src_field - tr::bias >= f.bits)
    return neg ? f.min() : f.max();
  U sig;
  int e;
  if (src_field != 0) {
    sig = (a & ((U{1} << tr::man) - 1u)) | (U{1} << tr::man);
    e = src_field - tr::bias - tr::man;
  } else {
    sig = a;
    e = 1 - tr::bias - tr::man;
  }
  const auto m = static_cast<std::int32_t>(detail::round_shifted<U>(sig, -e, neg, p, rbits));
  const std::int32_t v = neg ? -m : m;
  return v < f.min() ? f.min() : (v > f.max() ? f.max() : v);
}

static_assert(quantize_int(int8_sym, -200.0f, rne) == -127 &&
              quantize_int(int8, -200.0f, rne) == -128);
static_assert(quantize_int(int8, 2.5f, rne) == 2 &&
              quantize_int(int8, 2.5f, policy{rounding::nearest_away}) == 3);
static_assert(quantize_int(uint8, -3.0f, rne) == 0 && quantize_int(int4, 7.6, rne) == 7);

} // namespace lowbit::emu
