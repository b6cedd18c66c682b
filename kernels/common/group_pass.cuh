// One pass per group for the techniques that scale groups of elements by their absolute maximum
// (quantization by rows, blocks, tiles and OCP MX; block-wise codebook quantization): the group's
// amax, then every element encoded from it, x read once. A technique supplies a rule:
//
//   struct rule {
//     using scale_type = ...;                                   // what scales[] holds per group
//     __device__ group begin(std::uint32_t amax_bits) const;    // per-group state from |x| max
//     bits
//     __device__ scale_type stored(const group&) const;         // the group's scales[] entry
//     __device__ std::uint32_t element(const group&, float x, std::uint32_t rbits) const;
//     __device__ bool stochastic() const;                       // whether rbits are drawn
//     // optional: a group whose every element gets one code (the kernels then call element()
//     // for none of its elements, so element() may assume that its group is not one)
//     __device__ bool uniform(const group&, std::uint32_t& code) const;
//     // optional: groups whose elements take a second form of element() (the kernels call
//     // slow_element() for every element of a group where slow() holds, element() for none)
//     __device__ bool slow(const group&) const;
//     __device__ std::uint32_t slow_element(const group&, float x, std::uint32_t rbits) const;
//   };
//
// The amax is a maximum of |x| bit patterns (NaN above Inf above every finite value): exact and
// order-free, so every reduction tree gives the same bits as the CPU twins' loops. Element i of
// the input (row-major logical index r * cols + c) draws rng.bits(i), whatever thread holds it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "async_copy.cuh"
#include "cuda_map.cuh"
#include "element_ops.hpp"
#include "matrix.hpp"

namespace lowbit::kernels::cuda {

namespace group_pass {

constexpr int threads = 256;

struct group_geometry {
  std::int64_t rows, cols; // input extent
  std::int64_t gr, gc;     // group extent (the last group in a row/column may be partial)
  std::int64_t scale_cols; // groups per group-row
};

__device__ __forceinline__ std::uint32_t abs_bits(float x) {
  return emu::detail::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
}

// Rules may keep tables in shared memory: a rule with `static constexpr int shared_bytes` gets
// that much dynamic shared memory (group_shared()), and the kernels use what `rule.to_shared()`
// returns (called by every thread, which fills its share; a barrier follows) in its place: the
// rule itself, or a rule of another type (the kernel's parameter may then carry tables, read in
// place: the kernels take their rule as a __grid_constant__ parameter, which is never copied).
// Reading the tables through group_shared() itself, rather than a pointer kept in the rule, lets
// the compiler address shared memory directly.
__device__ __forceinline__ unsigned char* group_shared() {
  extern __shared__ __align__(16) unsigned char group_shared_bytes[];
  return group_shared_bytes;
}

// Whether every element of group g gets one code (the rule's optional `uniform`), and which.
template <class Rule, class Group>
__device__ __forceinline__ bool uniform_group(const Rule& rule, const Group& g,
                                              std::uint32_t& code) {
  if constexpr (requires { rule.uniform(g, code); })
    return rule.uniform(g, code);
  else
    return false;
}

// Whether group g takes the rule's slow_element() (the rule's optional `slow`), and the code of
// x in g from the form that g takes.
template <class Rule, class Group>
__device__ __forceinline__ bool slow_group(const Rule& rule, const Group& g) {
  if constexpr (requires { rule.slow(g); })
    return rule.slow(g);
  else
    return false;
}
template <class Rule, class Group>
__device__ __forceinline__ std::uint32_t element_of(const Rule& rule, const Group& g, bool slow,
                                                    float x, std::uint32_t rbits) {
  if constexpr (requires { rule.slow(g); })
    if (slow)
      return rule.slow_element(g, x, rbits);
  return rule.element(g, x, rbits);
}

// Rules with byte codes may return each code (of element() and uniform()) in a higher byte of
// the word, `static constexpr int code_byte` (0 by default), where their arithmetic leaves it:
// the flat kernel's byte permutes pick it there with no shift.
template <class Rule>
inline constexpr int code_byte_of = [] {
  if constexpr (requires { Rule::code_byte; })
    return Rule::code_byte;
  else
    return 0;
}();
template <class Rule, class Code> __device__ __forceinline__ Code code_value(std::uint32_t word) {
  static_assert(code_byte_of<Rule> == 0 || sizeof(Code) == 1, "a code byte for byte codes only");
  return static_cast<Code>(word >> (8 * code_byte_of<Rule>));
}

template <class Rule>
inline constexpr int shared_bytes_of = [] {
  if constexpr (requires { Rule::shared_bytes; })
    return Rule::shared_bytes;
  else
    return 0;
}();

template <class Rule> __device__ __forceinline__ auto in_shared(const Rule& rule) {
  if constexpr (shared_bytes_of < Rule >> 0) {
    const auto r = rule.to_shared();
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
                       std::int64_t crs, typename Rule::scale_type* __restrict__ scales,
                       group_geometry geo, int lanes_log2, const __grid_constant__ Rule rule_in,
                       emu::random_stream rng) {
  const auto rule = in_shared(rule_in);
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
        m = max(m, abs_bits(element_ops::load(x[r * xrs + c])));
    m = block_max(m);
    const auto grp = rule.begin(m);
    if (threadIdx.x == 0)
      scales[g] = rule.stored(grp);
    std::uint32_t same = 0;
    const bool uniform = uniform_group(rule, grp, same), slow = slow_group(rule, grp);
    for (std::int64_t r = r0 + row_in_step; r < r1; r += rows_per_step)
      for (std::int64_t c = c0 + lane; c < c1; c += lanes) {
        if (uniform) {
          codes[r * crs + c] = code_value<Rule, Code>(same);
          continue;
        }
        const std::uint32_t rb =
            rule.stochastic() ? rng.bits(static_cast<std::uint64_t>(r * geo.cols + c)) : 0u;
        codes[r * crs + c] = code_value<Rule, Code>(
            element_of(rule, grp, slow, element_ops::load(x[r * xrs + c]), rb));
      }
  }
}

constexpr int log2_of(int v) {
  return v <= 1 ? 0 : 1 + log2_of(v / 2);
}

// Elements per thread of the flat kernel, and the blocks per SM that it and the segment kernel
// (with four chunks per thread) are compiled for: 4, that is at most 64 registers (the
// block-wise kernels, whose tables take shared memory, also fit four blocks per SM with two
// stages).
constexpr int elements_per_thread = 16;
constexpr int min_blocks = 4;
// Threads of the flat kernel's blocks: one block per SM, so that the rules' shared tables are
// held once per SM and the stages get the rest (its warps run independently; see there).
constexpr int flat_threads = 1024;

// The maximum of |v[i]| as bits (abs_bits), in fewer operations and a shorter chain than a loop
// over abs_bits: as signed integers the largest bits are those of the largest |v| among the
// positive v (or, if none is positive, of the largest |v| among the negative ones); as unsigned
// integers those of the largest |v| among the negative v (or, if none is negative, among the
// positive ones). The larger of the two without its sign bit is the maximum, both trees balanced.
template <int N>
__device__ __forceinline__ std::uint32_t abs_max_bits_of_ints(const float (&v)[N]) {
  static_assert(N >= 2 && (N & (N - 1)) == 0);
  std::int32_t s[N];
  std::uint32_t u[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    s[i] = __float_as_int(v[i]);
    u[i] = __float_as_uint(v[i]);
  }
#pragma unroll
  for (int w = N / 2; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      if (i < w) {
        s[i] = max(s[i], s[i + w]);
        u[i] = max(u[i], u[i + w]);
      }
  return max(static_cast<std::uint32_t>(s[0]) & 0x7FFFFFFFu, u[0] & 0x7FFFFFFFu);
}

// The same in one tree on sm_80+: the float maximum of |v[i]| that propagates NaN (max.NaN, the
// absolute values folded into its operands) is, as bits, the maximum of the abs_bits unless some
// v[i] is NaN; then (its result the canonical NaN) the integer trees give the NaN's own bits.
template <int N> __device__ __forceinline__ std::uint32_t abs_max_bits(const float (&v)[N]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float m[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i)
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(m[i]) : "f"(fabsf(v[i])), "f"(fabsf(v[i + N / 2])));
#pragma unroll
  for (int w = N / 4; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      if (i < w)
        asm("max.NaN.f32 %0, %1, %2;" : "=f"(m[i]) : "f"(m[i]), "f"(m[i + w]));
  const std::uint32_t bits = __float_as_uint(m[0]);
  if (bits <= 0x7F800000u)
    return bits;
#endif
  return abs_max_bits_of_ints(v);
}

// The maximum of v over the aligned 2^gl lanes of this lane's group (all 32 for gl >= 5): a
// whole-warp group by one warp reduction on sm_80+ (its result is warp-uniform; groups within a
// warp would take the instruction's slow, divergent form), smaller groups by butterfly shuffles
// over every lane bit that a group of 16 (or, before sm_80, 32) lanes has, each with the lane
// bits past the group masked off (a shuffle with itself): straight-line code, which the compiler
// checks for a converged warp once, not per shuffle.
__device__ __forceinline__ std::uint32_t lanes_max(std::uint32_t v, int gl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (gl >= 5)
    return __reduce_max_sync(0xFFFFFFFFu, v);
  constexpr int bits = 4;
#else
  constexpr int bits = 5;
#endif
  const unsigned group_lanes = (1u << gl) - 1u;
#pragma unroll
  for (int l = 0; l < bits; ++l)
    v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, (1u << l) & group_lanes));
  return v;
}

// The flat kernel's meeting of a group's warps: an mbarrier in shared memory (sm_80+, by its
// shared address), with one arrival per warp (lane 0, after its part[] write, which the arrival
// releases) and a wait by every lane for the phase of the given parity (which acquires the other
// warps' writes).
__device__ __forceinline__ void mbarrier_init(std::uint32_t bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" : : "r"(bar), "r"(count) : "memory");
#else
  (void)bar, (void)count;
#endif
}
__device__ __forceinline__ void mbarrier_arrive(std::uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}"
               :
               : "r"(bar)
               : "memory");
#else
  (void)bar;
#endif
}
__device__ __forceinline__ void mbarrier_wait(std::uint32_t bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  std::uint32_t done = 0;
  do { // (try_wait, which suspends the warp for a while, measured slower here)
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (done == 0);
#else
  (void)bar, (void)parity;
#endif
}

// Shared memory by address (shared_address), for addresses kept in registers.
__device__ __forceinline__ void store_shared(std::uint32_t at, std::uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" : : "r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ uint2 load_shared_8(std::uint32_t at) {
  uint2 w;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(w.x), "=r"(w.y) : "r"(at) : "memory");
  return w;
}
__device__ __forceinline__ uint4 load_shared_16(std::uint32_t at) {
  uint4 w;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
               : "r"(at)
               : "memory");
  return w;
}

// Byte B of c0 .. c3 as one word, by byte permutes (which select a byte where it lies).
template <int B>
__device__ __forceinline__ std::uint32_t pack_bytes(std::uint32_t c0, std::uint32_t c1,
                                                    std::uint32_t c2, std::uint32_t c3) {
  constexpr unsigned pair = ((4u + B) << 4) | B;
  return __byte_perm(__byte_perm(c0, c1, pair), __byte_perm(c2, c3, pair), 0x5410u);
}

// Random bits of the four elements i .. i+3 (rng.bits of each), in registers: one Philox block
// when i is a multiple of four, else the two blocks the four straddle.
__device__ __forceinline__ void chunk_bits(const emu::random_stream& rng, std::uint64_t i,
                                           std::uint32_t (&out)[4]) {
  const emu::philox_block b0 = rng.block(i >> 2);
  const unsigned s = static_cast<unsigned>(i & 3u);
  if (s == 0) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[e] = b0.v[e];
    return;
  }
  const emu::philox_block b1 = rng.block((i >> 2) + 1);
  const std::uint32_t w[8] = {b0.v[0], b0.v[1], b0.v[2], b0.v[3],
                              b1.v[0], b1.v[1], b1.v[2], b1.v[3]};
#pragma unroll
  for (int e = 0; e < 4; ++e) { // w[s + e] by selects (a dynamic index would go to local memory)
    std::uint32_t r = w[e + 1];
#pragma unroll
    for (int k = 2; k <= 3; ++k)
      r = s == static_cast<unsigned>(k) ? w[e + k] : r;
    out[e] = r;
  }
}

// Row segments of up to 256 * J * C elements, C = chunk_elements<In> the elements of a 16-byte
// chunk (4 floats, 8 16-bit floats): a segment owns `seg_lanes` adjacent lanes (a power of two,
// <= 256, the block), and its elements are cut into chunks of C, chunk j of the segment going to
// lane j % seg_lanes: each thread holds J chunks (64 bytes for J = 4, 128 for J = 8), and a warp's
// load of one chunk per lane touches whole 32-byte sectors. The segment's amax is reduced by
// shuffles within a warp and, for segments longer than a warp, through shared memory at one
// barrier per segment; the elements are then encoded from registers, so x is read once. Chunks
// past the segment's end are neither loaded nor encoded: where a segment does not fill its lanes'
// chunks, whole warps skip their last ones. Blocks are (bx x by) with bx a power of two >=
// seg_lanes, so segments never straddle blocks or warps unevenly. Which lane holds which element
// does not change any result bit.
//
// A block walks its segments (lane blocks inner, row blocks outer). Where rows allow (lengths,
// row strides and pointers in multiples of 4 elements), the chunks are staged through shared
// memory by asynchronous copies `stages - 1` segments ahead of the one being encoded: memory then
// has that many segments of every thread in flight while the SM computes, without holding them in
// registers (with loads into registers, a thread's bytes in flight were bounded by its registers,
// and DRAM idled through the arithmetic). A chunk is one 16-byte copy where rows allow whole
// chunks (`wide`), else, for 16-bit inputs, two 8-byte halves, the second where it exists (rows
// whose lengths are multiples of 4 but not 8, or that are only 8-byte aligned). Other rows load
// element by element, unstaged.
template <class In> inline constexpr int chunk_elements = 16 / static_cast<int>(sizeof(In));
template <int J> inline constexpr int stage_bytes = threads* J * 16;
template <class Rule> inline constexpr int staging_offset = (shared_bytes_of<Rule> + 15) / 16 * 16;
// J = 8 holds 32 registers of elements: three blocks per SM (at most 80 registers).
template <int J> inline constexpr int segment_min_blocks = J <= 4 ? min_blocks : 3;

// The maximum of |x| bits (abs_bits of the element values) of J chunks. 16-bit inputs by
// maxima of their magnitude bits, two halfwords per instruction: their values are symmetric in
// the sign and never decrease as those bits grow (bfloat16 is a float's high half; float16's
// NaNs all decode to one NaN above Inf), so the largest magnitude bits give the largest |x| bits.
template <int J, class In>
__device__ __forceinline__ std::uint32_t chunks_abs_max(const vec<In, chunk_elements<In>> (&w)[J]) {
  constexpr int C = chunk_elements<In>;
  if constexpr (sizeof(In) == 2) {
    constexpr int N = J * 4; // words
    std::uint32_t u[N];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      uint4 q;
      __builtin_memcpy(&q, &w[j], sizeof(q));
      u[j * 4] = q.x & 0x7FFF7FFFu;
      u[j * 4 + 1] = q.y & 0x7FFF7FFFu;
      u[j * 4 + 2] = q.z & 0x7FFF7FFFu;
      u[j * 4 + 3] = q.w & 0x7FFF7FFFu;
    }
#pragma unroll
    for (int s = N / 2; s >= 1; s /= 2)
#pragma unroll
      for (int i = 0; i < N / 2; ++i)
        if (i < s)
          u[i] = __vmaxu2(u[i], u[i + s]);
    const std::uint32_t m = max(u[0] & 0xFFFFu, u[0] >> 16);
    return abs_bits(element_ops::load(In{static_cast<std::uint16_t>(m)}));
  } else {
    float v[J * C];
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < C; ++e)
        v[j * C + e] = element_ops::load(w[j].v[e]);
    return abs_max_bits(v);
  }
}

// Element e of a chunk as its float value (element_ops::load): bfloat16 straight from the
// chunk's words, the high half by a mask, the low one by a shift.
template <class In, int C>
__device__ __forceinline__ float chunk_value(const vec<In, C>& w, int e) {
  if constexpr (std::is_same_v<In, element_ops::bf16_bits>) {
    std::uint32_t q[C / 2];
    __builtin_memcpy(q, &w, sizeof(q));
    return __uint_as_float(e % 2 == 0 ? q[e / 2] << 16 : q[e / 2] & 0xFFFF0000u);
  } else {
    return element_ops::load(w.v[e]);
  }
}

// Stores the codes c[from .. from + N - 1] at out (N = 4 or 8 codes, aligned to their size):
// byte codes packed into words by byte permutes, stored as words.
template <class Rule, class Code, int N, int M>
__device__ __forceinline__ void store_codes(Code* out, const std::uint32_t (&c)[M], int from) {
  static_assert(N == 4 || N == 8);
  if constexpr (sizeof(Code) == 1) {
    constexpr int B = code_byte_of<Rule>;
    const auto word = [&](int q) {
      return pack_bytes<B>(c[from + 4 * q], c[from + 4 * q + 1], c[from + 4 * q + 2],
                           c[from + 4 * q + 3]);
    };
    if constexpr (N == 8)
      *reinterpret_cast<uint2*>(out) = make_uint2(word(0), word(1));
    else
      *reinterpret_cast<std::uint32_t*>(out) = word(0);
  } else {
    vec<Code, N> w;
#pragma unroll
    for (int e = 0; e < N; ++e)
      w.v[e] = code_value<Rule, Code>(c[from + e]);
    *reinterpret_cast<vec<Code, N>*>(out) = w;
  }
}

template <int J, class Rule, class In, class Code>
__global__ void __launch_bounds__(threads, segment_min_blocks<J>)
    segment_kernel(const In* __restrict__ x, std::int64_t xrs, Code* __restrict__ codes,
                   std::int64_t crs, typename Rule::scale_type* __restrict__ scales,
                   std::int64_t rows, std::int64_t cols, std::int64_t k, int seg_shift,
                   std::int64_t lanes_per_row, bool vector, bool wide, int stages,
                   const __grid_constant__ Rule rule_in, emu::random_stream rng) {
  constexpr int C = chunk_elements<In>;
  static_assert(C == 4 || C == 8, "float32 or 16-bit inputs");
  using chunk = vec<In, C>;
  const auto rule = in_shared(rule_in);
  // Warp maxima of segments that span warps, by the parity of the block's segments: a warp
  // writes one half for segment t after the barrier of segment t - 1, which every warp reaches
  // only after reading that half for segment t - 2.
  __shared__ __align__(16) std::uint32_t warp_max_smem[2][threads / 32];
  int parity = 0;
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
  const auto offset = [&](int j) { return (j * seg_lanes + chunk_lane) * C; }; // of chunk j
  const auto next = [&](std::int64_t& rb0, std::int64_t& lb0) {
    lb0 += lane_step;
    if (lb0 >= lanes_per_row) {
      lb0 = lane_first;
      rb0 += row_step;
    }
  };

  // The segment's amax, its scale and codes from w[] (elements that do not exist are 0 there,
  // which leaves the maximum of |x| bits alone). Every thread of the block calls it: the
  // reduction may synchronize.
  const auto encode = [&](const place& p, const chunk(&w)[J]) {
    // Within a warp by lanes_max, across warps through shared memory.
    std::uint32_t m = lanes_max(chunks_abs_max<J>(w), seg_shift < 5 ? seg_shift : 5);
    if (seg_lanes > 32) { // block-uniform: the segment spans 2, 4 or all 8 warps
      std::uint32_t* const part = warp_max_smem[parity];
      parity ^= 1;
      if ((tid & 31) == 0)
        part[tid >> 5] = m;
      __syncthreads();
      const int warp = tid >> 5, nw = seg_lanes >> 5;
      const uint4 lo = *reinterpret_cast<const uint4*>(&part[0]);
      const uint4 hi = *reinterpret_cast<const uint4*>(&part[4]);
      if (nw == 8) {
        m = max(max(max(lo.x, lo.y), max(lo.z, lo.w)), max(max(hi.x, hi.y), max(hi.z, hi.w)));
      } else { // an aligned two or four within the block's first or second four warps
        const uint4 w4 = warp < 4 ? lo : hi;
        const int first = warp & ~(nw - 1) & 3; // the segment's first warp within the four
        const std::uint32_t q4[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
          m = q >= first && q < first + nw ? max(m, q4[q]) : m;
      }
    }
    if (p.len == 0)
      return;
    const auto grp = rule.begin(m);
    if (chunk_lane == 0)
      scales[p.r * nseg + p.seg] = rule.stored(grp);
    const std::uint64_t base = static_cast<std::uint64_t>(p.r * cols + p.c0);
    Code* cs = codes + p.r * crs + p.c0;
    std::uint32_t same = 0;
    const bool uniform = uniform_group(rule, grp, same), slow = slow_group(rule, grp);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int off = offset(j);
      if (off >= p.len)
        continue; // past the segment's end
      std::uint32_t c[C];
#pragma unroll
      for (int h = 0; h < C; h += 4) {
        if (uniform) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            c[h + e] = same;
          continue;
        }
        std::uint32_t rbits[4] = {};
        if (rule.stochastic())
          chunk_bits(rng, base + static_cast<std::uint64_t>(off + h), rbits);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          c[h + e] = element_of(rule, grp, slow, chunk_value(w[j], h + e), rbits[e]);
      }
      if (!vector) {
#pragma unroll
        for (int e = 0; e < C; ++e)
          if (off + e < p.len)
            cs[off + e] = code_value<Rule, Code>(c[e]);
      } else if (C == 4 || wide) {
        store_codes<Rule, Code, C>(cs + off, c, 0);
      } else if constexpr (C == 8) { // two halves of four, the second where it exists
        store_codes<Rule, Code, 4>(cs + off, c, 0);
        if (off + 4 < p.len)
          store_codes<Rule, Code, 4>(cs + off + 4, c, 4);
      }
    }
  };

  // lane_first < lanes_per_row (launch_segments sizes the grid so), so a block has work iff its
  // first row block exists; the loop conditions are block-uniform.
  std::int64_t rb0 = static_cast<std::int64_t>(blockIdx.y) * blockDim.y, lb0 = lane_first;
  chunk w[J];
  if (!vector) { // k, cols or a row start not a multiple of 4, or x not aligned to 4 elements
    for (; rb0 < rows; next(rb0, lb0)) {
      const place p = place_of(rb0, lb0);
      const In* xs = x + p.r * xrs + p.c0;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < C; ++e)
          w[j].v[e] = offset(j) + e < p.len ? xs[offset(j) + e] : In{};
      encode(p, w);
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
      for (int j = 0; j < J; ++j) {
        const int off = offset(j);
        if (off >= p.len)
          continue;
        if (C == 4 || wide) {
          copy_async<16>(slot(s, j), xs + off);
        } else {
          copy_async<8>(slot(s, j), xs + off);
          if (off + 4 < p.len)
            copy_async<8>(reinterpret_cast<In*>(slot(s, j)) + 4, xs + off + 4);
        }
      }
    }
    copy_commit();
  };
  std::int64_t arb0 = rb0, alb0 = lb0; // the next segment to stage
  for (int s = 0; s < stages - 1; ++s, next(arb0, alb0))
    stage_in(arb0, alb0, s);
  int s_read = 0, s_write = stages - 1;
  for (; rb0 < rows; next(rb0, lb0)) {
    stage_in(arb0, alb0, s_write);
    next(arb0, alb0);
    copy_wait(stages - 1); // this segment's group is done (stages - 1 newer ones may not be)
    const place p = place_of(rb0, lb0);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int off = offset(j);
      w[j] = chunk{};
      if (off < p.len) {
        w[j] = *slot(s_read, j);
        if constexpr (C == 8)
          if (!wide && off + 4 >= p.len) // the half that was not copied
#pragma unroll
            for (int e = 4; e < 8; ++e)
              w[j].v[e] = In{};
      }
    }
    encode(p, w);
    s_read = s_read + 1 == stages ? 0 : s_read + 1;
    s_write = s_write + 1 == stages ? 0 : s_write + 1;
  }
}

// Flat groups: rows that are one contiguous array (a single row, or rows without padding whose
// length is a multiple of k) cut into groups of k = 2^k_log2 consecutive elements, E <= k <= 4096
// (the OCP MX blocks, the block-wise codebooks' blocks, rows of a power-of-two length). One block
// of flat_threads per SM: a tile of flat_threads * E elements gives each thread E consecutive
// elements, so a group is 2^gl adjacent threads (gl = k_log2 - log2 E): its amax by shuffles or
// a warp reduction, beyond a warp through shared memory and an mbarrier of the group's warps
// only, and the per-group work (scale, stored value) once per thread. With one block per SM, a
// rule's shared tables are held once per SM, and the stages take the rest (three of 64 KiB for
// float32 on the H200: two tiles in flight beside the one being encoded).
//
// Each warp stages its own span of the tile (32 E elements) in 16-byte pieces: piece c of the
// span is copied by lane c % 32, so every warp-wide copy covers one contiguous 512-byte span,
// and lands at the swizzled slot c ^ ((c / 8) % 4) of the warp's part of the stage, so that the
// lanes then read their own E elements back without bank conflicts (each 8-lane phase of a
// 16-byte shared load touches all 32 banks once). A warp reads only what its own lanes copied:
// it waits for its copies and synchronizes with __syncwarp, never with the whole block, so the
// warps of a block run through the tiles independently. Full tiles are staged `stages - 1` tiles
// ahead as in segment_kernel; the last, partial tile (if any) is loaded element by element.
//
// The loop over a block's tiles carries little besides the elements' work: shared-memory
// addresses are computed once and kept in registers (kept()), the stage offsets rotate, and the
// global pointers step by a fixed stride (counted in the SASS along the path of the block-wise
// kernel's blocks of 256: about 160 of 390 instructions per thread and tile outside the
// elements' work before, about 105 of 310 now).
template <class Rule, class In, class Code>
__global__ void __launch_bounds__(flat_threads, 1)
    flat_group_kernel(const In* __restrict__ x, Code* __restrict__ codes,
                      typename Rule::scale_type* __restrict__ scales, std::int64_t n, int k_log2,
                      int stages, const __grid_constant__ Rule rule_in, emu::random_stream rng) {
  constexpr int E = elements_per_thread;
  constexpr int per_piece = 16 / static_cast<int>(sizeof(In)); // elements per 16-byte piece
  constexpr int P = E / per_piece;                             // pieces per thread
  static_assert(P >= 2 && P <= 8 && (P & (P - 1)) == 0, "2, 4 or 8 pieces per thread");
  constexpr int per_store = 16 / static_cast<int>(sizeof(Code)); // codes per 16-byte store
  static_assert(E % per_store == 0 && E % 4 == 0);
  constexpr std::int64_t per_tile = std::int64_t{flat_threads} * E;
  constexpr int span = 32 * P; // pieces of a warp's span
  constexpr std::uint32_t stage_bytes = flat_threads * P * 16;
  using piece = vec<In, per_piece>;
  using scale_type = typename Rule::scale_type;
  // Warp maxima of groups that span warps, by the parity of the warps' encode() calls: a warp
  // writes one half while the slowest warp of its group may still read the other. The group's
  // warps meet at an mbarrier of the group and parity (sm_80+; one arrival per warp), before
  // sm_80 at a barrier of the whole block (every warp encodes every tile). A half of either
  // array is 128 bytes.
  constexpr int warps = flat_threads / 32;
  __shared__ __align__(16) std::uint32_t part[2][warps];
  __shared__ std::uint64_t arrived[2][warps / 2];
  static_assert(sizeof(part[0]) == 128 && sizeof(arrived[0]) == 128);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gl = k_log2 - log2_of(E); // log2 of the threads per group
  const int group_warps_log2 = gl > 5 ? gl - 5 : 0;
  // This warp's slot of part[0], its group's first slot there and its group's arrived[0].
  const std::uint32_t part_at = kept(shared_address(&part[0][warp]));
  const std::uint32_t group_part_at =
      kept(shared_address(&part[0][warp & ~((1 << group_warps_log2) - 1)]));
  const std::uint32_t arrived_at = kept(shared_address(&arrived[0][warp >> group_warps_log2]));
  if (gl > 5) { // block-uniform
    if (tid < warps)
      mbarrier_init(shared_address(&arrived[0][0]) + 8 * tid, 1u << group_warps_log2);
    __syncthreads();
  }
  int meetings = 0; // of this thread's encode() calls so far

  // This block's full tiles: blockIdx.x + t gridDim.x for t < tiles (launch_flat_groups keeps n
  // below 2^45, so that tiles is an int), the thread's E elements of each from i0 on, at a
  // stride of `stride` elements from one tile to the next.
  const std::int64_t full_tiles = n / per_tile;
  const int tiles =
      full_tiles > blockIdx.x ? static_cast<int>((full_tiles - 1 - blockIdx.x) / gridDim.x + 1) : 0;
  const std::int64_t stride = std::int64_t{gridDim.x} * per_tile;
  const auto first_of = [&](std::int64_t t) { // the thread's first element of its tile t
    return (blockIdx.x + t * gridDim.x) * per_tile + tid * E;
  };
  Code* out = codes + first_of(0);
  scale_type* sc = scales + (first_of(0) >> k_log2);
  const std::int64_t sc_stride = stride >> k_log2; // k <= per_tile divides it

  // The swizzle's per-lane parts: piece i * 32 + lane of the warp's span (copied by this lane)
  // goes to slot i * 32 + (lane ^ (lane / 8)); piece lane * P + j (read by it) sits at slot
  // (lane * P ^ ((lane * P / 8) % 4)) ^ j, as j < P carries into no higher bit. Addresses are
  // those of stage 0; stage s lies s * stage_bytes above.
  const std::uint32_t stage0 =
      shared_address(group_pass::group_shared() + staging_offset<Rule>) + warp * span * 16;
  const std::uint32_t copy_at = kept(stage0 + (lane ^ (lane >> 3)) * 16);
  const int read_slot = (lane * P) ^ (((lane * P) >> 3) & 3);
  std::uint32_t read_at[P];
#pragma unroll
  for (int j = 0; j < P; ++j)
    read_at[j] = kept(stage0 + (read_slot ^ j) * 16);
  // The warp's span of the next tile to stage, and how many tiles were staged (one copy group
  // each, empty past this block's tiles, so that the waits count evenly).
  const piece* ahead =
      reinterpret_cast<const piece*>(x + std::int64_t{blockIdx.x} * per_tile) + warp * span + lane;
  const std::int64_t ahead_stride = stride / per_piece;
  int staged = 0;
  const auto stage_next = [&](std::uint32_t offset) {
    if (staged < tiles) {
#pragma unroll
      for (int i = 0; i < P; ++i)
        copy_async<16>(copy_at + offset + i * 32 * 16, ahead + i * 32);
    }
    copy_commit();
    ++staged;
    ahead += ahead_stride;
  };
  // Iteration t reads the stage at `read` and refills the one read in iteration t - 1, `write`.
  const std::uint32_t last = (stages - 1) * stage_bytes;
  for (int s = 0; s < stages - 1; ++s)
    stage_next(s * stage_bytes);
  // The rule's tables (if any) while those tiles stream in.
  const auto rule = in_shared(rule_in);

  // The thread's group maximum from its elements, the group's scale and the codes of its E
  // elements i0 .. i0 + E - 1, stored at out (codes + i0) with the scale at sc
  // (scales + (i0 >> k_log2)); called by every thread of the block (the reduction may
  // synchronize). `full`: the tile lies inside n.
  const auto encode = [&](const float(&v)[E], Code* out, scale_type* sc, std::int64_t i0,
                          bool full) {
    std::uint32_t m = lanes_max(abs_max_bits(v), gl);
    if (gl > 5) { // block-uniform: the group spans an aligned 2, 4 or 8 warps
      // A warp's next write to this half of part[] comes after the group's next meeting, which
      // every warp of the group reaches only after reading this half.
      const std::uint32_t half = (meetings & 1) * 128u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      if (lane == 0) {
        store_shared(part_at + half, m);
        mbarrier_arrive(arrived_at + half);
      }
      mbarrier_wait(arrived_at + half, (meetings >> 1) & 1);
#else
      if (lane == 0)
        store_shared(part_at + half, m);
      __syncthreads();
#endif
      ++meetings;
      if (gl == 6) { // (two slots: 8-byte aligned only)
        const uint2 w = load_shared_8(group_part_at + half);
        m = max(w.x, w.y);
      } else if (gl == 7) {
        const uint4 lo = load_shared_16(group_part_at + half);
        m = max(max(lo.x, lo.y), max(lo.z, lo.w));
      } else {
        const uint4 lo = load_shared_16(group_part_at + half);
        const uint4 hi = load_shared_16(group_part_at + half + 16);
        m = max(max(max(lo.x, lo.y), max(lo.z, lo.w)), max(max(hi.x, hi.y), max(hi.z, hi.w)));
      }
    }
    const auto grp = rule.begin(m);
    if ((tid & ((1 << gl) - 1)) == 0 && (full || i0 < n))
      *sc = rule.stored(grp);
    // The codes code_of(v[i], rbits of element i0 + i), stored (`draw`: whether rbits are drawn).
    const auto store = [&](auto code_of, bool draw) {
#pragma unroll
      for (int h = 0; h < E; h += per_store) {
        std::uint32_t c[per_store];
#pragma unroll
        for (int j = 0; j < per_store; j += 4) {
          std::uint32_t rbits[4] = {};
          if (draw)
            chunk_bits(rng, static_cast<std::uint64_t>(i0 + h + j), rbits);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            c[j + e] = code_of(v[h + j + e], rbits[e]);
        }
        if (full) {
          if constexpr (sizeof(Code) == 1) {
            constexpr int B = code_byte_of<Rule>;
            *reinterpret_cast<uint4*>(out + h) = make_uint4(
                pack_bytes<B>(c[0], c[1], c[2], c[3]), pack_bytes<B>(c[4], c[5], c[6], c[7]),
                pack_bytes<B>(c[8], c[9], c[10], c[11]), pack_bytes<B>(c[12], c[13], c[14], c[15]));
          } else {
            vec<Code, per_store> w;
#pragma unroll
            for (int e = 0; e < per_store; ++e)
              w.v[e] = code_value<Rule, Code>(c[e]);
            *reinterpret_cast<vec<Code, per_store>*>(out + h) = w;
          }
        } else {
#pragma unroll
          for (int e = 0; e < per_store; ++e)
            if (i0 + h + e < n)
              out[h + e] = code_value<Rule, Code>(c[e]);
        }
      }
    };
    std::uint32_t same = 0;
    if (uniform_group(rule, grp, same))
      store([&](float, std::uint32_t) { return same; }, false);
    else if (slow_group(rule, grp)) // (no code where the rule has no slow form)
      store([&](float xv, std::uint32_t rb) { return element_of(rule, grp, true, xv, rb); },
            rule.stochastic());
    else
      store([&](float xv, std::uint32_t rb) { return rule.element(grp, xv, rb); },
            rule.stochastic());
  };

  std::uint32_t read = 0, write = last;
  float v[E];
  for (int t = 0; t < tiles; ++t) {
    if (stages == 1) { // no overlap: this tile's copies now, once every lane read the last
      __syncwarp();
      stage_next(0);
    }
    copy_wait(stages == 3 ? 1 : 0); // this lane's copy group of this tile is done
    // The warp's copies of this tile have landed, and its lanes are done reading the stage
    // refilled next (the one read in the previous iteration).
    __syncwarp();
    if (stages > 1)
      stage_next(write);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const uint4 w4 = load_shared_16(read_at[j] + read);
      piece w;
      static_assert(sizeof(piece) == sizeof(uint4));
      __builtin_memcpy(&w, &w4, sizeof(w));
#pragma unroll
      for (int e = 0; e < per_piece; ++e)
        v[j * per_piece + e] = element_ops::load(w.v[e]);
    }
    encode(v, out, sc, first_of(t), true); // (first_of is needed by stochastic rules only)
    out += stride;
    sc += sc_stride;
    write = read;
    read = read == last ? 0 : read + stage_bytes;
  }
  if (blockIdx.x + std::int64_t{tiles} * gridDim.x == full_tiles && full_tiles * per_tile < n) {
    // the partial tile, by one block, element by element
    const std::int64_t i0 = first_of(tiles);
#pragma unroll
    for (int e = 0; e < E; ++e)
      v[e] = i0 + e < n ? element_ops::load(x[i0 + e]) : 0.0f;
    encode(v, out, sc, i0, false);
  }
}

inline int log2_ceil(std::int64_t v) {
  int l = 0;
  while ((std::int64_t{1} << l) < v)
    ++l;
  return l;
}

// Staging depth and resident blocks per SM of `kernel` with `offset` bytes of tables before
// stages of `bytes` each, asked once per kernel and device: of three and two stages (two or one
// tiles or segments in flight per thread beside the one being encoded), those that fit a block,
// the one with more resident blocks, three on a tie (the block-wise kernels, whose tables take
// shared memory, keep four blocks per SM on the H200 with two stages, three with three); one
// stage (no overlap) only where neither fits (GPUs with 64 KiB of shared memory). The kernels
// reserve the stages whether or not a launch stages, so that the occupancy holds for every
// launch.
//
// LOWBIT_GROUP_STAGES (1, 2 or 3 in the environment, read once per process) caps the depth, so
// that the paths of GPUs with less shared memory (two stages on A100-class GPUs, one where about
// 100 KiB fit a block) run and are tested on any GPU (scripts/device/gpu_checks.sh).
struct staging {
  int stages, blocks;
};
inline int stage_cap() {
  static const int cap = [] {
    const char* v = std::getenv("LOWBIT_GROUP_STAGES");
    return v != nullptr && v[0] >= '1' && v[0] <= '3' && v[1] == '\0' ? v[0] - '0' : 3;
  }();
  return cap;
}
template <auto kernel> staging staging_for(int offset, int bytes, int block_threads = threads) {
  const int k = once_per_device([&](int) { // stages * 4096 + blocks; 4095: none fits
    staging best{1, 0};
    bool opted = false;
    for (int s = 3; s >= 1; --s) {
      const int smem = offset + s * bytes;
      if (smem > max_shared_per_block() || (s == 1 && best.blocks > 0))
        continue;
      if (!opted) { // the largest that fits: every smaller size is allowed then too
        LOWBIT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        opted = true;
      }
      int n = 0;
      LOWBIT_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block_threads, smem));
      if (n > best.blocks)
        best = {s, n};
    }
    return best.blocks == 0 ? 4095 : best.stages * 4096 + best.blocks;
  });
  return k == 4095 ? staging{0, 0} : staging{std::min(k / 4096, stage_cap()), k % 4096};
}

// Launches flat_group_kernel when the problem is flat groups (see there) and the pointers allow
// whole chunks; returns false, launching nothing, otherwise.
template <class Rule, class In, class Code>
bool launch_flat_groups(const In* x, const matrix_shape& xm, Code* codes, const matrix_shape& cm,
                        typename Rule::scale_type* scales, std::int64_t k, const Rule& rule,
                        const emu::random_stream& rng, cudaStream_t stream) {
  constexpr int E = elements_per_thread;
  constexpr std::int64_t per_tile = std::int64_t{flat_threads} * E;
  const bool pow2 = k >= E && k <= 4096 && (k & (k - 1)) == 0;
  const bool flat =
      xm.rows == 1 || (xm.row_stride == xm.cols && cm.row_stride == cm.cols && xm.cols % k == 0);
  const std::int64_t n = xm.rows * xm.cols;
  if (!pow2 || !flat || !aligned_to<In>(x, 16) || !aligned_to<Code>(codes, 16) ||
      n >= (std::int64_t{1} << 45))
    return false;
  constexpr int bytes = flat_threads * E * static_cast<int>(sizeof(In));
  constexpr auto kernel = flat_group_kernel<Rule, In, Code>;
  const staging st = staging_for<kernel>(staging_offset<Rule>, bytes, flat_threads);
  if (st.stages == 0)
    return false; // a block does not fit: the segment kernel
  const int smem = staging_offset<Rule> + st.stages * bytes;
  const std::int64_t tiles = (n + per_tile - 1) / per_tile;
  const std::int64_t resident = std::int64_t{sm_count()} * st.blocks;
  const unsigned grid = static_cast<unsigned>(std::min(tiles, resident));
  kernel<<<grid, flat_threads, smem, stream>>>(x, codes, scales, n, log2_ceil(k), st.stages, rule,
                                               rng);
  check_launch("flat_group_kernel");
  return true;
}

template <int J, class Rule, class In, class Code>
void launch_segments(const In* x, const matrix_shape& xm, Code* codes, const matrix_shape& cm,
                     typename Rule::scale_type* scales, std::int64_t k, const Rule& rule,
                     const emu::random_stream& rng, cudaStream_t stream) {
  constexpr int C = chunk_elements<In>, E = J * C;
  const int seg_shift = log2_ceil((k + E - 1) / E), seg_lanes = 1 << seg_shift;
  if (seg_lanes > threads) // launch_groups picks J so that it never is
    throw error(errc::unsupported, "group pass: a segment of more lanes than a block has");
  const std::int64_t nseg = (xm.cols + k - 1) / k;
  const std::int64_t lanes_per_row = nseg * seg_lanes;
  const int bx = static_cast<int>(std::min<std::int64_t>(
      threads, std::max<std::int64_t>(seg_lanes, std::int64_t{1} << log2_ceil(lanes_per_row))));
  const int by = threads / bx;
  constexpr auto kernel = segment_kernel<J, Rule, In, Code>;
  const staging st = staging_for<kernel>(staging_offset<Rule>, stage_bytes<J>);
  if (st.stages == 0)
    throw error(errc::unsupported, "group pass: a block's shared memory does not fit this GPU");
  const int stages = st.stages, smem = staging_offset<Rule> + stages * stage_bytes<J>;
  // As many blocks as fit on the device at once, each walking its share of the segments.
  const std::int64_t resident = std::int64_t{sm_count()} * st.blocks;
  const std::int64_t gx = std::min<std::int64_t>((lanes_per_row + bx - 1) / bx, resident);
  const std::int64_t gy = std::min<std::int64_t>(
      {(xm.rows + by - 1) / by, std::max<std::int64_t>(1, resident / gx), 65535});
  const auto whole = [&](int n) { // lengths, strides and pointers in multiples of n elements
    return k % n == 0 && xm.cols % n == 0 && xm.row_stride % n == 0 && cm.row_stride % n == 0 &&
           aligned_to<In>(x, sizeof(In) * n) && aligned_to<Code>(codes, sizeof(Code) * n);
  };
  const bool vector = whole(4), wide = vector && whole(C);
  kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(bx, by), smem,
           stream>>>(x, xm.row_stride, codes, cm.row_stride, scales, xm.rows, xm.cols, k, seg_shift,
                     lanes_per_row, vector, wide, stages, rule, rng);
  check_launch("segment_kernel");
}

// Chunks per thread of the segment kernel for rules without shared tables: eight where four do
// not cover a segment, and for 16-bit segments longer than long_16bit_segment (which four chunks
// per thread spread over more than a warp: eight then spread them over fewer warps, so that the
// per-segment work, the barrier included, is shared by more elements), else four.
// LOWBIT_SEGMENT_CHUNKS (4 or 8 in the environment, read once per process) fixes the choice
// wherever both cover the segment, so that both paths run and can be timed on any shape.
constexpr std::int64_t long_16bit_segment = 1024;
inline int segment_chunks() {
  static const int forced = [] {
    const char* v = std::getenv("LOWBIT_SEGMENT_CHUNKS");
    return v != nullptr && (v[0] == '4' || v[0] == '8') && v[1] == '\0' ? v[0] - '0' : 0;
  }();
  return forced;
}

// Launches the right group-pass kernel for row segments or tiles: contiguous runs of groups of a
// power-of-two length from 16 to 4096 (MX blocks, block-wise codebooks, unpadded rows) through the
// flat kernel; other segments through the segment kernel, with four 16-byte chunks per thread up
// to 4096 float32 or 8192 16-bit elements (a segment then spans at most the block's eight warps),
// eight chunks per thread (segment_chunks) up to twice that for rules without shared tables;
// longer ones and 2-D tiles one block per group. Which kernel runs changes no result bit.
template <class Rule, class In, class Code>
void launch_groups(const In* x, const matrix_shape& xm, Code* codes, const matrix_shape& cm,
                   typename Rule::scale_type* scales, std::int64_t gr, std::int64_t gc,
                   const Rule& rule, const emu::random_stream& rng, cudaStream_t stream) {
  if (xm.rows == 0 || xm.cols == 0)
    return;
  if (gr == 1 && launch_flat_groups(x, xm, codes, cm, scales, gc, rule, rng, stream))
    return;
  // Segments of up to four or eight chunks per thread (per_chunks elements each).
  constexpr std::int64_t per_chunks = std::int64_t{threads} * chunk_elements<In>;
  if constexpr (shared_bytes_of<Rule> == 0) {
    const int forced = segment_chunks();
    const bool eight = gc > 4 * per_chunks || forced == 8 ||
                       (forced == 0 && sizeof(In) == 2 && gc > long_16bit_segment);
    if (gr == 1 && eight && gc <= 8 * per_chunks)
      return launch_segments<8>(x, xm, codes, cm, scales, gc, rule, rng, stream);
  }
  if (gr == 1 && gc <= 4 * per_chunks)
    return launch_segments<4>(x, xm, codes, cm, scales, gc, rule, rng, stream);
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
  kernel<<<grid, threads, shared_bytes_of<Rule>, stream>>>(x, xm.row_stride, codes, cm.row_stride,
                                                           scales, geo, lanes_log2, rule, rng);
  check_launch("group_block_kernel");
}

} // namespace group_pass

using group_pass::launch_groups;

} // namespace lowbit::kernels::cuda
