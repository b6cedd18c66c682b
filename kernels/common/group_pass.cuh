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
#include <atomic>
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

// Elements per thread of the segment kernel for a rule: 16, or what the rule asks for
// (`static constexpr int segment_elements`): more elements per thread spread the per-segment work
// (reduction, scale, staging) over more elements.
template <class Rule>
inline constexpr int segment_elements_of = [] {
  if constexpr (requires { Rule::segment_elements; }) return Rule::segment_elements;
  else return 16;
}();

// Blocks per SM the segment kernel is compiled for: 4 (64 registers) with 16 elements per
// thread, 3 (80) for rules with shared tables, 2 (128) with 32 elements per thread.
template <class Rule, int E>
inline constexpr int segment_min_blocks = E >= 32 ? 2 : shared_bytes_of<Rule> > 0 ? 3 : 4;

// Asynchronous copies from global to shared memory (cp.async, sm_80 and later; a plain copy
// before): the staging of segment_kernel. Each thread reads back only what it copied itself,
// after waiting for its own copy groups, so no barrier is involved.
template <int Bytes>
__device__ __forceinline__ void copy_async(void* smem, const void* gmem) {
  static_assert(Bytes == 8 || Bytes == 16, "cp.async of 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(gmem) : "memory");
#else
  using word = vec<std::uint32_t, Bytes / 4>;
  *static_cast<word*>(smem) = *static_cast<const word*>(gmem);
#endif
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `pending` (0..3) of this thread's newest copy groups are unfinished.
__device__ __forceinline__ void copy_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
  }
#else
  (void)pending;
#endif
}

// Random bits of the four elements i .. i+3 (rng.bits of each), in registers: one Philox block
// when i is a multiple of four, else the two blocks the four straddle.
__device__ __forceinline__ void chunk_bits(const emu::random_stream& rng, std::uint64_t i,
                                           std::uint32_t (&out)[4]) {
  const emu::philox_block b0 = rng.block(i >> 2);
  const unsigned s = static_cast<unsigned>(i & 3u);
  if (s == 0) {
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = b0.v[e];
    return;
  }
  const emu::philox_block b1 = rng.block((i >> 2) + 1);
  const std::uint32_t w[8] = {b0.v[0], b0.v[1], b0.v[2], b0.v[3],
                              b1.v[0], b1.v[1], b1.v[2], b1.v[3]};
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // w[s + e] by selects (a dynamic index would go to local memory)
    std::uint32_t r = w[e + 1];
#pragma unroll
    for (int k = 2; k <= 3; ++k) r = s == static_cast<unsigned>(k) ? w[e + k] : r;
    out[e] = r;
  }
}

// Row segments of up to 256 * E elements: a segment owns `seg_lanes` adjacent lanes (a power of
// two, <= 256, the block), and its elements are cut into chunks of four, chunk j of the segment
// going to lane j % seg_lanes: each thread holds E / 4 chunks, and a warp's load of one chunk per
// lane touches whole 32-byte sectors. The segment's amax is reduced by shuffles within a warp and,
// for segments longer than a warp, through shared memory; the elements are then encoded from
// registers, so x is read once. Blocks are (bx x by) with bx a power of two >= seg_lanes, so
// segments never straddle blocks or warps unevenly. Which lane holds which element does not
// change any result bit.
//
// A block walks its segments (lane blocks inner, row blocks outer). Where rows allow 16-byte
// (float) or 8-byte (16-bit inputs) chunks, the chunks are staged through shared memory by
// asynchronous copies `stages - 1` segments ahead of the one being encoded: memory then has that
// many segments of every thread in flight while the SM computes, without holding them in
// registers (with loads into registers, a thread's bytes in flight were bounded by its registers,
// and DRAM idled through the arithmetic). Other rows load element by element, unstaged.
template <int E, class In>
inline constexpr int stage_bytes = threads * E * static_cast<int>(sizeof(In));
template <class Rule>
inline constexpr int staging_offset = (shared_bytes_of<Rule> + 15) / 16 * 16;

template <int E, class Rule, class In, class Code>
__global__ void __launch_bounds__(threads, segment_min_blocks<Rule, E>)
    segment_kernel(const In* __restrict__ x, std::int64_t xrs, Code* __restrict__ codes,
                   std::int64_t crs, typename Rule::scale_type* __restrict__ scales, std::int64_t rows,
                   std::int64_t cols, std::int64_t k, int seg_shift, std::int64_t lanes_per_row,
                   bool vector, int stages, Rule rule_in, emu::random_stream rng) {
  static_assert(E % 4 == 0, "whole chunks of four");
  constexpr int J = E / 4;  // chunks per thread
  using chunk = vec<In, 4>;
  const Rule rule = in_shared(rule_in);
  __shared__ __align__(16) std::uint32_t warp_max_smem[threads / 32];
  const int seg_lanes = 1 << seg_shift;
  const std::int64_t nseg = (cols + k - 1) / k;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int chunk_lane = threadIdx.x & (seg_lanes - 1);
  const std::int64_t row_step = static_cast<std::int64_t>(gridDim.y) * blockDim.y;
  const std::int64_t lane_step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t lane_first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x;

  // Where this thread's part of the segment at (row block rb0, lane block lb0) lies: its row r,
  // segment seg, first column c0, and len, the elements of the segment that exist (k, fewer in a
  // row's last, partial segment, 0 past the rows).
  struct place {
    std::int64_t r, seg, c0;
    int len;
  };
  const auto place_of = [&](std::int64_t rb0, std::int64_t lb0) {
    place p;
    p.r = rb0 + threadIdx.y;
    p.seg = (lb0 + threadIdx.x) >> seg_shift;
    p.c0 = p.seg * k;
    p.len = p.r < rows && p.seg < nseg ? static_cast<int>(min(k, cols - p.c0)) : 0;
    return p;
  };
  const auto offset = [&](int j) { return (j * seg_lanes + chunk_lane) * 4; };  // of chunk j
  const auto next = [&](std::int64_t& rb0, std::int64_t& lb0) {
    lb0 += lane_step;
    if (lb0 >= lanes_per_row) {
      lb0 = lane_first;
      rb0 += row_step;
    }
  };

  // The segment's amax, its scale and codes from v[] (elements that do not exist are 0 there,
  // which leaves the maximum of |x| bits alone). Every thread of the block calls it: the
  // reduction may synchronize.
  const auto encode = [&](const place& p, const float (&v)[E]) {
    std::uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) m = max(m, abs_bits(v[e]));
    if (seg_lanes < 32) {
      for (int o = 1; o < seg_lanes; o <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    } else {
      m = warp_max(m);
      if (seg_lanes > 32) {  // block-uniform: the segment spans 2, 4 or all 8 warps
        __syncthreads();
        if ((tid & 31) == 0) warp_max_smem[tid >> 5] = m;
        __syncthreads();
        const int warp = tid >> 5, nw = seg_lanes >> 5;
        const uint4 lo = *reinterpret_cast<const uint4*>(&warp_max_smem[0]);
        const uint4 hi = *reinterpret_cast<const uint4*>(&warp_max_smem[4]);
        if (nw == 8) {
          m = max(max(max(lo.x, lo.y), max(lo.z, lo.w)), max(max(hi.x, hi.y), max(hi.z, hi.w)));
        } else {  // an aligned two or four within the block's first or second four warps
          const uint4 w4 = warp < 4 ? lo : hi;
          const int first = warp & ~(nw - 1) & 3;  // the segment's first warp within the four
          const std::uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) m = q >= first && q < first + nw ? max(m, w[q]) : m;
        }
      }
    }
    if (p.len == 0) return;
    const auto grp = rule.begin(m);
    if (chunk_lane == 0) scales[p.r * nseg + p.seg] = rule.stored(grp);
    const std::uint64_t base = static_cast<std::uint64_t>(p.r * cols + p.c0);
    Code* cs = codes + p.r * crs + p.c0;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int off = offset(j);
      std::uint32_t rbits[4] = {};
      if (rule.stochastic()) chunk_bits(rng, base + static_cast<std::uint64_t>(off), rbits);
      vec<Code, 4> w;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w.v[e] = static_cast<Code>(rule.element(grp, v[j * 4 + e], rbits[e]));
      if (vector) {
        if (off < p.len) *reinterpret_cast<vec<Code, 4>*>(cs + off) = w;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (off + e < p.len) cs[off + e] = w.v[e];
      }
    }
  };

  // lane_first < lanes_per_row (launch_segments sizes the grid so), so a block has work iff its
  // first row block exists; the loop conditions are block-uniform.
  std::int64_t rb0 = static_cast<std::int64_t>(blockIdx.y) * blockDim.y, lb0 = lane_first;
  float v[E];
  if (!vector) {  // k, cols or a row start not a multiple of 4, or x not aligned to a chunk
    for (; rb0 < rows; next(rb0, lb0)) {
      const place p = place_of(rb0, lb0);
      const In* xs = x + p.r * xrs + p.c0;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          v[j * 4 + e] = offset(j) + e < p.len ? cast_ops::load(xs[offset(j) + e]) : 0.0f;
      encode(p, v);
    }
    return;
  }
  // Staging slot of chunk j of stage s for this thread: consecutive threads, consecutive chunks.
  chunk* const staging =
      reinterpret_cast<chunk*>(group_pass::group_shared() + staging_offset<Rule>) + tid;
  const auto slot = [&](int s, int j) { return staging + (s * J + j) * threads; };
  // Copies the chunks of the segment at (rb0, lb0) that exist into stage s, as one copy group
  // (empty past the rows: every position commits one group, so the wait below counts evenly).
  const auto stage_in = [&](std::int64_t srb0, std::int64_t slb0, int s) {
    if (srb0 < rows) {
      const place p = place_of(srb0, slb0);
      const In* xs = x + p.r * xrs + p.c0;
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (offset(j) < p.len) copy_async<sizeof(chunk)>(slot(s, j), xs + offset(j));
    }
    copy_commit();
  };
  std::int64_t arb0 = rb0, alb0 = lb0;  // the next segment to stage
  for (int s = 0; s < stages - 1; ++s, next(arb0, alb0)) stage_in(arb0, alb0, s);
  int s_read = 0, s_write = stages - 1;
  for (; rb0 < rows; next(rb0, lb0)) {
    stage_in(arb0, alb0, s_write);
    next(arb0, alb0);
    copy_wait(stages - 1);  // this segment's group is done (stages - 1 newer ones may not be)
    const place p = place_of(rb0, lb0);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      chunk w = {};
      if (offset(j) < p.len) w = *slot(s_read, j);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[j * 4 + e] = cast_ops::load(w.v[e]);
    }
    encode(p, v);
    s_read = s_read + 1 == stages ? 0 : s_read + 1;
    s_write = s_write + 1 == stages ? 0 : s_write + 1;
  }
}

// Blocks of `kernel` resident per SM with `smem` bytes of dynamic shared memory, after opting
// in to that much where it exceeds the default 48 KiB; asked once per kernel and device. The
// group-pass kernels launch about this many blocks per SM, each walking many groups, so that
// table copies stay few and no partial second wave runs.
template <auto kernel>
int resident_blocks(int block_threads, int smem) {
  constexpr int max_devices = 64;
  static std::atomic<int> known[max_devices] = {};  // 0: not asked yet
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < max_devices && known[dev].load(std::memory_order_relaxed) > 0)
    return known[dev].load(std::memory_order_relaxed);
  // Opted in whatever the size: a kernel's static shared memory counts against the default
  // 48 KiB too.
  if (smem > 0)
    LOWBIT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int n = 0;
  LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block_threads, smem));
  n = std::max(n, 1);
  if (dev < max_devices) known[dev].store(n, std::memory_order_relaxed);
  return n;
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
  const int seg_shift = log2_ceil((k + E - 1) / E), seg_lanes = 1 << seg_shift;
  if (seg_lanes > threads)  // launch_groups picks E so that it never is
    throw error(errc::unsupported, "group pass: a segment of more lanes than a block has");
  const std::int64_t nseg = (xm.cols + k - 1) / k;
  const std::int64_t lanes_per_row = nseg * seg_lanes;
  const int bx = static_cast<int>(std::min<std::int64_t>(
      threads, std::max<std::int64_t>(seg_lanes, std::int64_t{1} << log2_ceil(lanes_per_row))));
  const int by = threads / bx;
  constexpr auto kernel = segment_kernel<E, Rule, In, Code>;
  // Three stages (two segments in flight per thread) where two blocks still fit on a
  // multiprocessor, else two, else one (no overlap: GPUs with 64 KiB of shared memory and
  // 32 elements per thread) where a block's shared memory allows no more; the same shared memory
  // whether or not the rows allow staging, so that the occupancy asked once per kernel and
  // device holds for every launch.
  const auto smem_for = [](int s) { return staging_offset<Rule> + s * stage_bytes<E, In>; };
  int stages = 3;
  if (smem_for(3) > max_shared_per_block() || 2 * (smem_for(3) + 1024) > max_shared_per_sm())
    stages = 2;
  while (stages > 1 && smem_for(stages) > max_shared_per_block()) --stages;
  const int smem = smem_for(stages);
  // As many blocks as fit on the device at once, each walking its share of the segments.
  const std::int64_t resident = std::int64_t{sm_count()} * resident_blocks<kernel>(threads, smem);
  const std::int64_t gx = std::min<std::int64_t>((lanes_per_row + bx - 1) / bx, resident);
  const std::int64_t gy = std::min<std::int64_t>(
      {(xm.rows + by - 1) / by, std::max<std::int64_t>(1, resident / gx), 65535});
  const bool vector = k % 4 == 0 && xm.cols % 4 == 0 && xm.row_stride % 4 == 0 &&
                      cm.row_stride % 4 == 0 && aligned_to<In>(x, sizeof(In) * 4) &&
                      aligned_to<Code>(codes, sizeof(Code) * 4);
  kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(bx, by), smem,
           stream>>>(x, xm.row_stride, codes, cm.row_stride, scales, xm.rows, xm.cols, k,
                     seg_shift, lanes_per_row, vector, stages, rule, rng);
  check_launch("segment_kernel");
}

// Launches the right group-pass kernel for row segments or tiles: segments of up to 4096
// elements with 16 per thread (a segment then spans at most the block's eight warps), longer
// ones and 2-D tiles one block per group.
template <class Rule, class In, class Code>
void launch_groups(const In* x, const matrix_shape& xm, Code* codes, const matrix_shape& cm,
                   typename Rule::scale_type* scales, std::int64_t gr, std::int64_t gc,
                   const Rule& rule, const emu::random_stream& rng, cudaStream_t stream) {
  if (xm.rows == 0 || xm.cols == 0) return;
  constexpr int E = segment_elements_of<Rule>;
  if (gr == 1 && gc <= E * threads)
    return launch_segments<E>(x, xm, codes, cm, scales, gc, rule, rng, stream);
  const std::int64_t width = std::min(gc, xm.cols);
  const int lanes_log2 = std::min(8, log2_ceil(std::max<std::int64_t>(width, 1)));
  const group_geometry geo{xm.rows, xm.cols, gr, gc, (xm.cols + gc - 1) / gc};
  const std::int64_t groups = ((xm.rows + gr - 1) / gr) * geo.scale_cols;
  constexpr auto kernel = group_block_kernel<Rule, In, Code>;
  const std::int64_t cap =
      shared_bytes_of<Rule> > 0
          ? std::int64_t{sm_count()} * resident_blocks<kernel>(threads, shared_bytes_of<Rule>)
          : std::int64_t{1} << 30;
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(groups, cap));
  kernel<<<grid, threads, shared_bytes_of<Rule>, stream>>>(
      x, xm.row_stride, codes, cm.row_stride, scales, geo, lanes_log2, rule, rng);
  check_launch("group_block_kernel");
}

}  // namespace group_pass

using group_pass::launch_groups;

}  // namespace lowbit::kernels::cuda
