// Per-element and per-group code of the activation quantization, shared by the CPU twin and the
// CUDA kernels: the order-preserving keys of the per-group min/max reduction, the update of the
// running estimates, and the quantization and dequantization of one element.
#pragma once

#include <cstdint>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/policy.hpp>

namespace lowbit::kernels::actquant_ops {

using emu::detail::bit_cast;

inline constexpr float code_max = 255.0f;

// A float's bits as an unsigned key that orders like the value (-0 just below +0). Min and max of
// keys are exact and order-free, so every reduction tree (threads, atomics, chunks of the CPU
// twin) gives the same bits.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t key_of(float x) {
  const std::uint32_t b = bit_cast<std::uint32_t>(x);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}
LOWBIT_HD LOWBIT_INLINE constexpr float value_of_key(std::uint32_t k) {
  return bit_cast<float>((k & 0x80000000u) != 0 ? (k & 0x7FFFFFFFu) : ~k);
}
// The empty reduction: no finite key reaches these.
inline constexpr std::uint32_t empty_min = 0xFFFFFFFFu, empty_max = 0u;

LOWBIT_HD LOWBIT_INLINE constexpr bool finite(float x) {
  return (bit_cast<std::uint32_t>(x) & 0x7F800000u) != 0x7F800000u;
}

struct minmax {
  std::uint32_t lo = empty_min, hi = empty_max;
  LOWBIT_HD LOWBIT_INLINE constexpr void add(float x) {
    if (finite(x)) {
      const std::uint32_t k = key_of(x);
      lo = k < lo ? k : lo;
      hi = k > hi ? k : hi;
    }
  }
  LOWBIT_HD LOWBIT_INLINE constexpr void merge(const minmax& o) {
    lo = o.lo < lo ? o.lo : lo;
    hi = o.hi > hi ? o.hi : hi;
  }
};

struct estimate {
  float alpha, beta;
};

// The running-estimate update of actquant.hpp from a group's reduction.
LOWBIT_HD LOWBIT_INLINE constexpr estimate update(estimate old, minmax mm, float momentum) {
  if (mm.lo == empty_min)
    return old; // no finite element
  constexpr float flt_max = 3.40282347e38f;
  const float lo = value_of_key(mm.lo), hi = value_of_key(mm.hi);
  float range = hi - lo;
  range = range > flt_max ? flt_max : range; // the span of two finite floats may overflow
  const float a = range / code_max;
  if (!(old.alpha >= 0.0f))
    return {a, lo};
  const float keep = 1.0f - momentum;
  const float na = momentum * old.alpha, ma = keep * a;
  const float nb = momentum * old.beta, mb = keep * lo;
  return {na + ma, nb + mb};
}

// The code of one element (0..255).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint8_t quantize(float x, estimate e, const emu::policy& p,
                                                        std::uint32_t rbits) {
  constexpr emu::int_format u8 = emu::uint8;
  const float t = (x - e.beta) / e.alpha;
  return static_cast<std::uint8_t>(emu::quantize_int(u8, t, p, rbits));
}

LOWBIT_HD LOWBIT_INLINE constexpr float dequantize(std::uint8_t code, estimate e) {
  const float v = static_cast<float>(code) * e.alpha;
  return v + e.beta;
}

// The stored forms of a dequantized value.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint16_t to_bf16(float v) {
  constexpr emu::format f = emu::bfloat16;
  constexpr emu::policy p = emu::rne;
  return static_cast<std::uint16_t>(emu::encode(f, v, p));
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint16_t to_f16(float v) {
  constexpr emu::format f = emu::float16;
  constexpr emu::policy p = emu::rne;
  return static_cast<std::uint16_t>(emu::encode(f, v, p));
}

// The group of element i of a contiguous tensor read as [outer, C, inner]: runs of
// run = inner * group_size consecutive elements share a group, and the G groups repeat.
struct group_of {
  std::int64_t run = 1, groups = 1;
  LOWBIT_HD LOWBIT_INLINE constexpr std::int64_t operator()(std::int64_t i) const {
    if (groups == 1)
      return 0;
    // 32-bit division where everything fits (a fraction of the 64-bit one's cost on GPUs).
    const auto u = static_cast<std::uint64_t>(i), r = static_cast<std::uint64_t>(run),
               gs = static_cast<std::uint64_t>(groups);
    if ((u | r | gs) >> 32 == 0)
      return static_cast<std::int64_t>(static_cast<std::uint32_t>(u) /
                                       static_cast<std::uint32_t>(r) %
                                       static_cast<std::uint32_t>(gs));
    return (i / run) % groups;
  }
};

static_assert(value_of_key(key_of(-1.5f)) == -1.5f && value_of_key(key_of(2.0f)) == 2.0f);
static_assert(key_of(-1.0f) < key_of(-0.0f) && key_of(-0.0f) < key_of(0.0f) &&
              key_of(0.0f) < key_of(1e-45f));

} // namespace lowbit::kernels::actquant_ops
