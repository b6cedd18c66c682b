// CUDA kernels of the quantization technique. Per-element and per-group results come from
// quantize_ops.hpp (shared with the CPU twin); this file only organizes the work:
//
//   per tensor          : amax kernel (block maxima of |x| bits, order-free) -> scale kernel
//                         (one block reduces the maxima) -> cast
//   columns             : amax kernel (atomicMax per column) -> scale kernel -> cast
//   rows, blocks, tiles : one pass per group (common/group_pass.cuh): contiguous runs of
//                         power-of-two groups through the flat kernel (each thread 16
//                         consecutive elements), other row segments of up to 8192 float32
//                         or 16384 16-bit elements through the segment kernel (16-byte chunks
//                         interleaved across a segment's lanes), longer groups and tiles one
//                         block each
//                         (amax pass, then cast pass, the second read from L1/L2)
//   MX                  : the same group pass with the E8M0 scale rule
//
// The quantize kernels themselves are in quantize_kernels.cuh, compiled once per input type
// (quantize_f32.cu, quantize_bf16.cu, quantize_f16.cu); the dequantize kernels are here.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../common/cuda_map.cuh"
#include "../common/dispatch.hpp"
#include "quantize_input.hpp"
#include "quantize_internal.hpp"
#include "quantize_ops.hpp"

namespace lowbit::kernels::cuda {

void quantize(const quant_problem& p, const exec& ex) {
  element_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>)
      quantize_input<In>(p, ex);
  });
}

void quantize_mx(const mx_problem& p, const exec& ex) {
  element_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>)
      quantize_mx_input<In>(p, ex);
  });
}

namespace {

constexpr int threads = 256;

// Dequantization: each thread converts 8 consecutive elements of a row. The scale of element
// (r, c) is scales[row_base(r) + c / tc]; the division happens once per thread and the index
// then advances as c crosses multiples of tc. tc = 1 for columns, the block or tile width for
// blocks and tiles, and "never" (INT64_MAX) for tensor and rows.
struct scale_layout {
  std::int64_t tr;         // rows per scale row (1, or the tile height, or INT64_MAX for tensor)
  std::int64_t tc;         // columns per scale
  std::int64_t scale_cols; // scales per scale row
  __device__ std::int64_t row_base(std::int64_t r) const { return (r / tr) * scale_cols; }
};

scale_layout layout_of(const grouping& g, std::int64_t n) {
  constexpr std::int64_t never = INT64_MAX;
  switch (g.k) {
  case grouping::kind::tensor: return {never, never, 1};
  case grouping::kind::rows: return {1, never, 1};
  case grouping::kind::columns: return {never, 1, n};
  case grouping::kind::blocks: return {1, g.tile_cols, g.scale_cols(n)};
  case grouping::kind::tiles: return {g.tile_rows, g.tile_cols, g.scale_cols(n)};
  }
  return {never, never, 1};
}

template <bool MX, class FT, class Code, class Scale>
__global__ void __launch_bounds__(threads)
    dequant_kernel(const Code* __restrict__ codes, std::int64_t crs, float* __restrict__ out,
                   std::int64_t ors, std::int64_t rows, std::int64_t cols,
                   const Scale* __restrict__ scales, scale_layout lay, target t, FT ft,
                   bool vector) {
  const std::int64_t chunks = (cols + 7) / 8;
  const std::uint32_t mask = t.is_int ? 0xFFu : 0xFFFFu;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::int64_t base = lay.row_base(r);
    for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         k < chunks; k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const std::int64_t c0 = k * 8;
      std::int64_t g = c0 / lay.tc, rem = c0 - g * lay.tc;
      const Code* src = codes + r * crs + c0;
      float* dst = out + r * ors + c0;
      const auto value = [&](std::uint32_t u, Scale s) {
        if constexpr (MX)
          return quant_ops::mx_value(t, u, s);
        else
          return quant_ops::descaled(quant_ops::element_value(t, ft, u & mask), s);
      };
      if (vector && c0 + 8 <= cols && rem + 8 <= lay.tc) {
        // Eight codes of one group: one load, one scale, two 16-byte stores.
        const vec<Code, 8> w = *reinterpret_cast<const vec<Code, 8>*>(src);
        const Scale s = scales[base + g];
        vec<float, 4> y0, y1;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          y0.v[e] = value(static_cast<std::uint32_t>(w.v[e]), s);
          y1.v[e] = value(static_cast<std::uint32_t>(w.v[e + 4]), s);
        }
        *reinterpret_cast<vec<float, 4>*>(dst) = y0;
        *reinterpret_cast<vec<float, 4>*>(dst + 4) = y1;
        continue;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (c0 + e < cols)
          dst[e] = value(static_cast<std::uint32_t>(src[e]), scales[base + g]);
        if (++rem == lay.tc) {
          rem = 0;
          ++g;
        }
      }
    }
  }
}

template <bool MX, class Scale>
void launch_dequant(const dequant_problem& p, const Scale* scales, const scale_layout& lay,
                    cudaStream_t stream) {
  const std::int64_t m = p.cm.rows, n = p.cm.cols;
  if (m * n == 0)
    return;
  const dim3 grid = grid_2d_for((n + 7) / 8, m, threads); // a thread per 8 elements
  const auto run = [&](auto code_tag, auto ft) {
    using Code = decltype(code_tag);
    const bool vector = p.cm.row_stride % 8 == 0 && p.om.row_stride % 4 == 0 &&
                        aligned_to<Code>(p.codes.ptr<const Code>(), sizeof(Code) * 8) &&
                        aligned_to<float>(p.out.ptr<float>(), 16);
    dequant_kernel<MX><<<grid, threads, 0, stream>>>(p.codes.ptr<const Code>(), p.cm.row_stride,
                                                     p.out.ptr<float>(), p.om.row_stride, m, n,
                                                     scales, lay, p.t, ft, vector);
    check_launch("dequant_kernel");
  };
  const auto with_format = [&](auto code_tag) {
    if constexpr (MX) {
      run(code_tag, detail::runtime_format_of(p.t));
    } else {
      detail::dispatch_target(p.t, [&](auto ft) { run(code_tag, ft); });
    }
  };
  if (p.codes.type == dtype::int8)
    return with_format(std::int8_t{});
  if (p.codes.type == dtype::uint16)
    return with_format(std::uint16_t{});
  with_format(std::uint8_t{});
}

} // namespace

void dequantize(const dequant_problem& p, const exec& ex) {
  launch_dequant<false>(p, p.scales.ptr<const float>(), layout_of(p.g, p.cm.cols), stream_of(ex));
}

void dequantize_mx(const dequant_problem& p, const exec& ex) {
  launch_dequant<true>(p, p.scales.ptr<const std::uint8_t>(),
                       scale_layout{1, p.block, (p.cm.cols + p.block - 1) / p.block},
                       stream_of(ex));
}

} // namespace lowbit::kernels::cuda
