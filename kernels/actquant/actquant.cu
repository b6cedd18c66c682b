// CUDA kernels of the activation quantization. With `update`, three launches:
//   minmax_kernel    each block reduces a contiguous span of x into per-group keys (min and max
//                    of order-preserving keys: exact, so atomics in any order give the same bits),
//                    in shared memory when the groups fit, then once per block into global keys
//   estimate_kernel  one thread per group: the running-estimate update of actquant_ops.hpp
//   quantize         the flat map of cuda_map.cuh (16-byte loads), one step per chunk
// so x is read twice (the estimates that quantize this call come from this call's statistics).
// Without `update` only the last. Lagged (actquant_quantize_lagged): minmax_kernel also writes the
// codes from the estimates as they are, then estimate_kernel: one read of x. Dequantize is one
// flat map. The backward passes that read codes (LayerNorm's: ln_backward_kernel, then two small
// float64 reductions for the weight and bias gradients; the activations':
// activation_backward_kernel) are described where they are defined, below.
//
// What keeps these passes at memory speed (the per-element work was 35 to 43 instructions, an
// H200 then ran them at 0.4 of its copy bandwidth): a group is found from an index by two
// multiply-high divisions (actquant_ops::group_divider) once per chunk of consecutive elements,
// or not at all while a thread stays in the run it is in; a group's codes take one reciprocal
// (actquant_ops::step) instead of a division per element; nearest-even rounding is a constant
// policy (actquant_ops::quantize_nearest), so its kernels hold none of the other roundings'
// code; 16-bit outputs are rounded by the hardware conversion (round-to-nearest-even, as the CPU
// twin's emu::encode); each thread of the reduction has four 16-byte loads of x in flight, and
// the reduction's grid is one wave of resident blocks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "../common/cuda_map.cuh"
#include "../common/element_ops.hpp"
#include "activation_ops.hpp"
#include "actquant_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace ops = actquant_ops;

constexpr int reduce_threads = 256;
constexpr int reduce_unroll = 4;             // chunks of x in flight per thread
constexpr std::int64_t shared_groups = 2048; // 16 KiB of keys

// The run (group_of's runs of consecutive indices of one group) that holds an index: its group
// and its index range [first, end).
struct run_place {
  std::int64_t g, first, end;
};

// group_of with the divisions of group_divider where every index fits 32 bits.
struct group_index {
  ops::group_of g;
  ops::group_divider fd;
  bool fast = false;
  static group_index of(const ops::group_of& g, std::int64_t n) {
    const bool fast = ops::group_divider::fits(g, n);
    return {g, fast ? ops::group_divider::of(g) : ops::group_divider{}, fast};
  }
  __device__ std::int64_t operator()(std::int64_t i) const {
    if (g.groups == 1)
      return 0;
    if (fast)
      return fd.group_of_run(fd.run_of(static_cast<std::uint32_t>(i)));
    return g(i);
  }
  __device__ run_place place(std::int64_t i) const {
    if (g.groups == 1)
      return {0, 0, INT64_MAX};
    std::int64_t q = 0, gr = 0;
    if (fast) {
      const std::uint32_t r = fd.run_of(static_cast<std::uint32_t>(i));
      q = r;
      gr = fd.group_of_run(r);
    } else {
      q = i / g.run;
      gr = q % g.groups;
    }
    return {gr, q * g.run, (q + 1) * g.run};
  }
};

// What the lagged pass also needs: the codes it writes from the estimates as they are.
struct lagged_codes {
  std::uint8_t* codes = nullptr; // null: reduce only
  const float* alpha = nullptr;
  const float* beta = nullptr;
  emu::policy pol{};
  emu::random_stream rng{};
};

// The code of x in a group of step st: nearest-even (quantize_nearest), else by the call's
// policy.
template <bool Nearest>
__device__ __forceinline__ std::uint8_t code_of(float x, const ops::step& st,
                                                const emu::policy& pol, std::uint32_t rbits) {
  if constexpr (Nearest)
    return ops::quantize_nearest(x, st);
  else
    return ops::quantize(x, st, pol, rbits);
}

// The min/max of bfloat16 values by 16-bit keys, two to a word (__vminu2 / __vmaxu2): the key of
// bits b is b | 0x8000 for a positive sign, ~b for a negative one, which orders like the values
// (-0 below +0) as ops::key_of does the float's. A vector holding an Inf or NaN is left to the
// per-element reduction (add returns false), so the keys here are of finite values only, within
// [0x0080, 0xFF7F]: 0xFFFF and 0 stand for "none". merge_into folds them into a 32-bit minmax by
// the float keys of the same values; the result is that of ops::minmax::add over each element.
struct bf16_keys {
  std::uint32_t lo = 0xFFFFFFFFu, hi = 0u;
  __device__ bool add(const vec<element_ops::bf16_bits, 8>& xv) {
    std::uint32_t w[4];
    __builtin_memcpy(w, &xv, sizeof(w));
    // Bit 15 of each half of (w & 0x7F80 per half) + 0x0080 is set iff its exponent is all ones.
    std::uint32_t special = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      special |= (w[q] & 0x7F807F80u) + 0x00800080u;
    if ((special & 0x80008000u) != 0)
      return false;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const std::uint32_t neg = (w[q] >> 15) & 0x00010001u; // the sign of each half
      const std::uint32_t key = w[q] ^ (0x80008000u | (neg * 0x7FFFu));
      lo = __vminu2(lo, key);
      hi = __vmaxu2(hi, key);
    }
    return true;
  }
  __device__ static float value_of(std::uint32_t k16) {
    const std::uint32_t bits = (k16 & 0x8000u) != 0 ? (k16 & 0x7FFFu) : (~k16 & 0xFFFFu);
    return __uint_as_float(bits << 16);
  }
  __device__ void merge_into(ops::minmax& m) const {
    const std::uint32_t l = min(lo & 0xFFFFu, lo >> 16), h = max(hi & 0xFFFFu, hi >> 16);
    if (l != 0xFFFFu) {
      const std::uint32_t kl = ops::key_of(value_of(l)), kh = ops::key_of(value_of(h));
      m.lo = kl < m.lo ? kl : m.lo;
      m.hi = kh > m.hi ? kh : m.hi;
    }
  }
};

// Each block reduces span_vecs vectors of C elements (C divides the run, so that a vector lies
// in one group), reduce_unroll of them loaded per thread before any is reduced; with Quantize it
// also writes their codes (Nearest: nearest-even).
template <class In, int C, bool Quantize, bool Nearest>
__global__ void __launch_bounds__(reduce_threads)
    minmax_kernel(const In* __restrict__ x, std::int64_t n, std::int64_t span_vecs, group_index grp,
                  std::uint32_t* __restrict__ keys, bool in_shared, lagged_codes lc) {
  extern __shared__ std::uint32_t sh[];
  const std::int64_t groups = grp.g.groups;
  if (in_shared) {
    for (std::int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
      sh[k] = ops::empty_min;
      sh[groups + k] = ops::empty_max;
    }
    __syncthreads();
  }
  std::uint32_t* lo_dst = in_shared ? sh : keys;
  std::uint32_t* hi_dst = in_shared ? sh + groups : keys + groups;
  run_place cur{-1, 0, 0}; // the run of the elements being reduced (none yet)
  ops::minmax m;
  ops::step st{};
  // bfloat16 vectors reduce their 16-bit keys two to a word (bf16_keys) into pk.
  constexpr bool packed = std::is_same_v<In, element_ops::bf16_bits> && C == 8;
  bf16_keys pk;
  const auto flush = [&] {
    if constexpr (packed) {
      pk.merge_into(m);
      pk = bf16_keys{};
    }
    if (cur.g >= 0 && m.lo != ops::empty_min) {
      atomicMin(lo_dst + cur.g, m.lo);
      atomicMax(hi_dst + cur.g, m.hi);
    }
  };
  // Into the run of element i, where it is not there yet.
  const auto enter = [&](std::int64_t i) {
    if (i >= cur.first && i < cur.end)
      return;
    flush();
    cur = grp.place(i);
    m = ops::minmax{};
    if constexpr (Quantize)
      st = ops::step_of({__ldg(lc.alpha + cur.g), __ldg(lc.beta + cur.g)});
  };
  const auto reduce = [&](const vec<In, C>& xv, std::int64_t i0) {
    enter(i0);
    float f[C];
#pragma unroll
    for (int j = 0; j < C; ++j)
      f[j] = element_ops::load(xv.v[j]);
    if constexpr (packed) {
      if (!pk.add(xv))
#pragma unroll
        for (int j = 0; j < C; ++j)
          m.add(f[j]);
    } else {
#pragma unroll
      for (int j = 0; j < C; ++j)
        m.add(f[j]);
    }
    if constexpr (Quantize) {
      std::uint32_t r[C] = {};
      if constexpr (!Nearest)
        if (lc.pol.round == emu::rounding::stochastic)
          random_bits<C>(lc.rng, i0, r);
      vec<std::uint8_t, C> cv;
#pragma unroll
      for (int j = 0; j < C; ++j)
        cv.v[j] = code_of<Nearest>(f[j], st, lc.pol, r[j]);
      *reinterpret_cast<vec<std::uint8_t, C>*>(lc.codes + i0) = cv;
    }
  };
  const std::int64_t nvec = n / C;
  const std::int64_t v0 = static_cast<std::int64_t>(blockIdx.x) * span_vecs;
  const std::int64_t v1 = v0 + span_vecs < nvec ? v0 + span_vecs : nvec;
  constexpr int U = reduce_unroll;
  for (std::int64_t v = v0 + threadIdx.x; v < v1; v += U * reduce_threads) {
    vec<In, C> xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (v + u * reduce_threads < v1)
        xv[u] = *reinterpret_cast<const vec<In, C>*>(x + (v + u * reduce_threads) * C);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (v + u * reduce_threads < v1)
        reduce(xv[u], (v + u * reduce_threads) * C);
  }
  if (blockIdx.x == gridDim.x - 1) { // the elements after the last whole vector
    for (std::int64_t i = nvec * C + threadIdx.x; i < n; i += blockDim.x) {
      vec<In, 1> xi;
      xi.v[0] = x[i];
      enter(i);
      const float f = element_ops::load(xi.v[0]);
      m.add(f);
      if constexpr (Quantize) {
        std::uint32_t r[1] = {};
        if constexpr (!Nearest)
          if (lc.pol.round == emu::rounding::stochastic)
            random_bits<1>(lc.rng, i, r);
        lc.codes[i] = code_of<Nearest>(f, st, lc.pol, r[0]);
      }
    }
  }
  flush();
  if (in_shared) {
    __syncthreads();
    for (std::int64_t k = threadIdx.x; k < groups; k += blockDim.x)
      if (sh[k] != ops::empty_min) {
        atomicMin(keys + k, sh[k]);
        atomicMax(keys + groups + k, sh[groups + k]);
      }
  }
}

__global__ void estimate_kernel(float* __restrict__ alpha, float* __restrict__ beta,
                                const std::uint32_t* __restrict__ keys, std::int64_t groups,
                                float momentum) {
  const std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups)
    return;
  ops::minmax mm;
  mm.lo = keys[g];
  mm.hi = keys[groups + g];
  const ops::estimate e = ops::update({alpha[g], beta[g]}, mm, momentum);
  alpha[g] = e.alpha;
  beta[g] = e.beta;
}

template <class In, int C, bool Quantize, bool Nearest>
void launch_minmax(const actquant_problem& p, cudaStream_t s) {
  const std::int64_t groups = p.group.groups;
  scratch keys(static_cast<std::size_t>(2 * groups) * sizeof(std::uint32_t), s);
  auto* k = keys.as<std::uint32_t>();
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(k, 0xFF, groups * sizeof(std::uint32_t), s));
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(k + groups, 0, groups * sizeof(std::uint32_t), s));
  const std::int64_t nvec = p.n / C;
  const bool in_shared = groups <= shared_groups;
  const std::size_t smem = in_shared ? static_cast<std::size_t>(2 * groups) * 4 : 0;
  constexpr auto kernel = minmax_kernel<In, C, Quantize, Nearest>;
  // One wave: as many blocks as are resident at once (a second, partial wave left most SMs
  // idle through its blocks' spans), each a span of at least a few vectors per thread.
  const std::int64_t blocks_want =
      std::int64_t{sm_count()} *
      resident_blocks<kernel>(reduce_threads, static_cast<int>(2 * shared_groups) * 4);
  std::int64_t span = (nvec + blocks_want - 1) / blocks_want;
  span = std::max<std::int64_t>(span, reduce_unroll * reduce_threads);
  const std::int64_t blocks = std::max<std::int64_t>(1, (nvec + span - 1) / span);
  lagged_codes lc;
  if constexpr (Quantize) {
    lc.codes = static_cast<std::uint8_t*>(p.codes.data);
    lc.alpha = p.alpha;
    lc.beta = p.beta;
    lc.pol = p.pol;
    lc.rng = p.rng;
  }
  kernel<<<static_cast<unsigned>(blocks), reduce_threads, smem, s>>>(
      static_cast<const In*>(p.x.data), p.n, span, group_index::of(p.group, p.n), k, in_shared, lc);
  check_launch("minmax_kernel");
  const int t = 128;
  estimate_kernel<<<static_cast<unsigned>((groups + t - 1) / t), t, 0, s>>>(p.alpha, p.beta, k,
                                                                            groups, p.momentum);
  check_launch("estimate_kernel");
}

// Whether a policy rounds to nearest-even (its kernels take the constant policy).
bool nearest(const emu::policy& p) {
  return p.round == emu::rounding::nearest_even;
}

// The reduction (and with Quantize the lagged pass's codes): 16-byte loads of x (and C-byte
// stores of codes) where every vector lies in one group and the pointers are aligned.
template <class In, bool Quantize> void update(const actquant_problem& p, cudaStream_t s) {
  constexpr int C = 16 / static_cast<int>(sizeof(In));
  const bool vectors = p.group.run % C == 0 && aligned_to<In>(p.x.data, 16) &&
                       (!Quantize || aligned_to<std::uint8_t>(p.codes.data, C));
  const auto run = [&](auto nearest_tag) {
    constexpr bool N = decltype(nearest_tag)::value;
    if (vectors)
      launch_minmax<In, C, Quantize, N>(p, s);
    else
      launch_minmax<In, 1, Quantize, N>(p, s);
  };
  if (!Quantize || nearest(p.pol))
    run(std::true_type{});
  else
    run(std::false_type{});
}

// The flat map's ops read a group's estimate once per chunk where the map's chunk length divides
// the run (Uniform: every chunk lies in one group), else per element.
template <bool Nearest, bool Uniform> struct quantize_op {
  static constexpr bool needs_position = false, needs_index = true;
  const float* alpha;
  const float* beta;
  group_index grp;
  emu::policy pol;
  ops::step st{};
  __device__ ops::step step_at(std::int64_t i) const {
    const std::int64_t g = grp(i);
    return ops::step_of({__ldg(alpha + g), __ldg(beta + g)});
  }
  __device__ quantize_op at(std::int64_t i0) const {
    quantize_op o = *this;
    if constexpr (Uniform)
      o.st = step_at(i0);
    return o;
  }
  template <class In>
  __device__ std::uint8_t operator()(In x, std::int64_t i, std::int64_t, std::uint32_t rb) const {
    if constexpr (Uniform)
      return code_of<Nearest>(element_ops::load(x), st, pol, rb);
    else
      return code_of<Nearest>(element_ops::load(x), step_at(i), pol, rb);
  }
};

// 16-bit outputs as distinct storage types (the flat map's vector width follows sizeof).
struct bf16_out {
  static constexpr bool bf16 = true;
  std::uint16_t bits;
};
struct f16_out {
  static constexpr bool bf16 = false;
  std::uint16_t bits;
};

// A dequantized value in its output type, as the CPU twin stores ops::canonical(v): 16-bit
// outputs by the hardware conversion (nearest-even, subnormals kept, overflow to Inf: the bits of
// ops::to_bf16 / to_f16 for every value but NaN), a NaN as the bits the twin gives the quiet NaN.
// Two operations and no branch per element.
template <class Out> __device__ __forceinline__ Out stored(float v) {
  constexpr float qnan = emu::detail::bit_cast<float>(ops::quiet_nan_bits);
  if constexpr (std::is_same_v<Out, float>) {
    return ops::canonical(v);
  } else if constexpr (Out::bf16) {
    constexpr std::uint16_t nan_bits = ops::to_bf16(qnan);
    return Out{v != v ? nan_bits : __bfloat16_as_ushort(__float2bfloat16_rn(v))};
  } else {
    constexpr std::uint16_t nan_bits = ops::to_f16(qnan);
    return Out{v != v ? nan_bits : __half_as_ushort(__float2half_rn(v))};
  }
}

template <class Out, bool Uniform> struct dequantize_op {
  static constexpr bool needs_position = false, needs_index = true;
  const float* alpha;
  const float* beta;
  group_index grp;
  ops::estimate e{};
  __device__ ops::estimate estimate_at(std::int64_t i) const {
    const std::int64_t g = grp(i);
    return {__ldg(alpha + g), __ldg(beta + g)};
  }
  __device__ dequantize_op at(std::int64_t i0) const {
    dequantize_op o = *this;
    if constexpr (Uniform)
      o.e = estimate_at(i0);
    return o;
  }
  __device__ Out operator()(std::uint8_t c, std::int64_t i, std::int64_t, std::uint32_t) const {
    if constexpr (Uniform)
      return stored<Out>(ops::dequantize(c, e));
    else
      return stored<Out>(ops::dequantize(c, estimate_at(i)));
  }
};

// Runs f(std::bool_constant<uniform>) for the map of In -> Out over problem p.
template <class In, class Out, class F> void with_uniform(const actquant_problem& p, F&& f) {
  if (p.group.run % flat_shape<In, Out>::C == 0)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// ---- LayerNorm's backward from codes --------------------------------------------------------
//
// A warp per chunk of ln_chunk_rows rows, one row at a time: lane l holds the row's runs of four
// at 4 l + 128 j (for rows up to 1024 wide, in registers; wider rows are read again from memory
// for each of the row's four passes), so the row sums of actquant_ops (a lane's partial in
// increasing column, then the shuffle butterfly) are the CPU twin's. The chunk's column sums of gy
// xhat and gy stay per warp in shared memory (or, for wide rows, in the chunk's slots of the
// partials in global memory) and are written once per chunk; two small kernels add the chunks in
// float64.
constexpr int ln_warps = 8;

struct ln_args {
  const std::uint8_t* codes;
  const float* alpha;
  const float* beta;
  const void* gy;
  const float* weight; // null: 1
  void* gx;            // null: not wanted
  float* part_w;       // [chunks, cols] (null: no parameter gradients)
  float* part_b;
  std::int64_t rows, chunks;
  int cols, group_size;
  float eps;
  bool vec; // cols % 4 == 0 and every buffer aligned for runs of four
};

// A value as stored in D, read back as float (what a backward reads of a dequantized input).
template <class D> __device__ __forceinline__ float as_stored(float v) {
  if constexpr (std::is_same_v<D, float>)
    return v;
  else if constexpr (D::bf16)
    return __bfloat162float(__float2bfloat16_rn(v));
  else
    return __half2float(__float2half_rn(v));
}
template <class D> __device__ __forceinline__ float load_value(const D* p, std::int64_t i) {
  if constexpr (std::is_same_v<D, float>)
    return __ldcs(p + i);
  else if constexpr (D::bf16)
    return __uint_as_float(static_cast<std::uint32_t>(__ldcs(&p[i].bits)) << 16);
  else
    return __half2float(__ushort_as_half(__ldcs(&p[i].bits)));
}
// Four consecutive elements at i (16-byte or 8-byte aligned: ln_args::vec).
template <class D> __device__ __forceinline__ void load_four(const D* p, std::int64_t i, float* v) {
  if constexpr (std::is_same_v<D, float>) {
    const float4 w = __ldcs(reinterpret_cast<const float4*>(p + i));
    v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
  } else {
    const uint2 w = __ldcs(reinterpret_cast<const uint2*>(p + i));
    const std::uint32_t h[4] = {w.x & 0xFFFFu, w.x >> 16, w.y & 0xFFFFu, w.y >> 16};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (D::bf16)
        v[q] = __uint_as_float(h[q] << 16);
      else
        v[q] = __half2float(__ushort_as_half(static_cast<unsigned short>(h[q])));
    }
  }
}
template <class D>
__device__ __forceinline__ void store_four(D* p, std::int64_t i, const float* v) {
  if constexpr (std::is_same_v<D, float>) {
    __stcs(reinterpret_cast<float4*>(p + i),
           make_float4(stored<D>(v[0]), stored<D>(v[1]), stored<D>(v[2]), stored<D>(v[3])));
  } else {
    const std::uint32_t h0 = stored<D>(v[0]).bits, h1 = stored<D>(v[1]).bits,
                        h2 = stored<D>(v[2]).bits, h3 = stored<D>(v[3]).bits;
    __stcs(reinterpret_cast<uint2*>(p + i), make_uint2(h0 | (h1 << 16), h2 | (h3 << 16)));
  }
}

__device__ __forceinline__ float ln_all_sum(float v) {
#pragma unroll
  for (int h = ops::ln_lanes / 2; h > 0; h >>= 1)
    v = v + __shfl_xor_sync(0xFFFFFFFFu, v, h);
  return v;
}

// Rows wider than 1024: every pass reads the row again (from L2 or memory), and the chunk's
// column sums accumulate in the chunk's slots of the partials in global memory.
template <class D>
__global__ void __launch_bounds__(ln_warps * 32) ln_backward_wide_kernel(const ln_args a) {
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5;
  const int C = a.cols, nj = (C + 127) / 128;
  const bool params = a.part_w != nullptr;
  const auto* codes = a.codes;
  const auto* gy_all = static_cast<const D*>(a.gy);
  auto* gx_all = static_cast<D*>(a.gx);
  const auto estimate_at = [&](int c) -> ops::estimate {
    const int g = c / a.group_size;
    return {__ldg(a.alpha + g), __ldg(a.beta + g)};
  };
  // How many of run j's four columns (c0 = 128 j + 4 lane ...) lie inside the row.
  const auto valid_of = [&](int j) {
    const int left = C - (128 * j + 4 * lane);
    return left >= 4 ? 4 : (left > 0 ? left : 0);
  };
  // Run j of row r: x and gy (0 outside the row).
  const auto load_run = [&](std::int64_t r, int j, float(&x)[4], float(&gy)[4]) {
    const int c0 = 128 * j + 4 * lane, valid = valid_of(j);
    const std::int64_t i0 = r * C + c0;
    if (a.vec && valid == 4) {
      const std::uint32_t cw = __ldcs(reinterpret_cast<const unsigned*>(codes + i0));
      load_four(gy_all, i0, gy);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        x[q] = as_stored<D>(
            ops::dequantize(static_cast<std::uint8_t>(cw >> (8 * q)), estimate_at(c0 + q)));
      return;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (q < valid) {
        x[q] = as_stored<D>(ops::dequantize(__ldcs(codes + i0 + q), estimate_at(c0 + q)));
        gy[q] = load_value(gy_all, i0 + q);
      } else {
        x[q] = gy[q] = 0.0f;
      }
    }
  };
  const auto wt = [&](int c) { return a.weight != nullptr ? __ldg(a.weight + c) : 1.0f; };
  const float n = static_cast<float>(C);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * ln_warps;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * ln_warps + w; k < a.chunks;
       k += stride) {
    float* pw = params ? a.part_w + k * C : nullptr;
    float* pb = params ? a.part_b + k * C : nullptr;
    const std::int64_t r0 = k * ops::ln_chunk_rows;
    const std::int64_t r1 = min(a.rows, r0 + ops::ln_chunk_rows);
    for (std::int64_t r = r0; r < r1; ++r) {
      // A row sum of term(x, gy, column) over the lane's elements, then the butterfly.
      const auto row_sum = [&](auto term) {
        float s = 0.0f;
        for (int j = 0; j < nj; ++j) {
          float x[4], gy[4];
          load_run(r, j, x, gy);
          const int v = valid_of(j);
          for (int q = 0; q < v; ++q)
            s = s + term(x[q], gy[q], 128 * j + 4 * lane + q);
        }
        return ln_all_sum(s);
      };
      const float mean = ops::div_rn(row_sum([](float x, float, int) { return x; }), n);
      const float rstd = ops::ln_rstd(row_sum([&](float x, float, int) {
                                        const float d = x - mean;
                                        return d * d;
                                      }),
                                      n, a.eps);
      const float sa = ops::div_rn(row_sum([&](float, float gy, int c) { return gy * wt(c); }), n);
      const float sb = ops::div_rn(
          row_sum([&](float x, float gy, int c) { return (gy * wt(c)) * ((x - mean) * rstd); }), n);
      // The outputs of one run: gx, and the chunk's column sums.
      const auto finish_run = [&](int j, const float(&x)[4], const float(&gy)[4]) {
        const int c0 = 128 * j + 4 * lane, v = valid_of(j);
        float out[4], xh[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          xh[q] = (x[q] - mean) * rstd;
          out[q] = ops::ln_gx(gy[q] * wt(q < v ? c0 + q : 0), xh[q], sa, sb, rstd);
        }
        if (gx_all != nullptr) {
          if (a.vec && v == 4) {
            store_four(gx_all, r * C + c0, out);
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q)
              if (q < v)
                gx_all[r * C + c0 + q] = stored<D>(out[q]);
          }
        }
        if (params) {
          const bool first = r == r0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (q < v) {
              const float pw0 = first ? 0.0f : pw[c0 + q], pb0 = first ? 0.0f : pb[c0 + q];
              pw[c0 + q] = pw0 + gy[q] * xh[q];
              pb[c0 + q] = pb0 + gy[q];
            }
          }
        }
      };
      for (int j = 0; j < nj; ++j) {
        float x[4], gy[4];
        load_run(r, j, x, gy);
        finish_run(j, x, gy);
      }
    }
  }
}

// Rows up to 128 J wide: lane l keeps x and gy of its runs of four (4 l + 128 j) in registers for
// the row's four passes. Shared memory holds what every row reads again (the weight, 1 where
// absent, and each column's estimate) and each warp's column sums of its chunk; all of it is
// read as runs of four (one 16-byte access per run). The third pass forms both of its sums,
// S(g) and S(g xhat), each in the same order as alone.
template <class D, int J>
__global__ void __launch_bounds__(ln_warps * 32) ln_backward_kernel(const ln_args a) {
  static_assert(J > 0);
  extern __shared__ float4 ln_smem[];
  constexpr int W = 128 * J; // columns a block's tables hold
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int C = a.cols, nj = (C + 127) / 128;
  const bool params = a.part_w != nullptr;
  auto* base = reinterpret_cast<float*>(ln_smem);
  float* wt = base;                               // [W]
  auto* ab = reinterpret_cast<float2*>(base + W); // [W]
  float* pw = base + 3 * W + warp * 2 * W;        // [W] per warp
  float* pb = pw + W;                             // [W] per warp
  for (int c = static_cast<int>(threadIdx.x); c < W; c += static_cast<int>(blockDim.x)) {
    const bool in = c < C;
    const int g = in ? c / a.group_size : 0;
    wt[c] = in && a.weight != nullptr ? __ldg(a.weight + c) : 1.0f;
    ab[c] = in ? make_float2(__ldg(a.alpha + g), __ldg(a.beta + g)) : make_float2(0.0f, 0.0f);
  }
  __syncthreads();
  const auto* gy_all = static_cast<const D*>(a.gy);
  auto* gx_all = static_cast<D*>(a.gx);
  const auto valid_of = [&](int j) {
    const int left = C - (128 * j + 4 * lane);
    return left >= 4 ? 4 : (left > 0 ? left : 0);
  };
  const auto load4 = [](const float* p) { return *reinterpret_cast<const float4*>(p); };
  const auto store4 = [](float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; };
  const float n = static_cast<float>(C);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * ln_warps;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * ln_warps + warp; k < a.chunks;
       k += stride) {
    if (params) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        store4(pw + 128 * j + 4 * lane, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        store4(pb + 128 * j + 4 * lane, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
      }
    }
    const std::int64_t r0 = k * ops::ln_chunk_rows;
    const std::int64_t r1 = min(a.rows, r0 + ops::ln_chunk_rows);
    for (std::int64_t r = r0; r < r1; ++r) {
      float xv[4 * J], gv[4 * J];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c0 = 128 * j + 4 * lane, v = j < nj ? valid_of(j) : 0;
        const std::int64_t i0 = r * C + c0;
        float g4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        std::uint32_t cw = 0;
        if (a.vec && v == 4) {
          cw = __ldcs(reinterpret_cast<const unsigned*>(a.codes + i0));
          load_four(gy_all, i0, g4);
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (q < v) {
              cw |= static_cast<std::uint32_t>(__ldcs(a.codes + i0 + q)) << (8 * q);
              g4[q] = load_value(gy_all, i0 + q);
            }
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 e = ab[c0 + q];
          xv[4 * j + q] =
              as_stored<D>(ops::dequantize(static_cast<std::uint8_t>(cw >> (8 * q)), {e.x, e.y}));
          gv[4 * j + q] = g4[q];
        }
      }
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int v = j < nj ? valid_of(j) : 0;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (q < v)
            s = s + xv[4 * j + q];
      }
      const float mean = ops::div_rn(ln_all_sum(s), n);
      s = 0.0f;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int v = j < nj ? valid_of(j) : 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (q < v) {
            const float d = xv[4 * j + q] - mean;
            s = s + d * d;
          }
        }
      }
      const float rstd = ops::ln_rstd(ln_all_sum(s), n, a.eps);
      float sg = 0.0f, sgx = 0.0f;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c0 = 128 * j + 4 * lane, v = j < nj ? valid_of(j) : 0;
        const float4 w4 = load4(wt + c0);
        const float w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (q < v) {
            const float g = gv[4 * j + q] * w[q];
            sg = sg + g;
            sgx = sgx + g * ((xv[4 * j + q] - mean) * rstd);
          }
        }
      }
#pragma unroll
      for (int h = ops::ln_lanes / 2; h > 0; h >>= 1) {
        const float og = __shfl_xor_sync(0xFFFFFFFFu, sg, h);
        const float ogx = __shfl_xor_sync(0xFFFFFFFFu, sgx, h);
        sg = sg + og;
        sgx = sgx + ogx;
      }
      const float ma = ops::div_rn(sg, n), mb = ops::div_rn(sgx, n);
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c0 = 128 * j + 4 * lane, v = j < nj ? valid_of(j) : 0;
        if (v == 0)
          continue;
        const float4 w4 = load4(wt + c0);
        const float w[4] = {w4.x, w4.y, w4.z, w4.w};
        float out[4], xh[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          xh[q] = (xv[4 * j + q] - mean) * rstd;
          out[q] = ops::ln_gx(gv[4 * j + q] * w[q], xh[q], ma, mb, rstd);
        }
        const std::int64_t i0 = r * C + c0;
        if (gx_all != nullptr) {
          if (a.vec && v == 4) {
            store_four(gx_all, i0, out);
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q)
              if (q < v)
                gx_all[i0 + q] = stored<D>(out[q]);
          }
        }
        if (params) { // the columns past the row's end sum zeros: never read
          float4 sw = load4(pw + c0), sb = load4(pb + c0);
          sw.x = sw.x + gv[4 * j] * xh[0];
          sw.y = sw.y + gv[4 * j + 1] * xh[1];
          sw.z = sw.z + gv[4 * j + 2] * xh[2];
          sw.w = sw.w + gv[4 * j + 3] * xh[3];
          sb.x = sb.x + gv[4 * j];
          sb.y = sb.y + gv[4 * j + 1];
          sb.z = sb.z + gv[4 * j + 2];
          sb.w = sb.w + gv[4 * j + 3];
          store4(pw + c0, sw);
          store4(pb + c0, sb);
        }
      }
    }
    if (params) {
      for (int j = 0; j < nj; ++j) {
        const int c0 = 128 * j + 4 * lane, v = valid_of(j);
        for (int q = 0; q < v; ++q) {
          a.part_w[k * C + c0 + q] = pw[c0 + q];
          a.part_b[k * C + c0 + q] = pb[c0 + q];
        }
      }
    }
  }
}

// The chunks' column sums in float64: per segment of ln_segment chunks (seg), then the segments
// in order (out), as the CPU twin's ln_column_sum; blockIdx.z picks the weight's (0) or the
// bias's (1) sums. A whole segment's loads are issued before its additions.
struct ln_sums {
  const float* part[2];
  double* seg[2];
  float* out[2];
};
__global__ void ln_segment_kernel(const ln_sums t, std::int64_t chunks, int cols) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const bool z = blockIdx.z != 0; // (no array indexed at run time: t stays in registers)
  if (c >= cols || (z ? t.out[1] : t.out[0]) == nullptr)
    return;
  const float* part = z ? t.part[1] : t.part[0];
  double* seg = z ? t.seg[1] : t.seg[0];
  const std::int64_t segments = (chunks + ops::ln_segment - 1) / ops::ln_segment;
  for (std::int64_t s = blockIdx.y; s < segments; s += gridDim.y) {
    double acc = 0.0;
    const std::int64_t k0 = s * ops::ln_segment, k1 = min(chunks, k0 + ops::ln_segment);
    if (k1 - k0 == ops::ln_segment) {
      float v[ops::ln_segment];
#pragma unroll
      for (int k = 0; k < ops::ln_segment; ++k)
        v[k] = part[(k0 + k) * cols + c];
#pragma unroll
      for (int k = 0; k < ops::ln_segment; ++k)
        acc += static_cast<double>(v[k]);
    } else {
      for (std::int64_t k = k0; k < k1; ++k)
        acc += static_cast<double>(part[k * cols + c]);
    }
    seg[s * cols + c] = acc;
  }
}
__global__ void ln_total_kernel(const ln_sums t, std::int64_t segments, int cols) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const bool z = blockIdx.z != 0;
  float* out = z ? t.out[1] : t.out[0];
  if (c >= cols || out == nullptr)
    return;
  const double* seg = z ? t.seg[1] : t.seg[0];
  double total = 0.0;
  for (std::int64_t s = 0; s < segments; ++s)
    total += seg[s * cols + c];
  out[c] = ops::canonical(static_cast<float>(total));
}

// ---- the activations' backward from codes ----------------------------------------------------
//
// Four consecutive elements per thread and step (vector accesses where every buffer is aligned
// for them), a grid-stride loop. An element's input is one of its group's 256 dequantized values,
// so with Table (every group's 256 derivatives and values fit in shared memory) each block first
// tabulates them, and an element costs a lookup and a product: the same bits as the per-element
// evaluation (Table false), which larger group counts take.
constexpr int act_table_groups = 24; // 24 x 256 x 8 bytes: 48 KiB

struct act_args {
  const std::uint8_t* codes;
  const float* alpha;
  const float* beta;
  const void* dy;
  void* gx;
  void* value; // null: not wanted
  std::int64_t n, groups;
  group_index grp;
  bool uniform4; // run % 4 == 0
  bool vec;
};

template <class D, activation_ops::activation F, bool Table>
__global__ void __launch_bounds__(256) activation_backward_kernel(const act_args a) {
  extern __shared__ float act_tables[]; // Table: derivatives [groups][256], then values
  const auto* dy = static_cast<const D*>(a.dy);
  auto* gx = static_cast<D*>(a.gx);
  auto* value = static_cast<D*>(a.value);
  const bool want_value = value != nullptr;
  const auto x_of = [&](std::uint8_t code, std::int64_t g) {
    return as_stored<D>(ops::dequantize(code, {__ldg(a.alpha + g), __ldg(a.beta + g)}));
  };
  if constexpr (Table) {
    const int entries = static_cast<int>(a.groups) * 256;
    for (int k = static_cast<int>(threadIdx.x); k < entries; k += static_cast<int>(blockDim.x)) {
      const float x = x_of(static_cast<std::uint8_t>(k & 255), k >> 8);
      act_tables[k] = activation_ops::derivative(F, x);
      if (want_value)
        act_tables[entries + k] = activation_ops::value(F, x);
    }
    __syncthreads();
  }
  // The derivative and the value at a code of group g.
  const auto at = [&](std::uint8_t code, std::int64_t g, float& d, float& v) {
    if constexpr (Table) {
      const int k = static_cast<int>(g) * 256 + code;
      d = act_tables[k];
      v = want_value ? act_tables[static_cast<int>(a.groups) * 256 + k] : 0.0f;
    } else {
      const float x = x_of(code, g);
      d = activation_ops::derivative(F, x);
      v = want_value ? activation_ops::value(F, x) : 0.0f;
    }
  };
  const std::int64_t quads = (a.n + 3) / 4;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < quads;
       t += stride) {
    const std::int64_t i0 = 4 * t;
    const int valid = a.n - i0 >= 4 ? 4 : static_cast<int>(a.n - i0);
    float g[4], out_g[4], out_v[4];
    std::uint32_t cw = 0;
    if (a.vec && valid == 4) {
      cw = __ldcs(reinterpret_cast<const unsigned*>(a.codes + i0));
      load_four(dy, i0, g);
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const bool in = q < valid;
        cw |= static_cast<std::uint32_t>(in ? __ldcs(a.codes + i0 + q) : 0) << (8 * q);
        g[q] = in ? load_value(dy, i0 + q) : 0.0f;
      }
    }
    const std::int64_t g0 = a.grp(i0);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float d = 0.0f, v = 0.0f;
      at(static_cast<std::uint8_t>(cw >> (8 * q)), a.uniform4 || q == 0 ? g0 : a.grp(i0 + q), d, v);
      out_g[q] = activation_ops::gradient_of(F, d, g[q]);
      out_v[q] = v;
    }
    if (a.vec && valid == 4) {
      store_four(gx, i0, out_g);
      if (want_value)
        store_four(value, i0, out_v);
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (q < valid) {
          gx[i0 + q] = stored<D>(out_g[q]);
          if (want_value)
            value[i0 + q] = stored<D>(out_v[q]);
        }
      }
    }
  }
}

template <class D, int J> void launch_ln_backward(const ln_args& a, cudaStream_t s) {
  constexpr auto kernel =
      J > 0 ? ln_backward_kernel<D, (J > 0 ? J : 1)> : ln_backward_wide_kernel<D>;
  const int smem = J > 0 ? (3 + 2 * ln_warps) * 128 * J * 4 : 0;
  const int per_sm = resident_blocks<kernel>(ln_warps * 32, smem);
  const std::int64_t need = (a.chunks + ln_warps - 1) / ln_warps;
  const std::int64_t cap = static_cast<std::int64_t>(sm_count()) * per_sm;
  const auto blocks = static_cast<unsigned>(std::max<std::int64_t>(1, std::min(need, cap)));
  kernel<<<blocks, ln_warps * 32, smem, s>>>(a);
  check_launch("ln_backward_kernel");
}

} // namespace

void actquant_quantize(const actquant_problem& p, const exec& ex) {
  const cudaStream_t s = stream_of(ex);
  element_ops::dispatch_input(p.x.type, [&](auto tag) {
    using In = decltype(tag);
    if constexpr (!std::is_same_v<In, double>) {
      if (p.lagged) { // one read of x: codes from the estimates as they are, then the update
        update<In, true>(p, s);
        return;
      }
      if (p.update)
        update<In, false>(p, s);
      if (!p.quantize)
        return;
      const group_index grp = group_index::of(p.group, p.n);
      const auto* x = static_cast<const In*>(p.x.data);
      auto* codes = static_cast<std::uint8_t*>(p.codes.data);
      const bool stochastic = p.pol.round == emu::rounding::stochastic;
      with_uniform<In, std::uint8_t>(p, [&](auto uniform) {
        constexpr bool U = decltype(uniform)::value;
        if (nearest(p.pol)) {
          const quantize_op<true, U> op{p.alpha, p.beta, grp, p.pol};
          launch_map(x, p.n, codes, p.n, 1, p.n, op, false, p.rng, s);
        } else {
          const quantize_op<false, U> op{p.alpha, p.beta, grp, p.pol};
          launch_map(x, p.n, codes, p.n, 1, p.n, op, stochastic, p.rng, s);
        }
      });
    }
  });
}

void actquant_dequantize(const actquant_problem& p, const exec& ex) {
  const cudaStream_t s = stream_of(ex);
  const auto* codes = static_cast<const std::uint8_t*>(p.codes.data);
  const group_index grp = group_index::of(p.group, p.n);
  const auto run = [&](auto out_tag) {
    using Out = decltype(out_tag);
    with_uniform<std::uint8_t, Out>(p, [&](auto uniform) {
      const dequantize_op<Out, decltype(uniform)::value> op{p.alpha, p.beta, grp};
      launch_map(codes, p.n, static_cast<Out*>(p.out.data), p.n, 1, p.n, op, false, {}, s);
    });
  };
  switch (p.out.type) {
  case dtype::bfloat16: run(bf16_out{}); break;
  case dtype::float16: run(f16_out{}); break;
  default: run(float{}); break;
  }
}

void actquant_layer_norm_backward(const ln_backward_problem& p, const exec& ex) {
  const cudaStream_t s = stream_of(ex);
  const std::int64_t K = p.chunks();
  const int C = static_cast<int>(p.cols);
  const bool params = p.gw != nullptr || p.gb != nullptr;
  std::optional<scratch> part, seg;
  ln_args a{};
  a.codes = p.codes;
  a.alpha = p.alpha;
  a.beta = p.beta;
  a.gy = p.gy;
  a.weight = p.weight;
  a.gx = p.gx;
  a.rows = p.rows;
  a.chunks = K;
  a.cols = C;
  a.group_size = static_cast<int>(p.group_size);
  a.eps = p.eps;
  const std::size_t esize = dtype_size(p.type);
  // (A null gx, not wanted, counts as aligned.)
  a.vec = C % 4 == 0 && aligned_to<float>(p.codes, 4) && aligned_to<float>(p.gy, 4 * esize) &&
          aligned_to<float>(p.gx, 4 * esize);
  if (params && K > 0) {
    part.emplace(2 * static_cast<std::size_t>(K) * C * sizeof(float), s);
    a.part_w = part->as<float>();
    a.part_b = a.part_w + K * C;
  }
  if (K > 0 && (p.gx != nullptr || params)) {
    const int nj = (C + 127) / 128;
    const auto run = [&](auto tag) {
      using D = decltype(tag);
      if (nj <= 1)
        launch_ln_backward<D, 1>(a, s);
      else if (nj <= 2)
        launch_ln_backward<D, 2>(a, s);
      else if (nj <= 4)
        launch_ln_backward<D, 4>(a, s);
      else if (nj <= 8)
        launch_ln_backward<D, 8>(a, s);
      else
        launch_ln_backward<D, 0>(a, s);
    };
    switch (p.type) {
    case dtype::bfloat16: run(bf16_out{}); break;
    case dtype::float16: run(f16_out{}); break;
    default: run(float{}); break;
    }
  }
  if (!params)
    return;
  const std::int64_t S = (K + ops::ln_segment - 1) / ops::ln_segment;
  seg.emplace(2 * static_cast<std::size_t>(S > 0 ? S : 1) * C * sizeof(double), s);
  ln_sums t{};
  t.part[0] = a.part_w;
  t.part[1] = a.part_b;
  t.seg[0] = seg->as<double>();
  t.seg[1] = t.seg[0] + S * C;
  t.out[0] = p.gw;
  t.out[1] = p.gb;
  const auto bx = static_cast<unsigned>((C + 255) / 256);
  if (S > 0) {
    const dim3 grid(bx, static_cast<unsigned>(std::min<std::int64_t>(S, 65535)), 2);
    ln_segment_kernel<<<grid, 256, 0, s>>>(t, K, C);
    check_launch("ln_segment_kernel");
  }
  ln_total_kernel<<<dim3(bx, 1, 2), 256, 0, s>>>(t, S, C);
  check_launch("ln_total_kernel");
}

void actquant_activation_backward(const act_backward_problem& p, const exec& ex) {
  const cudaStream_t s = stream_of(ex);
  act_args a{};
  a.codes = p.codes;
  a.alpha = p.alpha;
  a.beta = p.beta;
  a.dy = p.dy;
  a.gx = p.gx;
  a.value = p.value;
  a.n = p.n;
  a.groups = p.group.groups;
  a.grp = group_index::of(p.group, p.n);
  a.uniform4 = p.group.run % 4 == 0;
  const std::size_t esize = dtype_size(p.type);
  a.vec = aligned_to<float>(p.codes, 4) && aligned_to<float>(p.dy, 4 * esize) &&
          aligned_to<float>(p.gx, 4 * esize) && aligned_to<float>(p.value, 4 * esize);
  // ReLU's derivative is a comparison: no table. Tables are built per block, so the grid is one
  // wave of resident blocks where they are.
  const bool table = p.f != actquant_activation::relu && a.groups <= act_table_groups;
  const int smem = table ? static_cast<int>(a.groups) * 256 * 8 : 0;
  const auto launch = [&](auto kernel, int per_sm) {
    const std::int64_t need = ((p.n + 3) / 4 + 255) / 256;
    const std::int64_t cap = static_cast<std::int64_t>(sm_count()) * per_sm;
    const auto blocks = static_cast<unsigned>(std::max<std::int64_t>(1, std::min(need, cap)));
    kernel<<<blocks, 256, smem, s>>>(a);
    check_launch("activation_backward_kernel");
  };
  const auto run = [&](auto tag) {
    using D = decltype(tag);
    using activation_ops::activation;
    const auto with = [&](auto f_tag) {
      constexpr activation F = decltype(f_tag)::value;
      if (table) {
        constexpr auto k = activation_backward_kernel<D, F, true>;
        launch(k, resident_blocks<k>(256, act_table_groups * 256 * 8));
      } else {
        constexpr auto k = activation_backward_kernel<D, F, false>;
        launch(k, 8);
      }
    };
    switch (p.f) {
    case activation::gelu: with(std::integral_constant<activation, activation::gelu>{}); break;
    case activation::gelu_tanh:
      with(std::integral_constant<activation, activation::gelu_tanh>{});
      break;
    case activation::silu: with(std::integral_constant<activation, activation::silu>{}); break;
    default: with(std::integral_constant<activation, activation::relu>{}); break;
    }
  };
  switch (p.type) {
  case dtype::bfloat16: run(bf16_out{}); break;
  case dtype::float16: run(f16_out{}); break;
  default: run(float{}); break;
  }
}

} // namespace lowbit::kernels::cuda
