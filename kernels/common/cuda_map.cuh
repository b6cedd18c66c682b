// Element-wise CUDA kernels shared by the techniques: a flat map over contiguous memory with
// coalesced 16-byte vector accesses, and a 2-D map over (strided) matrices, both grid-stride loops
// with 64-bit indices. Ops are function objects:
// `Out operator()(In x, int64 row, int64 col, uint32 rbits)`; the random bits of element i (the
// row-major logical index) come from random_stream::bits(i), drawn one Philox evaluation per four
// elements, when `stochastic` (a uniform branch) is set.
#pragma once

#include <algorithm>
#include <cstdint>

#include <lowbit/emu/philox.hpp>

#include "cuda.hpp"

namespace lowbit::kernels::cuda {

constexpr int map_threads = 256;

// Ops that set `needs_index` receive the element's row-major index i in place of the row (and
// 0 as the column): cheaper than (row, col) when the op only needs i.
template <class Op>
inline constexpr bool wants_index = [] {
  if constexpr (requires { Op::needs_index; })
    return Op::needs_index;
  else
    return false;
}();

// An op with `static constexpr int shared_floats` gets that many floats of shared memory
// through `to_shared(p)` (called by every thread, which does its share: copies a table read at
// data-dependent positions, or reduces values the block needs; a barrier follows); and an op
// may then load per-kernel values once per thread: prepare().
template <class Op> __device__ __forceinline__ Op prepared(const Op& op_in) {
  Op op = op_in;
  if constexpr (requires { Op::shared_floats; }) {
    __shared__ float table[Op::shared_floats];
    op = op.to_shared(table);
    __syncthreads();
  }
  if constexpr (requires { op.prepare(); })
    op = op.prepare();
  return op;
}

// An op may also bind values shared by a chunk of the flat map (C consecutive elements starting
// at a multiple of C, e.g. one block's scale): `at(i0)` returns the op that the chunk's elements
// are given to (called once per chunk, and once per element in the last, partial tile).
template <class Op>
__device__ __forceinline__ decltype(auto) for_chunk(const Op& op, std::int64_t i0) {
  if constexpr (requires { op.at(i0); })
    return op.at(i0);
  else
    return (op);
}

// The flat map's access pattern: each thread moves chunks of C elements (a 16-byte access on the
// narrower side, C consecutive elements on the wider one; at least 4 elements) and U chunks per
// tile, the u-th chunk of thread t at tile offset (u * map_threads + t) * C. Every warp-wide load
// and store then covers one contiguous span (no 16-byte pieces strided across a 2 KiB window, which
// costs L1 wavefronts), and the U independent loads in flight per thread hide DRAM latency.
template <class In, class Out> struct flat_shape {
  static constexpr int in_w = 16 / static_cast<int>(sizeof(In));
  static constexpr int out_w = 16 / static_cast<int>(sizeof(Out));
  static constexpr int narrow = in_w < out_w ? in_w : out_w;
  static constexpr int C = narrow < 4 ? 4 : narrow; // doubles: two 16-byte accesses per chunk
  static constexpr int ratio = (in_w > out_w ? in_w : out_w) / C;
  // Byte inputs move few bytes per load: twice the chunks, so that as many bytes are in flight.
  static constexpr int U = ratio < 2 ? 2 : (sizeof(In) == 1 ? 2 * ratio : ratio);
  static_assert(C % 4 == 0, "chunks hold whole Philox blocks (four elements)");
};

// The random bits of the C elements from index i (rng.bits of each): one Philox block per four
// where C is a multiple of 4 (i then one too), else one evaluation per element.
template <int C>
__device__ __forceinline__ void random_bits(const emu::random_stream& rng, std::int64_t i,
                                            std::uint32_t (&r)[C]) {
  if constexpr (C % 4 == 0) {
#pragma unroll
    for (int h = 0; h < C; h += 4) {
      const emu::philox_block b = rng.block(static_cast<std::uint64_t>(i + h) >> 2);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        r[h + k] = b.v[k];
    }
  } else {
#pragma unroll
    for (int j = 0; j < C; ++j)
      r[j] = rng.bits(static_cast<std::uint64_t>(i + j));
  }
}

// Flat map over n contiguous elements; `cols` only turns the flat index into (row, col) when the
// op asks for it (Op::needs_position), which costs a division per chunk.
template <int C, int U, class In, class Out, class Op>
__global__ void __launch_bounds__(map_threads)
    map_flat_kernel(const In* __restrict__ in, Out* __restrict__ out, std::int64_t n,
                    std::int64_t cols, Op op_in, bool stochastic, emu::random_stream rng) {
  const Op op = prepared(op_in);
  constexpr std::int64_t per_tile = static_cast<std::int64_t>(map_threads) * C * U;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * per_tile;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * per_tile; base < n;
       base += step) {
    if (base + per_tile <= n) {
      vec<In, C> x[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        x[u] =
            *reinterpret_cast<const vec<In, C>*>(in + base + (u * map_threads + threadIdx.x) * C);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const std::int64_t i = base + (u * map_threads + threadIdx.x) * C; // a multiple of 4
        std::uint32_t r[C] = {};
        if (stochastic)
          random_bits<C>(rng, i, r);
        std::int64_t rr = Op::needs_position ? i / cols : 0;
        std::int64_t cc = Op::needs_position ? i - rr * cols : 0;
        const auto& cop = for_chunk(op, i);
        vec<Out, C> y;
#pragma unroll
        for (int j = 0; j < C; ++j) {
          y.v[j] = cop(x[u].v[j], wants_index<Op> ? i + j : rr, cc, r[j]);
          if constexpr (Op::needs_position) {
            if (++cc == cols) { // a chunk may straddle rows
              cc = 0;
              ++rr;
            }
          }
        }
        *reinterpret_cast<vec<Out, C>*>(out + i) = y;
      }
    } else {
      // The last, partial tile: element by element (coalesced), the same bits per element.
      for (std::int64_t i = base + threadIdx.x; i < n; i += map_threads) {
        const std::uint32_t rb = stochastic ? rng.bits(static_cast<std::uint64_t>(i)) : 0u;
        const std::int64_t rr = Op::needs_position ? i / cols : 0;
        out[i] = for_chunk(op, i)(in[i], wants_index<Op> ? i : rr,
                                  Op::needs_position ? i - rr * cols : 0, rb);
      }
    }
  }
}

// 2-D map over rows x cols with row strides (in elements) for input and output. Each thread
// walks one column position through a band of rows, so no division is needed per element; an
// op's `at` binds each element alone (a chunk of one).
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
      out[r * out_rs + c] = for_chunk(op, static_cast<std::int64_t>(i))(
          in[r * in_rs + c], wants_index<Op> ? static_cast<std::int64_t>(i) : r, c, rb);
    }
  }
}

// Runs `op` over the matrix: the vectorized flat kernel when both sides are contiguous and
// aligned, otherwise the 2-D kernel. Results do not depend on which one runs.
template <class In, class Out, class Op>
void launch_map(const In* in, std::int64_t in_rs, Out* out, std::int64_t out_rs, std::int64_t rows,
                std::int64_t cols, const Op& op, bool stochastic, const emu::random_stream& rng,
                cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n == 0)
    return;
  using shape = flat_shape<In, Out>;
  constexpr int C = shape::C, U = shape::U;
  const bool flat = (rows == 1 || (in_rs == cols && out_rs == cols));
  if (flat && aligned_to<In>(in, sizeof(In) * C) && aligned_to<Out>(out, sizeof(Out) * C)) {
    constexpr std::int64_t per_tile = std::int64_t{map_threads} * C * U;
    // One block per tile (the loop only strides past 2^31 - 1 blocks): the block scheduler then
    // keeps every SM's loads in flight, where a resident grid walking the tiles measured slower
    // on the H200 (a float32 -> e4m3fn cast 0.311 against 0.332 ms for 2^28 elements).
    const std::int64_t tiles = (n + per_tile - 1) / per_tile;
    map_flat_kernel<C, U><<<static_cast<unsigned>(std::min<std::int64_t>(tiles, 0x7FFFFFFF)),
                            map_threads, 0, stream>>>(in, out, n, cols, op, stochastic, rng);
    check_launch("map_flat_kernel");
    return;
  }
  const unsigned gx = static_cast<unsigned>((cols + map_threads - 1) / map_threads < 1024
                                                ? (cols + map_threads - 1) / map_threads
                                                : 1024);
  const std::int64_t gy_want = (static_cast<std::int64_t>(sm_count()) * 8 + gx - 1) / gx;
  const unsigned gy = static_cast<unsigned>(gy_want < rows ? (gy_want < 65535 ? gy_want : 65535)
                                                           : (rows < 65535 ? rows : 65535));
  map_2d_kernel<<<dim3(gx, gy < 1 ? 1 : gy), map_threads, 0, stream>>>(in, in_rs, out, out_rs, rows,
                                                                       cols, op, stochastic, rng);
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
  __syncthreads(); // part[] may still be read by an earlier call
  if (lane == 0)
    part[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : 0u;
  return warp_max(v);
}

} // namespace lowbit::kernels::cuda
