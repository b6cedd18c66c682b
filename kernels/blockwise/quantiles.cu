// CUDA kernels of SRAM-quantiles. Per-element results come from blockwise_ops.hpp (shared with
// the CPU twin); this file only organizes the work:
//
//   one thread block per chunk of 4096 values (the block's next chunk copied into shared memory
//   while this one sorts): an LSD radix sort of the total-order keys in shared memory (256
//   threads x 16 keys, digits of up to 8 bits ranked by cub::BlockRadixRankMatchEarlyCounts:
//   float32 keys sorted on their high 24 bits in 3 passes, each quantile then selected within
//   its run of keys tied on those bits; 3 passes for float16, 2 for bfloat16), the chunk's k
//   quantiles written to a scratch table; then the two-level
//   sum of blockwise.hpp (one thread per group of quantile_group chunks and quantile, then one
//   thread per quantile), in double.
#include <cuda_runtime.h>

#include <cub/block/block_radix_rank.cuh>
#include <cub/block/radix_rank_sort_operations.cuh>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../common/async_copy.cuh"
#include "../common/cuda.hpp"
#include "../common/element_ops.hpp"
#include "blockwise_internal.hpp"
#include "blockwise_ops.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace ops = blockwise_ops;

// 256 threads x 16 keys, digits of up to 8 bits: 64 registers (sm_90), so 4 blocks (32 warps)
// per SM. Shapes and their trade-offs: docs/techniques/sram-quantiles.md.
constexpr int sort_threads = 256, sort_items = 16, sort_max_bits = 8;
static_assert(sort_threads * sort_items == quantile_chunk);
static_assert(sort_threads % 32 == 0);

// Low key bits the sort skips: a float16 value has at most 11 significant bits and a bfloat16
// value 8, so the low 13 (16) bits of the float32 from element_ops::load are 0 (NaNs decode to the
// quiet NaN), and order_key keeps or inverts them with the sign. Keys equal on the other bits are
// then equal: 3 (2) radix passes instead of 4, the same sorted keys.
template <class In> constexpr int key_skip_bits = 0;
template <> constexpr int key_skip_bits<element_ops::f16_bits> = 13;
template <> constexpr int key_skip_bits<element_ops::bf16_bits> = 16;

// The sorted bits [skip, 32) split into the fewest passes of at most sort_max_bits, as evenly as
// possible, wider passes first (float32: 8 8 8 8; float16: 7 6 6; bfloat16: 8 8): the ballots
// per key equal the sorted bits however they are split, and the even split has the fewest digit
// counters to clear and scan.
template <int Skip> struct radix_plan {
  static constexpr int total = 32 - Skip;
  static constexpr int passes = (total + sort_max_bits - 1) / sort_max_bits;
  static constexpr int bits(int p) { return total / passes + (p < total % passes ? 1 : 0); }
  static constexpr int start(int p) { return p == 0 ? Skip : start(p - 1) + bits(p - 1); }
};
static_assert(radix_plan<0>::passes == 4 && radix_plan<13>::passes == 3 &&
              radix_plan<16>::passes == 2);
static_assert(radix_plan<13>::start(2) + radix_plan<13>::bits(2) == 32);

// The ranker of cub's onesweep sort, with its sm_90 settings: per warp, a histogram of the digits
// (shared-memory atomics, rank_parts copies), a block-wide scan of the counts, then each key's
// rank from its warp's running offset and its peers of equal digit (ballots over the digit bits).
// Tuning knobs for the GPU: WARP_MATCH_ATOMIC_OR instead of the ballots, rank_parts = 2 against
// atomic conflicts on skewed digits (the high byte of float keys); results do not change.
constexpr cub::WarpMatchAlgorithm rank_match = cub::WARP_MATCH_ANY;
constexpr int rank_parts = 1;
template <int Bits>
using ranker =
    cub::BlockRadixRankMatchEarlyCounts<sort_threads, Bits, false, cub::BLOCK_SCAN_WARP_SCANS,
                                        rank_match, rank_parts>;
// Raw shared storage for every pass's ranker: the widest digit needs the most.
struct alignas(16) rank_storage {
  unsigned char bytes[sizeof(typename ranker<sort_max_bits>::TempStorage)];
};

// One LSD pass over digit [Start, Start + Bits): rank the keys (stable in the order the ranker
// takes them: warp by warp, within a warp key j of every lane before key j + 1, lanes in order),
// scatter them to their ranks in `sorted`; unless Last, read them back in that same order
// (key j of lane l of warp w is sorted[w * 32 * sort_items + j * 32 + l]), so that the next pass
// keeps this pass's order among keys with equal next digits. After the last pass `sorted` holds
// the chunk's keys in order.
template <int Start, int Bits, bool Last>
__device__ __forceinline__ void radix_pass(std::uint32_t (&keys)[sort_items], rank_storage& storage,
                                           std::uint32_t* sorted) {
  using rank_t = ranker<Bits>;
  static_assert(sizeof(typename rank_t::TempStorage) <= sizeof(rank_storage) &&
                alignof(typename rank_t::TempStorage) <= alignof(rank_storage));
  int ranks[sort_items];
  rank_t(reinterpret_cast<typename rank_t::TempStorage&>(storage))
      .RankKeys(keys, ranks, cub::BFEDigitExtractor<std::uint32_t>(Start, Bits));
  // No barrier needed before the scatter: RankKeys synchronizes the block after every thread has
  // entered it, hence after every read-back of the previous pass.
#pragma unroll
  for (int j = 0; j < sort_items; ++j)
    sorted[ranks[j]] = keys[j];
  // All scattered; and every thread is done reading the ranker's counters before the next
  // RankKeys clears them.
  __syncthreads();
  if constexpr (!Last) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const std::uint32_t* row = sorted + warp * 32 * sort_items + lane;
#pragma unroll
    for (int j = 0; j < sort_items; ++j)
      keys[j] = row[j * 32];
  }
}

// The passes of radix_plan<Skip> from `first` on (a block-uniform count of low passes skipped).
template <int Skip, int... P>
__device__ __forceinline__ void radix_sort(std::uint32_t (&keys)[sort_items], rank_storage& storage,
                                           std::uint32_t* sorted, int first,
                                           std::integer_sequence<int, P...>) {
  using plan = radix_plan<Skip>;
  ((P >= first
        ? radix_pass<plan::start(P), plan::bits(P), P + 1 == plan::passes>(keys, storage, sorted)
        : void()),
   ...);
}

// float32 keys are sorted on their high 24 bits only (three passes instead of four): a chunk's
// quantile at position pos is then the (pos - lo)-th smallest key, by all 32 bits, of the run
// [lo, hi) of keys equal on the high 24 bits around pos, the keys the full sort would place at
// lo..hi-1. Most runs are one key long; runs of up to 8 keys are resolved by counting. Longer
// runs are mostly one key repeated (a bit mask, made only for chunks that have such runs, marks
// where neighbours tie on the high bits but differ); a longer mixed run of up to
// coarse_run_limit keys is resolved by counting, and a chunk with a mixed run beyond that
// (values crowded into a 2^-15 relative range) is sorted again in full. 16-bit inputs have few
// low bits to drop; they sort in full.
template <class In>
constexpr int coarse_passes = std::is_same_v<In, float> ? 1 : 0; // low passes left out
constexpr int coarse_run_limit = 64;

// The first index in [a, b) whose key, shifted right by `shift`, is not below c (`strict`: above
// c): sorted[] is ordered on the shifted keys.
__device__ __forceinline__ int run_bound(const std::uint32_t* sorted, int a, int b, int shift,
                                         std::uint32_t c, bool strict) {
  while (a < b) {
    const int mid = (a + b) / 2;
    const std::uint32_t v = sorted[mid] >> shift;
    if (v < c || (strict && v == c))
      a = mid + 1;
    else
      b = mid;
  }
  return a;
}

// The run [lo, hi) around `pos` of keys equal on the sorted bits (key >> shift) in a coarsely
// sorted chunk: its ends looked for next to pos, then by binary search.
__device__ __forceinline__ void tied_run(const std::uint32_t* sorted, int pos, int shift, int& lo,
                                         int& hi) {
  const std::uint32_t c = sorted[pos] >> shift;
  constexpr int scan = 4;
  lo = pos;
  hi = pos + 1;
  while (lo > 0 && pos - lo < scan && (sorted[lo - 1] >> shift) == c)
    --lo;
  if (lo > 0 && (sorted[lo - 1] >> shift) == c)
    lo = run_bound(sorted, 0, lo, shift, c, false);
  while (hi < quantile_chunk && hi - pos <= scan && (sorted[hi] >> shift) == c)
    ++hi;
  if (hi < quantile_chunk && (sorted[hi] >> shift) == c)
    hi = run_bound(sorted, hi, quantile_chunk, shift, c, true);
}

// The r-th smallest key (by all bits) of sorted[lo, hi), by counting.
__device__ __forceinline__ std::uint32_t rank_in_run(const std::uint32_t* sorted, int lo, int hi,
                                                     int r) {
  for (int a = lo; a < hi; ++a) {
    const std::uint32_t e = sorted[a];
    int below = 0, upto = 0;
    for (int b = lo; b < hi; ++b) {
      below += sorted[b] < e;
      upto += sorted[b] <= e;
    }
    if (below <= r && r < upto)
      return e;
  }
  return sorted[lo + r]; // not reached: some key of the run has rank r
}

// Whether no neighbours in (lo, hi) differ, by the mask of mixed ties (bit p: sorted[p] ties
// sorted[p - 1] on the sorted bits and differs from it): then every key of the run is the same.
__device__ __forceinline__ bool pure_run(const std::uint32_t* mixed, int lo, int hi) {
  bool pure = true;
  for (int p = lo + 1; p < hi && pure; p = (p | 31) + 1) {
    const int span = min(hi - p, 32 - (p & 31));
    const std::uint32_t bits = mixed[p >> 5] >> (p & 31);
    pure = (span == 32 ? bits : bits & ((1u << span) - 1u)) == 0;
  }
  return pure;
}

// One chunk per block at a time (grid-stride). The sort's output is the chunk's keys in order
// whatever arrangement they enter in (the first pass needs no particular order), so the loads
// are striped (each warp reads consecutive elements) rather than blocked.
template <class In>
__global__ void __launch_bounds__(sort_threads, 4)
    chunk_quantiles_kernel(const In* __restrict__ x, std::int64_t n, std::int64_t chunks,
                           std::int64_t k, float* __restrict__ part) {
  __shared__ rank_storage storage;
  __shared__ std::uint32_t sorted[quantile_chunk];
  constexpr int skip = key_skip_bits<In>;
  // Padding: no smaller than any key of the type, and equal in full to any key that ties with it
  // on the sorted bits, so the m real keys fill positions 0..m-1 (the only ones read).
  constexpr std::uint32_t padding = 0xFFFFFFFFu << skip;
  using plan = radix_plan<skip>;
  constexpr int coarse = plan::start(coarse_passes<In>); // the bits a coarse sort orders on
  __shared__ std::uint32_t mixed[quantile_chunk / 32];   // bit p: sorted[p] ties sorted[p - 1]
                                                         // on those bits, and differs
  // The block's next full chunk, copied while this one sorts (16-byte pieces; each thread reads
  // back only the pieces it copied, so no barrier is needed). Chunks hold their keys in any
  // arrangement: the sort's result does not depend on it.
  constexpr int per_piece = 16 / static_cast<int>(sizeof(In));
  constexpr int pieces = sort_items / per_piece; // per thread
  __shared__ __align__(16) vec<In, per_piece> ahead[sort_threads * pieces];
  const bool aligned = reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  const auto prefetched = [&](std::int64_t c) {
    return aligned && c < chunks && (c + 1) * quantile_chunk <= n;
  };
  const auto prefetch = [&](std::int64_t c) {
    if (prefetched(c)) {
      const auto* src = reinterpret_cast<const vec<In, per_piece>*>(x + c * quantile_chunk);
#pragma unroll
      for (int p = 0; p < pieces; ++p)
        copy_async<16>(&ahead[p * sort_threads + threadIdx.x],
                       src + p * sort_threads + threadIdx.x);
    }
    copy_commit();
  };
  prefetch(blockIdx.x);
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int m = static_cast<int>(min(n - c * quantile_chunk, quantile_chunk)); // values here
    // A coarse sort first where the type has one; the full sort after a mixed run too long to
    // resolve (one sort in the code, so that its registers serve both).
    for (int first = coarse_passes<In>;; first = 0) {
      std::uint32_t keys[sort_items];
      if (first == coarse_passes<In> && prefetched(c)) { // this chunk's copy, then the next's
        copy_wait(0);
#pragma unroll
        for (int p = 0; p < pieces; ++p) {
          const vec<In, per_piece> w = ahead[p * sort_threads + threadIdx.x];
#pragma unroll
          for (int e = 0; e < per_piece; ++e)
            keys[p * per_piece + e] =
                ops::order_key(emu::detail::bit_cast<std::uint32_t>(element_ops::load(w.v[e])));
        }
        prefetch(c + gridDim.x);
      } else {
        if (first == coarse_passes<In>)
          prefetch(c + gridDim.x);
#pragma unroll
        for (int j = 0; j < sort_items; ++j) {
          const std::int64_t pos = static_cast<std::int64_t>(j) * sort_threads + threadIdx.x;
          keys[j] = pos < m ? ops::order_key(emu::detail::bit_cast<std::uint32_t>(
                                  element_ops::load(x[c * quantile_chunk + pos])))
                            : padding;
        }
      }
      // No barrier: the first RankKeys synchronizes the block before any scatter to `sorted`,
      // hence after every read of it for the previous chunk (or sort).
      radix_sort<skip>(keys, storage, sorted, first,
                       std::make_integer_sequence<int, plan::passes>{});
      if (first == 0) {
        for (std::int64_t q = threadIdx.x; q < k; q += sort_threads)
          part[c * k + q] =
              emu::detail::bit_cast<float>(ops::key_bits(sorted[ops::quantile_position(q, k, m)]));
        break;
      }
      // Runs of up to short_run keys (nearly all of them) by counting, at once; longer ones
      // after the block marked its mixed ties, only when some quantile has one.
      constexpr int short_run = 8;
      const auto write = [&](std::int64_t q, std::uint32_t key) {
        part[c * k + q] = emu::detail::bit_cast<float>(ops::key_bits(key));
      };
      bool long_run = false, unresolved = false;
      for (std::int64_t q = threadIdx.x; q < k; q += sort_threads) {
        const int pos = static_cast<int>(ops::quantile_position(q, k, m));
        int lo, hi;
        tied_run(sorted, pos, coarse, lo, hi);
        if (hi - lo <= short_run)
          write(q, hi - lo == 1 ? sorted[pos] : rank_in_run(sorted, lo, hi, pos - lo));
        else
          long_run = true;
      }
      if (__syncthreads_or(long_run)) { // block-uniform
        const unsigned lane = threadIdx.x % 32;
#pragma unroll
        for (int j = 0; j < sort_items; ++j) { // consecutive positions per warp: a word a ballot
          const int p = j * sort_threads + static_cast<int>(threadIdx.x);
          const bool mix = p > 0 && (sorted[p] >> coarse) == (sorted[p - 1] >> coarse) &&
                           sorted[p] != sorted[p - 1];
          const std::uint32_t word = __ballot_sync(0xFFFFFFFFu, mix);
          if (lane == 0)
            mixed[p >> 5] = word;
        }
        __syncthreads();
        for (std::int64_t q = threadIdx.x; q < k; q += sort_threads) {
          const int pos = static_cast<int>(ops::quantile_position(q, k, m));
          int lo, hi;
          tied_run(sorted, pos, coarse, lo, hi);
          if (hi - lo <= short_run)
            continue;
          if (pure_run(mixed, lo, hi))
            write(q, sorted[pos]);
          else if (hi - lo <= coarse_run_limit)
            write(q, rank_in_run(sorted, lo, hi, pos - lo));
          else
            unresolved = true;
        }
      }
      // Block-uniform; every read of sorted[] and mixed[] is done past this barrier.
      if (!__syncthreads_or(unresolved))
        break;
    }
  }
}

// The first level of the definition's order (blockwise.hpp): thread (g, q) sums m_c * Q_q(c)
// (exact products) over the chunks of group g, in chunk order, into sums[g * k + q].
// Consecutive threads take consecutive quantiles, so each chunk's row is read coalesced.
__global__ void group_sums_kernel(const float* __restrict__ part, std::int64_t n,
                                  std::int64_t chunks, std::int64_t k, std::int64_t groups,
                                  double* __restrict__ sums) {
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < groups * k; t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t g = t / k, q = t - g * k;
    const std::int64_t c0 = g * quantile_group, c1 = min(chunks, c0 + quantile_group);
    double acc = 0.0;
#pragma unroll 8
    for (std::int64_t c = c0; c < c1; ++c) {
      const double m = static_cast<double>(min(n - c * quantile_chunk, quantile_chunk));
      acc = __dadd_rn(acc, __dmul_rn(m, static_cast<double>(__ldg(part + c * k + q))));
    }
    sums[t] = acc;
  }
}

// The second level: estimate q = (group sums added in group order) / n.
__global__ void total_sums_kernel(const double* __restrict__ sums, std::int64_t n,
                                  std::int64_t groups, std::int64_t k, float* __restrict__ out) {
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < k;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (std::int64_t g = 0; g < groups; ++g)
      acc = __dadd_rn(acc, sums[g * k + q]);
    out[q] = __double2float_rn(__ddiv_rn(acc, static_cast<double>(n)));
  }
}

} // namespace

void estimate_quantiles(const quantile_problem& p, const exec& ex) {
  const cudaStream_t stream = stream_of(ex);
  scratch part(sizeof(float) * static_cast<std::size_t>(p.chunks * p.k), stream);
  element_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>) {
      // Exactly one wave of resident blocks, each looping over chunks: no partial last wave,
      // whatever the kernel's occupancy.
      int per_sm = 0;
      LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, chunk_quantiles_kernel<In>, sort_threads, 0));
      const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(
          p.chunks, static_cast<std::int64_t>(sm_count()) * std::max(per_sm, 1)));
      chunk_quantiles_kernel<<<grid, sort_threads, 0, stream>>>(p.x.ptr<const In>(), p.n, p.chunks,
                                                                p.k, part.as<float>());
      check_launch("chunk_quantiles_kernel");
    }
  });
  const std::int64_t groups = (p.chunks + quantile_group - 1) / quantile_group;
  scratch sums(sizeof(double) * static_cast<std::size_t>(groups * p.k), stream);
  group_sums_kernel<<<grid_for(groups * p.k, 256), 256, 0, stream>>>(
      part.as<const float>(), p.n, p.chunks, p.k, groups, sums.as<double>());
  check_launch("group_sums_kernel");
  total_sums_kernel<<<grid_for(p.k, 256), 256, 0, stream>>>(sums.as<const double>(), p.n, groups,
                                                            p.k, p.out.ptr<float>());
  check_launch("total_sums_kernel");
}

} // namespace lowbit::kernels::cuda
