// Element-wise CUDA kernels shared by the techniques: a flat map over contiguous memory with
// 16-byte vector loads, and a 2-D map over (strided) matrices, both grid-stride loops with 64-bit
// indices. Ops are function objects: `Out operator()(In x, int64 row, int64 col, uint32 rbits)`;
// the random bits of element i (the row-major logical index) come from random_stream::bits(i),
// drawn one Philox evaluation per four elements, when `stochastic` (a uniform branch) is set.
#pragma once

#include <cstdint>

#include <lowbit/emu/philox.hpp>

#include "cuda.hpp"

namespace lowbit::kernels::cuda {

constexpr int map_threads = 256;

// An op may load per-kernel values (a scale kept in device memory) once per thread: prepare().
template <class Op>
__device__ __forceinline__ Op prepared(const Op& op) {
  if constexpr (requires { op.prepare(); })
    return op.prepare();
  else
    return op;
}

template <class T>
struct vec_width {
  // Elements per thread and iteration: 16 bytes of the wider of input and output.
  static constexpr int value = 16 / sizeof(T) < 4 ? 4 : 16 / sizeof(T);
};

// Flat map over n contiguous elements; `cols` only turns the flat index into (row, col) when the
// op asks for it (Op::needs_position), which costs a division per vector.
template <int V, class In, class Out, class Op>
__global__ void __launch_bounds__(map_threads)
    map_flat_kernel(const In* __restrict__ in, Out* __restrict__ out, std::int64_t n,
                    std::int64_t cols, Op op_in, bool stochastic, emu::random_stream rng) {
  const Op op = prepared(op_in);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x * V;
  std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  for (; i + V <= n; i += stride) {
    const vec<In, V> x = *reinterpret_cast<const vec<In, V>*>(in + i);
    vec<Out, V> y;
    std::uint32_t r[V] = {};
    if (stochastic) {
#pragma unroll
      for (int j = 0; j < V; j += 4) {
        const emu::philox_block b = rng.block(static_cast<std::uint64_t>(i + j) >> 2);
#pragma unroll
        for (int k = 0; k < 4 && j + k < V; ++k) r[j + k] = b.v[k];
      }
    }
    std::int64_t rr = Op::needs_position ? i / cols : 0;  // one division per vector
    std::int64_t cc = Op::needs_position ? i - rr * cols : 0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      y.v[j] = op(x.v[j], rr, cc, r[j]);
      if constexpr (Op::needs_position) {
        if (++cc == cols) {  // a vector may straddle rows
          cc = 0;
          ++rr;
        }
      }
    }
    *reinterpret_cast<vec<Out, V>*>(out + i) = y;
  }
  // Tail (n not a multiple of V): the one thread whose vector would run past the end.
  if (i < n) {
    for (; i < n; ++i) {
      const std::uint32_t rb = stochastic ? rng.bits(static_cast<std::uint64_t>(i)) : 0u;
      const std::int64_t rr = Op::needs_position ? i / cols : 0;
      out[i] = op(in[i], rr, Op::needs_position ? i - rr * cols : 0, rb);
    }
  }
}

// 2-D map over rows x cols with row strides (in elements) for input and output. Each thread
// walks one column position through a band of rows, so no division is needed per element.
template <class In, class Out, class Op>
__global__ void __launch_bounds__(map_threads)
    map_2d_kernel(const In* __restrict__ in, std::int64_t in_rs, Out* __restrict__ out,
                  std::int64_t out_rs, std::int64_t rows, std::int64_t cols, Op op_in,
                  bool stochastic, emu::random_stream rng) {
  const Op op = prepared(op_in);
  const std::int64_t col_step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         c < cols; c += col_step) {
      const std::uint64_t i = static_cast<std::uint64_t>(r * cols + c);
      const std::uint32_t rb = stochastic ? rng.bits(i) : 0u;
      out[r * out_rs + c] = op(in[r * in_rs + c], r, c, rb);
    }
  }
}

// Runs `op` over the matrix: the vectorized flat kernel when both sides are contiguous and
// aligned, otherwise the 2-D kernel. Results do not depend on which one runs.
template <class In, class Out, class Op>
void launch_map(const In* in, std::int64_t in_rs, Out* out, std::int64_t out_rs,
                std::int64_t rows, std::int64_t cols, const Op& op, bool stochastic,
                const emu::random_stream& rng, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  constexpr int v_in = vec_width<In>::value, v_out = vec_width<Out>::value;
  constexpr int V = v_in > v_out ? v_in : v_out;
  const bool flat = (rows == 1 || (in_rs == cols && out_rs == cols));
  if (flat && aligned_to<In>(in, sizeof(In) * V) && aligned_to<Out>(out, sizeof(Out) * V)) {
    map_flat_kernel<V><<<grid_for(n / V + 1, map_threads), map_threads, 0, stream>>>(
        in, out, n, cols, op, stochastic, rng);
    check_launch("map_flat_kernel");
    return;
  }
  const unsigned gx = static_cast<unsigned>((cols + map_threads - 1) / map_threads < 1024
                                                ? (cols + map_threads - 1) / map_threads
                                                : 1024);
  const std::int64_t gy_want = (static_cast<std::int64_t>(sm_count()) * 8 + gx - 1) / gx;
  const unsigned gy = static_cast<unsigned>(gy_want < rows ? (gy_want < 65535 ? gy_want : 65535)
                                                           : (rows < 65535 ? rows : 65535));
  map_2d_kernel<<<dim3(gx, gy < 1 ? 1 : gy), map_threads, 0, stream>>>(
      in, in_rs, out, out_rs, rows, cols, op, stochastic, rng);
  check_launch("map_2d_kernel");
}

// ---- reductions --------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t warp_max(std::uint32_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const std::uint32_t w = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Max over the block; every thread gets the result. Needs blockDim.x a multiple of 32, <= 1024.
__device__ __forceinline__ std::uint32_t block_max(std::uint32_t v) {
  __shared__ std::uint32_t part[32];
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by an earlier call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : 0u;
  return warp_max(v);
}

}  // namespace lowbit::kernels::cuda
