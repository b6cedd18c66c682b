// Per-element and per-group code of the activation quantization, shared by the CPU twin and the
// CUDA kernels: the order-preserving keys of the per-group min/max reduction, the update of the
// running estimates, and the quantization and dequantization of one element.
#pragma once

#include <cmath>
#include <cstdint>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/policy.hpp>

#include "../common/element_ops.hpp"

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

// What a group's codes are computed from: t = fl(fl(fl(x - beta) s) r) with r = fl(1 / (alpha s)),
// one reciprocal per group in place of a division per element. s = 2^64 where |alpha| < 2^-126
// (the reciprocal of a subnormal alpha could overflow), else 1: multiplying by it is exact short
// of overflow, and an overflow saturates the code either way. alpha 0 gives r = Inf and, like the
// division, codes 0 (x == beta: 0 * Inf is NaN) or 255.
struct step {
  float beta, s, r;
};
LOWBIT_HD LOWBIT_INLINE constexpr step step_of(estimate e) {
  constexpr float min_normal = 1.17549435e-38f, big = 18446744073709551616.0f; // 2^-126, 2^64
  const float s = e.alpha > -min_normal && e.alpha < min_normal ? big : 1.0f;
  return {e.beta, s, 1.0f / (e.alpha * s)};
}
LOWBIT_HD LOWBIT_INLINE constexpr float position(float x, const step& st) {
  const float d = x - st.beta;
  return (d * st.s) * st.r;
}

// The code of one element (0..255) under policy p: emu::quantize_int of its position.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint8_t quantize(float x, const step& st,
                                                        const emu::policy& p, std::uint32_t rbits) {
  constexpr emu::int_format u8 = emu::uint8;
  return static_cast<std::uint8_t>(emu::quantize_int(u8, position(x, st), p, rbits));
}
// The same for nearest-even in fewer operations: the position clamped by maxNum / minNum (a NaN
// position clamps to 0, the code quantize_int gives it), then rounded half-even by adding
// 1.5 * 2^23, which leaves the integer in the low bits.
LOWBIT_HD LOWBIT_INLINE std::uint8_t quantize_nearest(float x, const step& st) {
  const float c = fminf(fmaxf(position(x, st), 0.0f), code_max);
  return static_cast<std::uint8_t>(bit_cast<std::uint32_t>(c + 12582912.0f));
}

LOWBIT_HD LOWBIT_INLINE constexpr float dequantize(std::uint8_t code, estimate e) {
  const float v = static_cast<float>(code) * e.alpha;
  return v + e.beta;
}
// What a dequantized value is stored as: a NaN (from a NaN or infinite alpha or beta) as the
// positive quiet NaN, whose bits, unlike a NaN's payload through arithmetic, every processor
// agrees on.
inline constexpr std::uint32_t quiet_nan_bits = 0x7FC00000u;
LOWBIT_HD LOWBIT_INLINE constexpr float canonical(float v) {
  return v != v ? bit_cast<float>(quiet_nan_bits) : v;
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

// Division of 32-bit unsigned integers by a divisor d fixed at construction (on the host):
// q = floor(n / d) for every n < 2^32 from a multiply-high, an add and two shifts (Granlund and
// Montgomery, "Division by invariant integers using multiplication", 1994, figure 4.1:
// l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1), where the hardware division is a
// sequence of some twenty instructions.
struct u32_divider {
  std::uint32_t d = 1, m = 1;
  int s1 = 0, s2 = 0;
  static constexpr u32_divider of(std::uint32_t d) {
    int l = 0;
    while ((std::uint64_t{1} << l) < d)
      ++l;
    u32_divider v;
    v.d = d;
    v.m = static_cast<std::uint32_t>(
        ((std::uint64_t{1} << 32) * ((std::uint64_t{1} << l) - d)) / d + 1);
    v.s1 = l < 1 ? l : 1;
    v.s2 = l > 1 ? l - 1 : 0;
    return v;
  }
  LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t div(std::uint32_t n) const {
    const auto t = static_cast<std::uint32_t>((std::uint64_t{m} * n) >> 32); // mul.hi on GPUs
    return (t + ((n - t) >> s1)) >> s2;
  }
};
static_assert(u32_divider::of(7).div(4294967295u) == 613566756u &&
              u32_divider::of(1).div(12345u) == 12345u &&
              u32_divider::of(4294967295u).div(4294967294u) == 0u &&
              u32_divider::of(12608).div(12608u * 300u + 12607u) == 300u);

// group_of for indices below 2^32 by two such divisions (the kernels' form of it): the run's
// number q = i / run, its group q % groups, and the run's first index q * run.
struct group_divider {
  u32_divider run, groups;
  static constexpr group_divider of(const group_of& g) {
    return {u32_divider::of(static_cast<std::uint32_t>(g.run)),
            u32_divider::of(static_cast<std::uint32_t>(g.groups))};
  }
  // Whether of(g) is exact for a tensor of n elements.
  static constexpr bool fits(const group_of& g, std::int64_t n) {
    return n <= (std::int64_t{1} << 32) && g.run < (std::int64_t{1} << 32) &&
           g.groups < (std::int64_t{1} << 32);
  }
  LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t run_of(std::uint32_t i) const {
    return run.div(i);
  }
  LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t group_of_run(std::uint32_t q) const {
    return q - groups.div(q) * groups.d;
  }
};

// ---- LayerNorm's backward from codes (actquant_layer_norm_backward) -------------------------
//
// A row's sums S: element c into partial (c / 4) mod 32 (its lane in the CUDA kernel, which holds
// the row's runs of four at 4 l + 128 j) in increasing c from +0, then the 32 partials pairwise:
// p_l + p_(l xor h) for h = 16, 8, 4, 2, 1 (the butterfly of warp shuffles; float addition is
// commutative, so every lane ends with the same bits). The parameter gradients: float32 sums over
// chunks of ln_chunk_rows rows, the chunks' sums added in float64 per ln_segment chunks, those in
// float64 in order, then rounded once.
inline constexpr int ln_lanes = 32;
inline constexpr std::int64_t ln_chunk_rows = 32;
inline constexpr std::int64_t ln_segment = 64;

LOWBIT_HD LOWBIT_INLINE constexpr int ln_lane(std::int64_t c) {
  return static_cast<int>((c >> 2) & (ln_lanes - 1));
}

using element_ops::div_rn;
using element_ops::sqrt_rn;

// The CPU form of the pairwise step over the 32 partials.
inline float ln_combine(float (&p)[ln_lanes]) {
  for (int h = ln_lanes / 2; h > 0; h >>= 1) {
    float q[ln_lanes];
    for (int l = 0; l < ln_lanes; ++l)
      q[l] = p[l] + p[l ^ h];
    for (int l = 0; l < ln_lanes; ++l)
      p[l] = q[l];
  }
  return p[0];
}

// 1 / sqrt(S((x - mean)^2) / C + eps).
LOWBIT_HD LOWBIT_INLINE float ln_rstd(float sum_sq, float c, float eps) {
  return div_rn(1.0f, sqrt_rn(div_rn(sum_sq, c) + eps));
}
// An element's input gradient from g = gy w, xhat, a = S(g) / C, b = S(g xhat) / C.
LOWBIT_HD LOWBIT_INLINE float ln_gx(float g, float xhat, float a, float b, float rstd) {
  return ((g - a) - xhat * b) * rstd;
}

static_assert(value_of_key(key_of(-1.5f)) == -1.5f && value_of_key(key_of(2.0f)) == 2.0f);
static_assert(key_of(-1.0f) < key_of(-0.0f) && key_of(-0.0f) < key_of(0.0f) &&
              key_of(0.0f) < key_of(1e-45f));

} // namespace lowbit::kernels::actquant_ops
