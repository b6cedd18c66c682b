// CUDA kernels of the activation quantization. With `update`, three launches:
//   minmax_kernel    each block reduces a contiguous span of x into per-group keys (min and max
//                    of order-preserving keys: exact, so atomics in any order give the same bits),
//                    in shared memory when the groups fit, then once per block into global keys
//   estimate_kernel  one thread per group: the running-estimate update of actquant_ops.hpp
//   quantize         the flat map of cuda_map.cuh (16-byte loads), one step per chunk
// so x is read twice (the estimates that quantize this call come from this call's statistics).
// Without `update` only the last. Lagged (actquant_quantize_lagged): minmax_kernel also writes the
// codes from the estimates as they are, then estimate_kernel: one read of x. Dequantize is one
// flat map.
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

#include "../common/cuda_map.cuh"
#include "../common/element_ops.hpp"
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

} // namespace lowbit::kernels::cuda
