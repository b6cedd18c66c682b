// Per-element code of block-wise codebook quantization, shared by the CPU twin and the CUDA
// kernels: the codebook tables, normalization, the nearest-entry search, stochastic rounding
// between neighbours and dequantization. Every result bit comes from here.
#pragma once

#include <cmath>
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
// nearest_index is monotone in t, so every t in a bucket of float bit patterns has its nearest
// index between those of the bucket's two ends. Buckets: per sign, |t|'s bits clamped to
// [2^-32, 1] and cut after the top 6 mantissa bits: 32 binades of 64 buckets, the last (t = 1)
// one bucket, 2049 per sign; bucket j of |t| and sign bit s is u = 2 j + s. In bucket j > 0 of a
// sign, |t| differs only in the low 17 bits and grows with them; mirrored (low ^ 0x1FFFF) for
// negative t, the index grows with them. Bucket 0 holds every |t| below 2^-32 + 2^-38 (zeros
// included), whose low bits do not order it.
//
// A step entry serves a bucket > 0 whose two ends' indices differ by at most one (every such
// bucket of the built-in codebooks), and a bucket 0 whose ends agree: the smaller index i in bits
// 24-31 and 2^24 - h in bits 0-23, with h in [1, 2^17] the first mirrored low value at which the
// index is i + 1 (2^17: never). The index is then (entry + low) >> 24, one addition: the carry
// into bit 24 is the comparison low >= h. Bits 17-23 of a step entry are all ones. A walk entry
// (bit 23 clear) serves bucket 0 when its ends differ, and a bucket that spans more midpoints
// (entries that crowd): both ends' indices, and a walk over the midpoints between them, with the
// same exact comparison, ends where the binary search does. Either way the index is
// nearest_index(t). The table is 16 KiB.
inline constexpr std::uint32_t bucket_floor = 0x2F800000u;   // 2^-32
inline constexpr std::uint32_t bucket_ceiling = 0x3F800000u; // 1
inline constexpr std::uint32_t buckets_per_sign =
    ((bucket_ceiling - bucket_floor) >> 17) + 1; // 2049
inline constexpr std::uint32_t bucket_count = 2 * buckets_per_sign;
inline constexpr std::uint32_t bucket_never = 1u << 17;     // h: no step in the bucket
inline constexpr std::uint32_t bucket_step_flag = 1u << 23; // set in step entries

LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_step_entry(std::uint32_t index,
                                                                  std::uint32_t h) {
  return (index << 24) + ((1u << 24) - h);
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_walk_entry(std::uint32_t lo,
                                                                  std::uint32_t hi) {
  return lo | (hi << 8);
}

// t's bucket; any float bits (NaN, |t| > 1: the clamp keeps every bucket in the table).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_of(float t) {
  const auto b = bit_cast<std::uint32_t>(t);
  std::uint32_t m = b & 0x7FFFFFFFu;
  m = m < bucket_floor ? bucket_floor : m;
  m = m > bucket_ceiling ? bucket_ceiling : m;
  return (((m - bucket_floor) >> 17) << 1) | (b >> 31);
}

// base + 4 bucket_of(t) + bucket_bias for |t| <= 1 and base a multiple of 8 (32-bit wrapping
// arithmetic): the kernels' address of t's entry, with base the table's address less
// bucket_bias. In parts, which the kernels compute as they suit the GPU's pipes: t's sign as a
// mask (all ones for negative t), the high word of bits * one (one = 1, a multiply-add there);
// the base of t's sign, base - 4 * mask for one minus_4 = -4 (base + 4 for negative t: the signs'
// buckets interleave); and the entry's address from it (the low 17 bits cleared before the
// clamp).
inline constexpr std::uint32_t bucket_bias = bucket_floor >> 14;
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t sign_mask(std::uint32_t bits,
                                                          std::uint32_t one = 1) {
  return static_cast<std::uint32_t>((static_cast<std::int64_t>(static_cast<std::int32_t>(bits)) *
                                     static_cast<std::int32_t>(one)) >>
                                    32);
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t signed_base(std::uint32_t base, std::uint32_t mask,
                                                            std::uint32_t minus_4 = ~3u) {
  return base + mask * minus_4;
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t entry_address(std::uint32_t sbase,
                                                              std::uint32_t bits) {
  const std::uint32_t m = bits & 0x7FFE0000u;
  return sbase + ((m < bucket_floor ? bucket_floor : m) >> 14);
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_address(std::uint32_t base,
                                                               std::uint32_t bits) {
  return entry_address(signed_base(base, sign_mask(bits)), bits);
}

// The smallest and largest |t| bits of bucket u, and its sign bit.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_sign(std::uint32_t u) {
  return (u & 1u) << 31;
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_first(std::uint32_t u) {
  const std::uint32_t j = u >> 1;
  return j == 0 ? 0u : bucket_floor + (j << 17);
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_last(std::uint32_t u) {
  return bucket_floor + ((u >> 1) << 17) + 0x1FFFFu;
}

// The low 17 bits of t, mirrored for negative t (given t's sign_mask).
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_low(std::uint32_t bits, std::uint32_t mask) {
  return (bits ^ mask) & 0x1FFFFu;
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t bucket_low(std::uint32_t bits) {
  return bucket_low(bits, sign_mask(bits));
}

// Table entry of bucket u (above).
LOWBIT_HD inline std::uint32_t bucket_entry(const float* sum_hi, const float* sum_lo,
                                            std::uint32_t u) {
  const std::uint32_t sign = bucket_sign(u), first = bucket_first(u);
  const auto index_of = [&](std::uint32_t abs_bits) {
    return nearest_index(sum_hi, sum_lo, bit_cast<float>(sign | abs_bits));
  };
  const std::uint32_t i0 = index_of(first), i1 = index_of(bucket_last(u));
  if (i0 == i1)
    return bucket_step_entry(i0, bucket_never);
  const std::uint32_t lo = i0 < i1 ? i0 : i1, hi = i0 < i1 ? i1 : i0; // negative: reversed
  if (hi - lo > 1 || first == 0)
    return bucket_walk_entry(lo, hi);
  // Inside the bucket the index is lo + (t above midpoint lo): nearest_index counts the
  // midpoints below t, all those before lo are below both ends, none after lo above either. So
  // the index is i0 where that comparison says as much as it does at `first`: false for
  // positive t (i0 = lo), true for negative t.
  const float mid_hi = sum_hi[lo], mid_lo = sum_lo[lo];
  const auto stays = [&](std::uint32_t low) { // index_of(first | low) == i0
    const float t = bit_cast<float>(sign | first | low);
    return above(t + t, mid_hi, mid_lo) == (i0 > i1);
  };
  std::uint32_t below = 0, at = 0x1FFFFu; // stays(below), !stays(at)
  while (at - below > 1) {
    const std::uint32_t mid = below + (at - below) / 2;
    (stays(mid) ? below : at) = mid;
  }
  // Raw low bits >= at step away from i0; mirrored, those below `at` reach the larger index.
  return bucket_step_entry(lo, i0 < i1 ? at : bucket_never - at);
}

// Pair tables: two step words per bucket, for codebooks whose index steps at most twice inside a
// bucket (the unsigned dynamic map steps twice in 8 buckets of [0.5, 1), where its entries lie
// 2^-7 apart and a bucket spans 2^-7), so that no bucket needs the bucket table's walk. Bucket
// u's pair is e0 = bucket_step_entry(i, h1) and e1 = bucket_step_entry(0, h2): the index of t is
// pair_index(e0, e1, bucket_low(t)), the bucket's first index i plus one for each step h <= low
// (h = bucket_never: none). A table of the nonnegative buckets alone (u = 2j), 8 bytes each, is
// addressed as the bucket table is, entry_address(base, bits) for t >= +0 with base the table's
// address less bucket_bias.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t pair_index(std::uint32_t e0, std::uint32_t e1,
                                                           std::uint32_t low) {
  return ((e0 + low) >> 24) + ((e1 + low) >> 24);
}

// Bucket u's pair (e[0], e[1]); false where its index steps more than twice. In a bucket j >= 1
// of |t| bits [first, first + 0x1FFFF] the index is nondecreasing in t's bucket_low (mirrored for
// negative t), so each step is the least low reaching the next index (binary searches of
// nearest_index itself). Bucket 0 also takes every |t| below the floor, whatever its low bits: it
// gets a pair only where one index holds from 0 to its last value. Host code (17 evaluations of
// nearest_index per step).
inline bool bucket_pair(const float* sum_hi, const float* sum_lo, std::uint32_t u,
                        std::uint32_t (&e)[2]) {
  const std::uint32_t sign = bucket_sign(u), first = bucket_first(u);
  const auto index_at = [&](std::uint32_t low) { // low: bucket_low of the t it stands for
    const std::uint32_t raw = sign != 0 ? low ^ 0x1FFFFu : low;
    return nearest_index(sum_hi, sum_lo, bit_cast<float>(sign | first | raw));
  };
  if (first == 0) {
    const std::uint32_t i = nearest_index(sum_hi, sum_lo, bit_cast<float>(sign));
    if (nearest_index(sum_hi, sum_lo, bit_cast<float>(sign | bucket_last(u))) != i)
      return false;
    e[0] = bucket_step_entry(i, bucket_never);
    e[1] = bucket_step_entry(0, bucket_never);
    return true;
  }
  const std::uint32_t i = index_at(0), top = index_at(0x1FFFFu);
  if (top - i > 2)
    return false;
  const auto least_reaching = [&](std::uint32_t target) { // index_at(low) >= target
    if (top < target)
      return bucket_never;
    std::uint32_t below = 0, at = 0x1FFFFu; // index_at(below) < target <= index_at(at)
    while (at - below > 1) {
      const std::uint32_t mid = below + (at - below) / 2;
      (index_at(mid) >= target ? at : below) = mid;
    }
    return at;
  };
  e[0] = bucket_step_entry(i, least_reaching(i + 1));
  e[1] = bucket_step_entry(0, least_reaching(i + 2));
  return true;
}

// The index from a step entry e and t's bits, in bits 24-31 of the word (the kernels store that
// byte) and in the low byte.
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t
step_bucket_word(std::uint32_t e, std::uint32_t bits, std::uint32_t mask) {
  return e + bucket_low(bits, mask);
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t step_bucket_word(std::uint32_t e,
                                                                 std::uint32_t bits) {
  return step_bucket_word(e, bits, sign_mask(bits));
}
LOWBIT_HD LOWBIT_INLINE constexpr std::uint32_t nearest_in_step_bucket(std::uint32_t e,
                                                                       std::uint32_t bits) {
  return step_bucket_word(e, bits) >> 24;
}

// nearest_index(t) for |t| <= 1 (not NaN), from the entry e of t's bucket.
LOWBIT_HD LOWBIT_INLINE std::uint32_t nearest_in_bucket(std::uint32_t e, const float* sum_hi,
                                                        const float* sum_lo, float t) {
  if ((e & bucket_step_flag) != 0)
    return nearest_in_step_bucket(e, bit_cast<std::uint32_t>(t));
  std::uint32_t idx = e & 0xFFu;
  const std::uint32_t hi = (e >> 8) & 0xFFu;
  const float t2 = t + t;
  while (idx < hi && above(t2, sum_hi[idx], sum_lo[idx]))
    ++idx;
  return idx;
}

// Whether the codebook's bucket table holds no walks and both buckets 0 one index (that of
// zero), judged conservatively from the midpoints: each midpoint, known within one ulp of
// sum_hi / 2 and widened here to two ulps on either side, marks the buckets it may fall in (of
// its sign, a run); no bucket marked twice and no bucket 0 marked means every bucket steps at
// most once (the index changes only across midpoints) and no |t| below the floor changes the
// index. The midpoints are sorted, so their runs are ordered too: a bucket marked twice is
// marked by two consecutive midpoints of one sign, and only those are compared. A false answer
// only selects the kernels that also handle walks and tiny t exactly. Host code, called once per
// quantize call (a few hundred operations).
inline bool simple_buckets(const tables& tb) {
  std::uint32_t run_first[2] = {}, run_last[2] = {}; // per sign, the last run (0: none yet)
  for (int j = 0; j < 255; ++j) {
    const std::uint32_t mb = bit_cast<std::uint32_t>(tb.sum_hi[j] * 0.5f);
    const std::uint32_t mag = mb & 0x7FFFFFFFu, sign = mb & 0x80000000u;
    if (mag <= 2u)
      return false; // two ulps reach zero: bucket 0
    const std::uint32_t first = bucket_of(bit_cast<float>(sign | (mag - 2u)));
    const std::uint32_t last = bucket_of(bit_cast<float>(sign | (mag + 2u)));
    const int s = sign != 0 ? 1 : 0;
    if (first < 2u)
      return false;
    if (run_last[s] != 0 &&
        (first > run_first[s] ? first : run_first[s]) <= (last < run_last[s] ? last : run_last[s]))
      return false;
    run_first[s] = first;
    run_last[s] = last;
  }
  return true;
}

// nearest_index(t) for |t| <= 1 (not NaN), from the bucket table.
LOWBIT_HD LOWBIT_INLINE std::uint32_t nearest_by_buckets(const std::uint32_t* buckets,
                                                         const float* sum_hi, const float* sum_lo,
                                                         float t) {
  return nearest_in_bucket(buckets[bucket_of(t)], sum_hi, sum_lo, t);
}

// x / a for the elements x of one block (|x| <= a, a > 0 finite), bit for bit the correctly
// rounded division, with the reciprocal computed once per block: q0 = x * y with y = RN(1/a),
// then two corrections q += (x - a*q) * y by fused multiply-adds. The first leaves q within one
// ulp of x / a (y is within half an ulp of 1/a); the remainder x - a*q is then exact, and the
// second correction rounds correctly (Markstein's theorem for a correctly rounded reciprocal).
// The argument needs every quantity in the normal range: a in [2^-100, 2^100], and
// |x| >= max(2^-79, a * 2^-100), which keeps |x / a| >= 2^-100 and the products' grids above
// the subnormals. Other blocks, and smaller nonzero x, divide. Zeros keep their sign.
// `blockwise_codebook.block_divisor_equals_division` checks it against the division.
struct block_divisor {
  float a, y;
  std::uint32_t small_bits; // nonzero |x| bits below this divide (0xFFFFFFFF: all of them)
  LOWBIT_HD LOWBIT_INLINE static block_divisor make(float a) {
    const std::uint32_t ab = bit_cast<std::uint32_t>(a);
    const bool fast = ab >= (27u << 23) && ab <= (227u << 23); // 2^-100 <= a <= 2^100
    std::uint32_t small = 48u << 23;                           // 2^-79
    if (ab >= (148u << 23))                                    // a >= 2^21: a * 2^-100 > 2^-79
      small = ab - (100u << 23);
    return {a, 1.0f / a, fast ? small : 0xFFFFFFFFu};
  }
  LOWBIT_HD LOWBIT_INLINE float operator()(float x) const {
    const std::uint32_t xb = bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
    if (xb - 1u < small_bits - 1u) // 0 < xb < small_bits in one comparison
      return x / a;
    const float q0 = x * y;
    const float q1 = fma_rn(fma_rn(-a, q0, x), y, q0);
    const float q2 = fma_rn(fma_rn(-a, q1, x), y, q1);
    return xb == 0 ? x : q2;
  }
  LOWBIT_HD LOWBIT_INLINE static float fma_rn(float p, float q, float r) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(p, q, r);
#else
    return std::fma(p, q, r);
#endif
  }
};

// t = x / a for the elements x of one block (|x| <= a, a > 0 finite), as the CUDA kernels of
// codebooks with simple_buckets compute it, without a branch: x and a scaled by the same power of
// two s so that a' = a s lies in [1, 2) (s = 2^-e for a = 1.m 2^e normal; for subnormal a,
// s = 2^127 and a' in [2^-22, 1)); the reciprocal of a' as an unevaluated pair y + y_lo with
// y = RN(1/a') and y_lo = RN((1 - a' y) y), within about 2^-46 of 1/a' relatively; then
// q0 = RN(xs y + RN(xs y_lo)), within 2^-46 relatively of xs / a' before its own rounding, so
// faithful (within one ulp of the quotient); and one correction q = RN(q0 + r y) with the
// remainder r = xs - a' q0, exact by a fused multiply-add, which rounds correctly (Markstein's
// theorem for a correctly rounded reciprocal and a faithful quotient). Where |x s| >= 2^-79 the
// result is the correctly rounded x / a (no product falls into the subnormals, and the scaling
// is exact for |x s| >= 2^-126). Below, the result is below 2^-57 in magnitude, as x / a is:
// both fall in a bucket 0, whose index simple_buckets has shown to be that of zero for either
// sign.
//
// Where a lies in [2^-60, 2^61) (`folded`, every block of ordinary data), the same quotient
// takes four operations instead of five: s folded into the reciprocal's terms, ys = y s and
// ys_lo = y_lo s (ys normal, so exact; ys_lo rounded only where it is below 2^-126, which moves
// q0 by less than 2^-89 of the quotient), x unscaled: q0 = RN(x ys + RN(x ys_lo)), faithful as
// above; the remainder r = RN(x - a q0), exact where |q0| >= 2^-43 (its grid, ulp(a) ulp(q0), is
// then at least 2^-149, and it needs 24 bits of it at most); and q = RN(q0 + r ys), the very
// correction above (r ys = r' y for the scaled remainder r' = r s). So for |x / a| >= 2^-42 the
// result is again the correctly rounded x / a; below, it is below 2^-40 in magnitude: a bucket 0.
// The kernels take the folded form for the blocks where it holds and the scaled one for the
// others; operator() chooses the same way.
// `blockwise_codebook.scaled_divisor_buckets_equal_division` checks both.
struct scaled_divisor {
  float s, a, y, y_lo; // the scaled form: a = a s here
  float a0, ys, ys_lo; // the folded form: a, y s, y_lo s
  bool folded;
  LOWBIT_HD LOWBIT_INLINE static scaled_divisor make(float a) {
    // s = 2^(127 - field) for a's exponent field (a > 0 finite): 2^127 for subnormal a (field 0),
    // 2^126 down to 2^-126, and 2^-127 (a subnormal float, exact) for field 254, the clamp.
    const std::uint32_t field_bits = bit_cast<std::uint32_t>(a) & 0x7F800000u;
    const std::uint32_t s_bits = (254u << 23) - field_bits;
    const float s = bit_cast<float>(s_bits < 0x00400000u ? 0x00400000u : s_bits);
    const float as = a * s; // in [1, 2), or [2^-22, 1) for subnormal a
    const float y = reciprocal(as);
    const float y_lo = block_divisor::fma_rn(-as, y, 1.0f) * y;
    const bool folded = field_bits >= (67u << 23) && field_bits <= (187u << 23);
    return {s, as, y, y_lo, a, y * s, y_lo * s, folded};
  }
  LOWBIT_HD LOWBIT_INLINE float scaled(float x) const {
    const float xs = x * s;
    const float q0 = block_divisor::fma_rn(xs, y, xs * y_lo);
    return block_divisor::fma_rn(block_divisor::fma_rn(-a, q0, xs), y, q0);
  }
  LOWBIT_HD LOWBIT_INLINE float folded_quotient(float x) const {
    const float q0 = block_divisor::fma_rn(x, ys, x * ys_lo);
    return block_divisor::fma_rn(block_divisor::fma_rn(-a0, q0, x), ys, q0);
  }
  LOWBIT_HD LOWBIT_INLINE float operator()(float x) const {
    return folded ? folded_quotient(x) : scaled(x);
  }
  // RN(1 / v) for v in [2^-22, 2): the division on the host; on the GPU the hardware
  // approximation and one Newton step, the fast path of the compiler's correctly rounded
  // reciprocal without its test for arguments out of range (none is here).
  // `gpu_exhaustive.scaled_divisor_reciprocal_is_correctly_rounded` compares every such v.
  LOWBIT_HD LOWBIT_INLINE static float reciprocal(float v) {
#if defined(__CUDA_ARCH__)
    float y0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(v));
    return __fmaf_rn(y0, __fmaf_rn(-v, y0, 1.0f), y0);
#else
    return 1.0f / v;
#endif
  }
};

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

// encode's nearest entry through the codebook's bucket table (bucket_entry of every bucket), which
// gives nearest_index's entry for every |t| <= 1 in one read instead of eight dependent steps:
// the CPU twins' search (t of an unpoisoned block is finite with |t| <= 1).
LOWBIT_HD LOWBIT_INLINE std::uint32_t encode_nearest(const tables& tb, const std::uint32_t* buckets,
                                                     float x, std::uint32_t amax_bits,
                                                     std::uint32_t zero_code) {
  if (poisoned(amax_bits))
    return zero_code;
  return nearest_by_buckets(buckets, tb.sum_hi, tb.sum_lo, normalized(x, amax_bits));
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
