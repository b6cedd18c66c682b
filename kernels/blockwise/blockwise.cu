// CUDA kernels of block-wise codebook quantization and SRAM-quantiles. Per-element results come
// from blockwise_ops.hpp (shared with the CPU twin); this file only organizes the work:
//
//   quantize   : one thread block per quantization block at a time (grid-stride over blocks),
//                min(block, 256) threads; the codebook tables live in shared memory; amax by a
//                block max (exact, order-free), then every element's code. Nested: the same
//                kernel runs again over the float absmax values (blocks of 256).
//   dequantize : one thread per element, the codebook(s) in shared memory.
//   quantiles  : one thread block per chunk of 4096 values: cub::BlockRadixSort of the
//                total-order keys (512 threads x 8 keys), the chunk's k quantiles to a scratch
//                table; then one thread per quantile sums the chunks in chunk order, in double.
#include <cuda_runtime.h>

#include <cub/block/block_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "../cast/cast_ops.hpp"
#include "../common/cuda_map.cuh"
#include "blockwise_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace ops = blockwise_ops;

struct codebook_values {
  float v[256];
};

template <class In>
__global__ void __launch_bounds__(256)
    quantize_kernel(const In* __restrict__ x, std::int64_t n, std::int64_t block,
                    std::int64_t blocks, std::uint8_t* __restrict__ codes,
                    float* __restrict__ absmax, ops::tables tb_in, std::uint32_t zero_code,
                    bool stochastic, emu::random_stream rng) {
  __shared__ ops::tables tb;
  for (int j = threadIdx.x; j < 256; j += blockDim.x)
    tb.value[j] = tb_in.value[j];
  for (int j = threadIdx.x; j < 255; j += blockDim.x) {
    tb.sum_hi[j] = tb_in.sum_hi[j];
    tb.sum_lo[j] = tb_in.sum_lo[j];
  }
  __syncthreads();
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::int64_t i0 = b * block, i1 = min(n, i0 + block);
    std::uint32_t m = 0;
    for (std::int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
      m = max(m, ops::abs_bits(cast_ops::load(x[i])));
    m = block_max(m);
    if (threadIdx.x == 0)
      absmax[b] = ops::stored_absmax(m);
    for (std::int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
      const std::uint32_t rb = stochastic ? rng.bits(static_cast<std::uint64_t>(i)) : 0u;
      codes[i] = static_cast<std::uint8_t>(
          ops::encode(tb, cast_ops::load(x[i]), m, stochastic, rb, zero_code));
    }
  }
}

template <class In>
void launch_quantize(const In* x, std::int64_t n, std::int64_t block, std::uint8_t* codes,
                     float* absmax, const ops::tables& tb, std::uint32_t zero_code, bool stochastic,
                     const emu::random_stream& rng, cudaStream_t stream) {
  const std::int64_t blocks = blockwise_blocks(n, block);
  if (blocks == 0)
    return;
  const int threads = static_cast<int>(std::min<std::int64_t>(block, 256));
  const unsigned grid = static_cast<unsigned>(
      std::min<std::int64_t>(blocks, static_cast<std::int64_t>(sm_count()) * (2048 / threads)));
  quantize_kernel<<<grid, threads, 0, stream>>>(x, n, block, blocks, codes, absmax, tb, zero_code,
                                                stochastic, rng);
  check_launch("blockwise quantize_kernel");
}

__global__ void __launch_bounds__(256)
    dequantize_kernel(const std::uint8_t* __restrict__ codes, std::int64_t n, int block_log2,
                      const float* __restrict__ absmax, const std::uint8_t* __restrict__ codes2,
                      const float* __restrict__ absmax2, codebook_values cb_in,
                      codebook_values cb2_in, bool nested, float* __restrict__ out) {
  __shared__ float cb[256], cb2[256];
  for (int j = threadIdx.x; j < 256; j += blockDim.x) {
    cb[j] = cb_in.v[j];
    cb2[j] = cb2_in.v[j];
  }
  __syncthreads();
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = i >> block_log2;
    const float a = nested ? ops::decode(cb2[codes2[b]], absmax2[b / nested_block]) : absmax[b];
    out[i] = ops::decode(cb[codes[i]], a);
  }
}

// ---- SRAM-quantiles
// ------------------------------------------------------------------------------

constexpr int sort_threads = 512, sort_items = 8;
static_assert(sort_threads * sort_items == quantile_chunk);

template <class In>
__global__ void __launch_bounds__(sort_threads)
    chunk_quantiles_kernel(const In* __restrict__ x, std::int64_t n, std::int64_t chunks,
                           std::int64_t k, float* __restrict__ part) {
  using sorter = cub::BlockRadixSort<std::uint32_t, sort_threads, sort_items>;
  __shared__ typename sorter::TempStorage temp;
  __shared__ std::uint32_t sorted[quantile_chunk];
  for (std::int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const std::int64_t i0 = c * quantile_chunk;
    const std::int64_t m = min(n - i0, quantile_chunk);
    std::uint32_t keys[sort_items];
#pragma unroll
    for (int j = 0; j < sort_items; ++j) {
      const std::int64_t pos = static_cast<std::int64_t>(threadIdx.x) * sort_items + j;
      // Padding sorts last (the largest key) and is never read: positions stay below m.
      keys[j] =
          pos < m
              ? ops::order_key(emu::detail::bit_cast<std::uint32_t>(cast_ops::load(x[i0 + pos])))
              : 0xFFFFFFFFu;
    }
    __syncthreads(); // temp and sorted may still be read for the previous chunk
    sorter(temp).Sort(keys);
#pragma unroll
    for (int j = 0; j < sort_items; ++j)
      sorted[threadIdx.x * sort_items + j] = keys[j];
    __syncthreads();
    for (std::int64_t q = threadIdx.x; q < k; q += sort_threads)
      part[c * k + q] =
          emu::detail::bit_cast<float>(ops::key_bits(sorted[ops::quantile_position(q, k, m)]));
  }
}

// Estimate q: sum over chunks, in chunk order, of m_c * quantile (exact products in double).
__global__ void average_quantiles_kernel(const float* __restrict__ part, std::int64_t n,
                                         std::int64_t chunks, std::int64_t k,
                                         float* __restrict__ out) {
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < k;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const double m = static_cast<double>(min(n - c * quantile_chunk, quantile_chunk));
      acc = __dadd_rn(acc, __dmul_rn(m, static_cast<double>(part[c * k + q])));
    }
    out[q] = __double2float_rn(__ddiv_rn(acc, static_cast<double>(n)));
  }
}

} // namespace

void quantize_blockwise(const blockwise_problem& p, const exec& ex) {
  const cudaStream_t stream = stream_of(ex);
  if (p.n == 0)
    return;
  cast_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>) {
      const In* x = p.x.ptr<const In>();
      std::uint8_t* codes = p.codes.ptr<std::uint8_t>();
      if (!p.nested) {
        launch_quantize(x, p.n, p.block, codes, p.absmax.ptr<float>(), p.tb, p.zero_code,
                        p.stochastic, p.rng, stream);
        return;
      }
      scratch a(sizeof(float) * static_cast<std::size_t>(p.blocks), stream);
      launch_quantize(x, p.n, p.block, codes, a.as<float>(), p.tb, p.zero_code, p.stochastic, p.rng,
                      stream);
      launch_quantize(a.as<const float>(), p.blocks, nested_block, p.codes2.ptr<std::uint8_t>(),
                      p.absmax2.ptr<float>(), p.tb2, p.zero_code2, false, emu::random_stream{},
                      stream);
    }
  });
}

void dequantize_blockwise(const blockwise_dequant_problem& p, const exec& ex) {
  if (p.n == 0)
    return;
  codebook_values cb, cb2;
  std::copy(p.value, p.value + 256, cb.v);
  std::copy(p.nested ? p.value2 : p.value, (p.nested ? p.value2 : p.value) + 256, cb2.v);
  int block_log2 = 0;
  while ((std::int64_t{1} << block_log2) < p.block)
    ++block_log2;
  dequantize_kernel<<<grid_for(p.n, 256), 256, 0, stream_of(ex)>>>(
      p.codes.ptr<const std::uint8_t>(), p.n, block_log2,
      p.nested ? nullptr : p.absmax.ptr<const float>(),
      p.nested ? p.codes2.ptr<const std::uint8_t>() : nullptr,
      p.nested ? p.absmax2.ptr<const float>() : nullptr, cb, cb2, p.nested, p.out.ptr<float>());
  check_launch("blockwise dequantize_kernel");
}

void estimate_quantiles(const quantile_problem& p, const exec& ex) {
  const cudaStream_t stream = stream_of(ex);
  scratch part(sizeof(float) * static_cast<std::size_t>(p.chunks * p.k), stream);
  cast_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>) {
      const unsigned grid = static_cast<unsigned>(
          std::min<std::int64_t>(p.chunks, static_cast<std::int64_t>(sm_count()) * 4));
      chunk_quantiles_kernel<<<grid, sort_threads, 0, stream>>>(p.x.ptr<const In>(), p.n, p.chunks,
                                                                p.k, part.as<float>());
      check_launch("chunk_quantiles_kernel");
    }
  });
  average_quantiles_kernel<<<grid_for(p.k, 256), 256, 0, stream>>>(
      part.as<const float>(), p.n, p.chunks, p.k, p.out.ptr<float>());
  check_launch("average_quantiles_kernel");
}

} // namespace lowbit::kernels::cuda
