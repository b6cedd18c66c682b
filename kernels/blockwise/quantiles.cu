// CUDA kernels of SRAM-quantiles. Per-element results come from blockwise_ops.hpp (shared with
// the CPU twin); this file only organizes the work:
//
//   one thread block per chunk of 4096 values: cub::BlockRadixSort of the total-order keys
//   (512 threads x 8 keys), the chunk's k quantiles to a scratch table; then the two-level sum
//   of blockwise.hpp (one thread per group of quantile_group chunks and quantile, then one
//   thread per quantile), in double.
#include <cuda_runtime.h>

#include <cub/block/block_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "../cast/cast_ops.hpp"
#include "../common/cuda.hpp"
#include "blockwise_internal.hpp"
#include "blockwise_ops.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace ops = blockwise_ops;

// 512 threads x 8 keys, CUB's default 4-bit digits: 2 blocks per SM by registers. Other shapes
// trade shared-memory traffic per key against occupancy (docs/techniques/sram-quantiles.md).
constexpr int sort_threads = 512, sort_items = 8;
static_assert(sort_threads * sort_items == quantile_chunk);

// Low key bits the sort skips: a float16 value has at most 11 significant bits and a bfloat16
// value 8, so the low 13 (16) bits of the float32 from cast_ops::load are 0 (NaNs decode to the
// quiet NaN), and order_key keeps or inverts them with the sign. Keys equal on the other bits are
// then equal: 5 (4) radix passes instead of 8, the same sorted keys.
template <class In>
constexpr int key_skip_bits = 0;
template <>
constexpr int key_skip_bits<cast_ops::f16_bits> = 13;
template <>
constexpr int key_skip_bits<cast_ops::bf16_bits> = 16;

// One chunk per block at a time (grid-stride). The sort's output is the chunk's keys in order
// whatever arrangement they enter in, so the loads are striped (each warp reads consecutive
// elements) rather than blocked.
template <class In>
__global__ void __launch_bounds__(sort_threads)
    chunk_quantiles_kernel(const In* __restrict__ x, std::int64_t n, std::int64_t chunks,
                           std::int64_t k, float* __restrict__ part) {
  using sorter = cub::BlockRadixSort<std::uint32_t, sort_threads, sort_items>;
  __shared__ typename sorter::TempStorage temp;
  __shared__ std::uint32_t sorted[quantile_chunk];
  constexpr int skip = key_skip_bits<In>;
  // Padding: no smaller than any key of the type, and equal in full to any key that ties with it
  // on the sorted bits, so the m real keys fill positions 0..m-1 (the only ones read).
  constexpr std::uint32_t padding = 0xFFFFFFFFu << skip;
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const std::int64_t i0 = c * quantile_chunk;
    const std::int64_t m = min(n - i0, quantile_chunk);
    std::uint32_t keys[sort_items];
#pragma unroll
    for (int j = 0; j < sort_items; ++j) {
      const std::int64_t pos = static_cast<std::int64_t>(j) * sort_threads + threadIdx.x;
      keys[j] =
          pos < m
              ? ops::order_key(emu::detail::bit_cast<std::uint32_t>(cast_ops::load(x[i0 + pos])))
              : padding;
    }
    __syncthreads(); // temp and sorted may still be read for the previous chunk
    sorter(temp).Sort(keys, skip, 32);
#pragma unroll
    for (int j = 0; j < sort_items; ++j)
      sorted[threadIdx.x * sort_items + j] = keys[j];
    __syncthreads();
    for (std::int64_t q = threadIdx.x; q < k; q += sort_threads)
      part[c * k + q] =
          emu::detail::bit_cast<float>(ops::key_bits(sorted[ops::quantile_position(q, k, m)]));
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
  cast_ops::dispatch_input(p.x.type, [&](auto in_tag) {
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
