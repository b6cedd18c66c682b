// One pass per group for the techniques that scale groups of elements by their absolute maximum
// (quantization by rows, blocks, tiles and OCP MX; block-wise codebook quantization): the group's
// amax, then every element encoded from it, x read once. A technique supplies a rule:
//
//   struct rule {
//     using scale_type = ...;                                   // what scales[] holds per group
//     __device__ group begin(std::uint32_t amax_bits) const;    // per-group state from |x| max bits
//     __device__ scale_type stored(const group&) const;         // the group's scales[] entry
//     __device__ std::uint32_t element(const group&, float x, std::uint32_t rbits) const;
//     __device__ bool stochastic() const;                       // whether rbits are drawn
//   };
//
// The amax is a maximum of |x| bit patterns (NaN above Inf above every finite value): exact and
// order-free, so every reduction tree gives the same bits as the CPU twins' loops. Element i of
// the input (row-major logical index r * cols + c) draws rng.bits(i), whatever thread holds it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../cast/cast_ops.hpp"
#include "cuda_map.cuh"
#include "matrix.hpp"

namespace lowbit::kernels::cuda {

namespace group_pass {

constexpr int threads = 256;

struct group_geometry {
  std::int64_t rows, cols;  // input extent
  std::int64_t gr, gc;      // group extent (the last group in a row/column may be partial)
  std::int64_t scale_cols;  // groups per group-row
};

__device__ __forceinline__ std::uint32_t abs_bits(float x) {
  return emu::detail::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
}

// Rules may keep tables in shared memory: a rule with `static constexpr int shared_bytes` gets
// that much dynamic shared memory (group_shared()), and the kernels use `rule.to_shared()`
// (called by every thread, which copies its share; a barrier follows) in its place. Reading the
// tables through group_shared() itself, rather than a pointer kept in the rule, lets the
// compiler address shared memory directly.
__device__ __forceinline__ unsigned char* group_shared() {
  extern __shared__ __align__(16) unsigned char group_shared_bytes[];
  return group_shared_bytes;
}

template <class Rule>
inline constexpr int shared_bytes_of = [] {
  if constexpr (requires { Rule::shared_bytes; }) return Rule::shared_bytes;
  else return 0;
}();

template <class Rule>
__device__ __forceinline__ Rule in_shared(const Rule& rule) {
  if constexpr (shared_bytes_of<Rule> > 0) {
    const Rule r = rule.to_shared();
    __syncthreads();
    return r;
  } else {
    return rule;
  }
}

// One block per group (long rows, large blocks, tiles): threads cover the group as a
// (rows_per_step x lanes) grid, lanes a power of two, so no division per element.
template <class Rule, class In, class Code>
__global__ void __launch_bounds__(threads)
    group_block_kernel(const In* __restrict__ x, std::int64_t xrs, Code* __restrict__ codes,
                       std::int64_t crs, typename Rule::scale_type* __restrict__ scales, group_geometry geo,
                       int lanes_log2, Rule rule_in, emu::random_stream rng) {
  const Rule rule = in_shared(rule_in);
  const int lanes = 1 << lanes_log2;
  const int lane = threadIdx.x & (lanes - 1), row_in_step = threadIdx.x >> lanes_log2;
  const int rows_per_step = threads >> lanes_log2;
  const std::int64_t groups_r = (geo.rows + geo.gr - 1) / geo.gr;
  for (std::int64_t g = blockIdx.x; g < groups_r * geo.scale_cols; g += gridDim.x) {
    const std::int64_t r0 = (g / geo.scale_cols) * geo.gr, c0 = (g % geo.scale_cols) * geo.gc;
    const std::int64_t r1 = min(geo.rows, r0 + geo.gr), c1 = min(geo.cols, c0 + geo.gc);
    std::uint32_t m = 0;
    for (std::int64_t r = r0 + row_in_step; r < r1; r += rows_per_step)
      for (std::int64_t c = c0 + lane; c < c1; c += lanes)
        m = max(m, abs_bits(cast_ops::load(x[r * xrs + c])));
    m = block_max(m);
    const auto grp = rule.begin(m);
    if (threadIdx.x == 0) scales[g] = rule.stored(grp);
    for (std::int64_t r = r0 + row_in_step; r < r1; r += rows_per_step)
      for (std::int64_t c = c0 + lane; c < c1; c += lanes) {
        const std::uint32_t rb =
            rule.stochastic() ? rng.bits(static_cast<std::uint64_t>(r * geo.cols + c)) : 0u;
        codes[r * crs + c] = static_cast<Code>(rule.element(grp, cast_ops::load(x[r * xrs + c]), rb));
      }
  }
}

// Blocks per SM the segment kernel is compiled for: 4 (64 registers), or 3 (85) with 32
// elements per thread; one fewer for rules whose shared tables leave room for no more.
template <class Rule, int E>
inline constexpr int segment_min_blocks = shared_bytes_of<Rule> > 56 * 1024 ? (E >= 32 ? 2 : 3)
                                                                          : (E >= 32 ? 3 : 4);

// Row segments of up to 128 * E elements held in registers: a segment owns `seg_lanes` adjacent
// lanes (a power of two, <= 128), and its elements are cut into chunks of four, chunk j of the
// segment going to lane j % seg_lanes: each thread holds E / 4 chunks, and a warp's load of one
// chunk per lane touches whole 32-byte sectors (16-byte vector accesses where the rows allow).
// The segment's amax is reduced by shuffles within a warp and, for segments longer than a warp,
// through shared memory; the elements are then encoded from registers, so x is read once.
// Blocks are (bx x by) with bx a power of two >= seg_lanes, so segments never straddle blocks or
// warps unevenly. Which lane holds which element does not change any result bit.
template <int E, class Rule, class In, class Code>
__global__ void __launch_bounds__(threads, segment_min_blocks<Rule, E>)
    segment_kernel(const In* __restrict__ x, std::int64_t xrs, Code* __restrict__ codes,
                   std::int64_t crs, typename Rule::scale_type* __restrict__ scales, std::int64_t rows,
                   std::int64_t cols, std::int64_t k, int seg_lanes, std::int64_t lanes_per_row,
                   bool vector, Rule rule_in, emu::random_stream rng) {
  static_assert(E % 4 == 0, "whole chunks of four");
  constexpr int J = E / 4;  // chunks per thread
  const Rule rule = in_shared(rule_in);
  __shared__ __align__(16) std::uint32_t warp_max_smem[threads / 32];
  const std::int64_t nseg = (cols + k - 1) / k;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int chunk_lane = threadIdx.x & (seg_lanes - 1);
  for (std::int64_t rb0 = static_cast<std::int64_t>(blockIdx.y) * blockDim.y; rb0 < rows;
       rb0 += static_cast<std::int64_t>(gridDim.y) * blockDim.y) {
    const std::int64_t r = rb0 + threadIdx.y;
    for (std::int64_t lb0 = static_cast<std::int64_t>(blockIdx.x) * blockDim.x;
         lb0 < lanes_per_row; lb0 += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const std::int64_t seg = (lb0 + threadIdx.x) / seg_lanes;  // a power of two: a shift
      const std::int64_t c0 = seg * k;                             // the segment's first column
      const bool row_ok = r < rows && seg < nseg;
      // Elements of the segment that exist: k, or fewer in a row's last, partial segment.
      const int len = row_ok ? static_cast<int>(min(k, cols - c0)) : 0;
      const In* xs = x + r * xrs + c0;
      float v[E];
      bool ok[E];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int off = (j * seg_lanes + chunk_lane) * 4;  // in-segment offset of the chunk
        if (vector) {  // k and cols multiples of 4, rows aligned to 4 elements
          const bool full = off < len;
          if (full) {
            const vec<In, 4> w = *reinterpret_cast<const vec<In, 4>*>(xs + off);
#pragma unroll
            for (int e = 0; e < 4; ++e) v[j * 4 + e] = cast_ops::load(w.v[e]);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) ok[j * 4 + e] = full;
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            ok[j * 4 + e] = off + e < len;
            v[j * 4 + e] = ok[j * 4 + e] ? cast_ops::load(xs[off + e]) : 0.0f;
          }
        }
      }
      std::uint32_t m = 0;
#pragma unroll
      for (int e = 0; e < E; ++e) m = ok[e] ? max(m, abs_bits(v[e])) : m;
      if (seg_lanes < 32) {
        for (int o = 1; o < seg_lanes; o <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      } else {
        m = warp_max(m);
        if (seg_lanes > 32) {  // block-uniform: the segment spans 2 or 4 warps of an aligned four
          __syncthreads();
          if ((tid & 31) == 0) warp_max_smem[tid >> 5] = m;
          __syncthreads();
          const int warp = tid >> 5, nw = seg_lanes >> 5;
          const uint4 w4 = *reinterpret_cast<const uint4*>(&warp_max_smem[warp & ~3]);
          const int first = warp & ~(nw - 1) & 3;  // the segment's first warp within the four
          const std::uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) m = k >= first && k < first + nw ? max(m, w[k]) : m;
        }
      }
      if (!row_ok) continue;
      const auto grp = rule.begin(m);
      if (chunk_lane == 0) scales[r * nseg + seg] = rule.stored(grp);
      const std::uint64_t base = static_cast<std::uint64_t>(r * cols + c0);
      std::uint32_t rbits[E] = {};
      if (rule.stochastic()) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const std::uint64_t i = base + static_cast<std::uint64_t>((j * seg_lanes + chunk_lane) * 4);
          if ((i & 3u) == 0) {
            const emu::philox_block b = rng.block(i >> 2);
#pragma unroll
            for (int e = 0; e < 4; ++e) rbits[j * 4 + e] = b.v[e];
          } else {  // rows not a multiple of 4 long: element by element
#pragma unroll 1
            for (int e = 0; e < 4; ++e) rbits[j * 4 + e] = rng.bits(i + e);
          }
        }
      }
      Code* cs = codes + r * crs + c0;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int off = (j * seg_lanes + chunk_lane) * 4;
        vec<Code, 4> w;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          w.v[e] = static_cast<Code>(rule.element(grp, v[j * 4 + e], rbits[j * 4 + e]));
        if (vector) {
          if (ok[j * 4]) *reinterpret_cast<vec<Code, 4>*>(cs + off) = w;
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (ok[j * 4 + e]) cs[off + e] = w.v[e];
        }
      }
    }
  }
}

// Blocks of `kernel` resident per SM with `smem` bytes of dynamic shared memory, after opting
// in to that much where it exceeds the default 48 KiB. Rules with tables in shared memory get
// about this many blocks per SM (each walks many groups), so that the table copies stay few
// and no partial second wave runs.
template <class Kernel>
int resident_blocks(Kernel kernel, int block_threads, int smem) {
  if (smem > 48 * 1024)
    LOWBIT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int n = 0;
  LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block_threads, smem));
  return std::max(n, 1);
}

inline int log2_ceil(std::int64_t v) {
  int l = 0;
  while ((std::int64_t{1} << l) < v) ++l;
  return l;
}

template <int E, class Rule, class In, class Code>
void launch_segments(const In* x, const matrix_shape& xm, Code* codes, const matrix_shape& cm,
                     typename Rule::scale_type* scales, std::int64_t k, const Rule& rule,
                     const emu::random_stream& rng, cudaStream_t stream) {
  const int seg_lanes = 1 << log2_ceil((k + E - 1) / E);
  if (seg_lanes > 128)  // launch_groups picks E so that it never is
    throw error(errc::unsupported, "group pass: a segment of more than 128 lanes");
  const std::int64_t nseg = (xm.cols + k - 1) / k;
  const std::int64_t lanes_per_row = nseg * seg_lanes;
  const int bx = static_cast<int>(std::min<std::int64_t>(
      threads, std::max<std::int64_t>(seg_lanes, std::int64_t{1} << log2_ceil(lanes_per_row))));
  const int by = threads / bx;
  const auto kernel = segment_kernel<E, Rule, In, Code>;
  const std::int64_t gx = std::min<std::int64_t>(
      (lanes_per_row + bx - 1) / bx,
      shared_bytes_of<Rule> > 0
          ? std::int64_t{sm_count()} * resident_blocks(kernel, threads, shared_bytes_of<Rule>)
          : 65535);
  const std::int64_t want = std::max<std::int64_t>(1, sm_count() * 8 / gx);
  const std::int64_t gy =
      std::min<std::int64_t>(std::min<std::int64_t>((xm.rows + by - 1) / by, want), 65535);
  const bool vector = k % 4 == 0 && xm.cols % 4 == 0 && xm.row_stride % 4 == 0 &&
                      cm.row_stride % 4 == 0 && aligned_to<In>(x, sizeof(In) * 4) &&
                      aligned_to<Code>(codes, sizeof(Code) * 4);
  kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(bx, by),
           shared_bytes_of<Rule>, stream>>>(x, xm.row_stride, codes, cm.row_stride, scales, xm.rows, xm.cols,
                                k, seg_lanes, lanes_per_row, vector, rule, rng);
  check_launch("segment_kernel");
}

// Launches the right group-pass kernel for row segments or tiles: segments of up to 2048
// elements with 16 per thread, up to 4096 with 32 (a segment then spans at most four warps, and
// a thread's per-group work serves 16 or 32 elements), longer ones and 2-D tiles one block per
// group.
template <class Rule, class In, class Code>
void launch_groups(const In* x, const matrix_shape& xm, Code* codes, const matrix_shape& cm,
                   typename Rule::scale_type* scales, std::int64_t gr, std::int64_t gc,
                   const Rule& rule, const emu::random_stream& rng, cudaStream_t stream) {
  if (xm.rows == 0 || xm.cols == 0) return;
  if (gr == 1 && gc <= 2048)
    return launch_segments<16>(x, xm, codes, cm, scales, gc, rule, rng, stream);
  if (gr == 1 && gc <= 4096)
    return launch_segments<32>(x, xm, codes, cm, scales, gc, rule, rng, stream);
  const std::int64_t width = std::min(gc, xm.cols);
  const int lanes_log2 = std::min(8, log2_ceil(std::max<std::int64_t>(width, 1)));
  const group_geometry geo{xm.rows, xm.cols, gr, gc, (xm.cols + gc - 1) / gc};
  const std::int64_t groups = ((xm.rows + gr - 1) / gr) * geo.scale_cols;
  const auto kernel = group_block_kernel<Rule, In, Code>;
  const std::int64_t cap =
      shared_bytes_of<Rule> > 0
          ? std::int64_t{sm_count()} * resident_blocks(kernel, threads, shared_bytes_of<Rule>)
          : std::int64_t{1} << 30;
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(groups, cap));
  kernel<<<grid, threads, shared_bytes_of<Rule>, stream>>>(
      x, xm.row_stride, codes, cm.row_stride, scales, geo, lanes_log2, rule, rng);
  check_launch("group_block_kernel");
}

}  // namespace group_pass

using group_pass::launch_groups;

}  // namespace lowbit::kernels::cuda
