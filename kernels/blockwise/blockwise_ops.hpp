// Per-element code of block-wise codebook quantization, shared by the CPU twin and the CUDA
// kernels: the codebook tables, normalization, the nearest-entry search, stochastic rounding
// between neighbours and dequantization. Every result bit comes from here.
#pragma once

#include <cstdint>

#include <lowbit/emu/config.hpp>

namespace lowbit::kernels::blockwise_ops {

using emu::detail::bit_cast;

// A codebook prepared for the search. For neighbours c[j] <= c[j+1] the pair sum c[j] + c[j+1]
// is held exactly as sum_hi[j] + sum_lo[j] (an error-free transformation), so that comparing
// 2t with it compares t with the exact midpoint: no rounding enters the decision.
struct tables {
  float value[256];
  float sum_hi[255];
  float sum_lo[255];
};

// Knuth's TwoSum: hi + lo == a + b exactly, hi = fl(a + b) (no overflow for |a|, |b| <= 1).
LOWBIT_HD inline void two_sum(float a, float b, float& hi, float& lo) {
  const float s = a + b;
  const float bb = s - a;
  lo = (a - (s - bb)) + (b - bb);
  hi = s;
}

LOWBIT_HD inline void prepare(const float* values, tables& t) {
  for (int j = 0; j < 256; ++j)
    t.value[j] = values[j];
  for (int j = 0; j < 255; ++j)
    two_sum(values[j], values[j + 1], t.sum_hi[j], t.sum_lo[j]);
}

// |x| as float bits; the maximum over a block is its absmax with NaN > Inf > every finite value
// (exact and order-free, so any reduction tree gives the same bits).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t abs_bits(float x) {
  return bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
}

LOWBIT_HD LOWBIT_INLINE constexpr bool poisoned(std::uint32_t amax_bits) {
  return amax_bits >= 0x7F800000u;
}

// Whether t lies above midpoint j: 2t > c[j] + c[j+1], or 2t equal to it and the midpoint <= 0
// (the tie rule: a tie goes to the entry of smaller magnitude, and at a zero midpoint to the
// upper entry). 2t is exact for |t| <= 1. hi = fl(m2) carries the sign of m2 = hi + lo, and
// |lo| is at most half the spacing of floats at hi, so 2t > hi implies 2t > m2.
LOWBIT_HD LOWBIT_INLINE bool above(float t2, float hi, float lo) {
  return (t2 > hi) | ((t2 == hi) & ((lo < 0.0f) | ((lo == 0.0f) & (hi <= 0.0f))));
}

// Index of the nearest entry to t (not NaN): the number of midpoints below t under the tie
// rule, by a branch-free binary search (the predicate is monotone in j for a sorted codebook).
LOWBIT_HD LOWBIT_INLINE std::uint32_t nearest_index(const float* sum_hi, const float* sum_lo,
                                                    float t) {
  const float t2 = t + t;
  std::uint32_t idx = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t step = 128; step != 0; step >>= 1) {
    const std::uint32_t j = idx + step - 1;
    idx += above(t2, sum_hi[j], sum_lo[j]) ? step : 0u;
  }
  return idx;
}

// ---- the nearest-entry search through buckets (CUDA kernels) -----------------------------------
//
// nearest_index is monotone in t, so every t whose float bits share a bucket (sign, exponent and
// top 6 mantissa bits; |t| <= 1 keeps the exponent field below 128, hence 2^14 buckets) has its
// nearest index between those of the bucket's two ends. A table holds both ends' indices; a walk
// over the midpoints between them, with the same exact comparison, ends at the same index as the
// binary search. For the built-in codebooks a bucket holds at most one midpoint, so the walk is
// one comparison at most; any sorted codebook gives the same results, only slower where entries
// crowd.
inline constexpr std::uint32_t bucket_count = 1u << 14;

LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_of(float t) {
  const auto b = bit_cast<std::uint32_t>(t);
  return ((b >> 18) & 0x2000u) | ((b >> 17) & 0x1FFFu);
}

// Table entry of bucket u: the lower end's index in bits 0-7, the upper end's in bits 8-15.
LOWBIT_HD inline std::uint16_t bucket_bounds(const float* sum_hi, const float* sum_lo,
                                             std::uint32_t u) {
  const std::uint32_t first = ((u & 0x2000u) << 18) | ((u & 0x1FFFu) << 17);
  const std::uint32_t i0 = nearest_index(sum_hi, sum_lo, bit_cast<float>(first));
  const std::uint32_t i1 = nearest_index(sum_hi, sum_lo, bit_cast<float>(first | 0x1FFFFu));
  const std::uint32_t lo = i0 < i1 ? i0 : i1, hi = i0 < i1 ? i1 : i0;  // negative: reversed
  return static_cast<std::uint16_t>(lo | (hi << 8));
}

// nearest_index(t) for |t| <= 1 (not NaN), from the bucket table.
LOWBIT_HD LOWBIT_INLINE std::uint32_t nearest_by_buckets(const std::uint16_t* buckets,
                                                         const float* sum_hi, const float* sum_lo,
                                                         float t) {
  const std::uint32_t b = buckets[bucket_of(t)];
  std::uint32_t idx = b & 0xFFu;
  const std::uint32_t hi = b >> 8;
  const float t2 = t + t;
  while (idx < hi && above(t2, sum_hi[idx], sum_lo[idx]))
    ++idx;
  return idx;
}

// Number of entries <= t (0..256), branch-free.
LOWBIT_HD LOWBIT_INLINE std::uint32_t count_at_most(const float* value, float t) {
  std::uint32_t idx = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::uint32_t step = 128; step != 0; step >>= 1)
    idx += (value[idx + step - 1] <= t) ? step : 0u;
  return idx + ((value[idx] <= t) ? 1u : 0u); // idx <= 255 here
}

// Stochastic rounding between the neighbours lo = c[j] <= t < c[j+1] = hi (j the last entry
// <= t): tau = fl(fl(t - lo) / fl(hi - lo)) in [0, 1], up iff floor(tau * 2^24) + r >= 2^24 with
// r the top 24 of the element's 32 random bits. Below c[0]: 0; at or above c[255]: 255.
LOWBIT_HD LOWBIT_INLINE std::uint32_t stochastic_index(const float* value, float t,
                                                       std::uint32_t rbits) {
  const std::uint32_t n = count_at_most(value, t);
  if (n == 0)
    return 0;
  if (n == 256)
    return 255;
  const float lo = value[n - 1], hi = value[n];
  const float tau = (t - lo) / (hi - lo);
  const auto f = static_cast<std::uint32_t>(tau * 16777216.0f); // exact scaling, tau <= 1
  return (f + (rbits >> 8) >= (1u << 24)) ? n : n - 1;
}

// The normalized value of x in a block with finite absmax bits: x / absmax (one correctly
// rounded float32 division, |t| <= 1); an all-zero block keeps x (+-0).
LOWBIT_HD LOWBIT_INLINE float normalized(float x, std::uint32_t amax_bits) {
  if (amax_bits == 0)
    return x;
  return x / bit_cast<float>(amax_bits);
}

// The code of x in its block. A block holding NaN or Inf is poisoned: every element gets
// `zero_code` (the nearest entry to +0), and its absmax is stored as NaN.
LOWBIT_HD LOWBIT_INLINE std::uint32_t encode(const tables& tb, float x, std::uint32_t amax_bits,
                                             bool stochastic, std::uint32_t rbits,
                                             std::uint32_t zero_code) {
  if (poisoned(amax_bits))
    return zero_code;
  const float t = normalized(x, amax_bits);
  return stochastic ? stochastic_index(tb.value, t, rbits) : nearest_index(tb.sum_hi, tb.sum_lo, t);
}

// The stored absmax of a block from its bits: NaN for a poisoned block.
LOWBIT_HD LOWBIT_INLINE float stored_absmax(std::uint32_t amax_bits) {
  return poisoned(amax_bits) ? bit_cast<float>(0x7FC00000u) : bit_cast<float>(amax_bits);
}

// value * absmax; any NaN result is the positive quiet NaN (CPUs and GPUs make NaNs
// differently).
LOWBIT_HD LOWBIT_INLINE float decode(float value, float absmax) {
  const float y = value * absmax;
  return y != y ? bit_cast<float>(0x7FC00000u) : y;
}

// ---- SRAM-quantiles -----------------------------------------------------------------------------

// The IEEE total order on float bits as unsigned keys: -NaN < -Inf < ... < -0 < +0 < ... < +Inf
// < +NaN. Radix sort (GPU) and std::sort (CPU) of these keys give the same sequence.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t order_key(std::uint32_t bits) {
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t key_bits(std::uint32_t key) {
  return (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
}

// Position of quantile i of k in a sorted run of m values: floor((2i + 1) m / (2k)).
LOWBIT_HD LOWBIT_INLINE constexpr std::int64_t quantile_position(std::int64_t i, std::int64_t k,
                                                                 std::int64_t m) {
  return ((2 * i + 1) * m) / (2 * k);
}

} // namespace lowbit::kernels::blockwise_ops
