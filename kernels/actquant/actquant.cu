// CUDA kernels of the activation quantization. With `update`, three launches:
//   minmax_kernel    each block reduces a contiguous span of x into per-group keys (min and max
//                    of order-preserving keys: exact, so atomics in any order give the same bits),
//                    in shared memory when the groups fit, then once per block into global keys
//   estimate_kernel  one thread per group: the running-estimate update of actquant_ops.hpp
//   quantize         the flat map of cuda_map.cuh (16-byte loads), one estimate per chunk
// so x is read twice (the estimates that quantize this call come from this call's statistics).
// Without `update` only the last. Lagged (actquant_quantize_lagged): minmax_kernel also writes the
// codes from the estimates as they are, then estimate_kernel: one read of x. Dequantize is one
// flat map.
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
constexpr std::int64_t shared_groups = 2048; // 16 KiB of keys

// What the lagged pass also needs: the codes it writes from the estimates as they are.
struct lagged_codes {
  std::uint8_t* codes = nullptr; // null: reduce only
  const float* alpha = nullptr;
  const float* beta = nullptr;
  emu::policy pol{};
  bool stochastic = false;
  emu::random_stream rng{};
};

template <class In, int C, bool Quantize>
__global__ void __launch_bounds__(reduce_threads)
    minmax_kernel(const In* __restrict__ x, std::int64_t n, std::int64_t span_vecs,
                  ops::group_of grp, std::uint32_t* __restrict__ keys, bool in_shared,
                  lagged_codes lc) {
  extern __shared__ std::uint32_t sh[];
  const std::int64_t groups = grp.groups;
  if (in_shared) {
    for (std::int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
      sh[k] = ops::empty_min;
      sh[groups + k] = ops::empty_max;
    }
    __syncthreads();
  }
  std::uint32_t* lo_dst = in_shared ? sh : keys;
  std::uint32_t* hi_dst = in_shared ? sh + groups : keys + groups;
  std::int64_t cur = -1;
  ops::minmax m;
  ops::estimate est{};
  const auto flush = [&] {
    if (cur >= 0 && m.lo != ops::empty_min) {
      atomicMin(lo_dst + cur, m.lo);
      atomicMax(hi_dst + cur, m.hi);
    }
  };
  const auto enter = [&](std::int64_t g) {
    flush();
    cur = g;
    m = ops::minmax{};
    if constexpr (Quantize)
      est = ops::estimate{__ldg(lc.alpha + g), __ldg(lc.beta + g)};
  };
  const std::int64_t nvec = n / C;
  const std::int64_t v0 = static_cast<std::int64_t>(blockIdx.x) * span_vecs;
  const std::int64_t v1 = v0 + span_vecs < nvec ? v0 + span_vecs : nvec;
  for (std::int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
    const vec<In, C> xv = *reinterpret_cast<const vec<In, C>*>(x + v * C);
    const std::int64_t g = grp(v * C); // C divides the run: one group per vector
    if (g != cur)
      enter(g);
    float f[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      f[j] = element_ops::load(xv.v[j]);
      m.add(f[j]);
    }
    if constexpr (Quantize) {
      std::uint32_t r[C] = {};
      if (lc.stochastic) {
        if constexpr (C % 4 == 0) {
#pragma unroll
          for (int h = 0; h < C; h += 4) {
            const emu::philox_block b = lc.rng.block(static_cast<std::uint64_t>(v * C + h) >> 2);
#pragma unroll
            for (int k = 0; k < 4; ++k)
              r[h + k] = b.v[k];
          }
        } else {
#pragma unroll
          for (int j = 0; j < C; ++j)
            r[j] = lc.rng.bits(static_cast<std::uint64_t>(v * C + j));
        }
      }
      vec<std::uint8_t, C> cv;
#pragma unroll
      for (int j = 0; j < C; ++j)
        cv.v[j] = ops::quantize(f[j], est, lc.pol, r[j]);
      *reinterpret_cast<vec<std::uint8_t, C>*>(lc.codes + v * C) = cv;
    }
  }
  if (blockIdx.x == gridDim.x - 1) { // the elements after the last whole vector
    for (std::int64_t i = nvec * C + threadIdx.x; i < n; i += blockDim.x) {
      const std::int64_t g = grp(i);
      if (g != cur)
        enter(g);
      const float f = element_ops::load(x[i]);
      m.add(f);
      if constexpr (Quantize) {
        const std::uint32_t rb = lc.stochastic ? lc.rng.bits(static_cast<std::uint64_t>(i)) : 0u;
        lc.codes[i] = ops::quantize(f, est, lc.pol, rb);
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

template <class In, int C, bool Quantize>
void launch_minmax(const actquant_problem& p, cudaStream_t s) {
  const std::int64_t groups = p.group.groups;
  scratch keys(static_cast<std::size_t>(2 * groups) * sizeof(std::uint32_t), s);
  auto* k = keys.as<std::uint32_t>();
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(k, 0xFF, groups * sizeof(std::uint32_t), s));
  LOWBIT_CUDA_CHECK(cudaMemsetAsync(k + groups, 0, groups * sizeof(std::uint32_t), s));
  const std::int64_t nvec = p.n / C;
  // Spans of at least a few vectors per thread, about eight blocks per SM.
  const std::int64_t blocks_want = std::int64_t{sm_count()} * 8;
  std::int64_t span = (nvec + blocks_want - 1) / blocks_want;
  span = std::max<std::int64_t>(span, 4 * reduce_threads);
  const std::int64_t blocks = std::max<std::int64_t>(1, (nvec + span - 1) / span);
  const bool in_shared = groups <= shared_groups;
  const std::size_t smem = in_shared ? static_cast<std::size_t>(2 * groups) * 4 : 0;
  lagged_codes lc;
  if constexpr (Quantize) {
    lc.codes = static_cast<std::uint8_t*>(p.codes.data);
    lc.alpha = p.alpha;
    lc.beta = p.beta;
    lc.pol = p.pol;
    lc.stochastic = p.pol.round == emu::rounding::stochastic;
    lc.rng = p.rng;
  }
  minmax_kernel<In, C, Quantize><<<static_cast<unsigned>(blocks), reduce_threads, smem, s>>>(
      static_cast<const In*>(p.x.data), p.n, span, p.group, k, in_shared, lc);
  check_launch("minmax_kernel");
  const int t = 128;
  estimate_kernel<<<static_cast<unsigned>((groups + t - 1) / t), t, 0, s>>>(p.alpha, p.beta, k,
                                                                            groups, p.momentum);
  check_launch("estimate_kernel");
}

// The reduction (and with Quantize the lagged pass's codes): 16-byte loads of x (and C-byte
// stores of codes) where every vector lies in one group and the pointers are aligned.
template <class In, bool Quantize> void update(const actquant_problem& p, cudaStream_t s) {
  constexpr int C = 16 / static_cast<int>(sizeof(In));
  const bool vectors = p.group.run % C == 0 && aligned_to<In>(p.x.data, 16) &&
                       (!Quantize || aligned_to<std::uint8_t>(p.codes.data, C));
  if (vectors)
    launch_minmax<In, C, Quantize>(p, s);
  else
    launch_minmax<In, 1, Quantize>(p, s);
}

// The estimate of a chunk of the flat map is read once when the chunk lies in one group.
struct estimate_source {
  const float* alpha;
  const float* beta;
  ops::group_of grp;
  bool uniform_chunks; // the map's chunk length divides the run
  bool bound = false;
  ops::estimate e{};
  __device__ ops::estimate at_index(std::int64_t i) const {
    if (bound)
      return e;
    const std::int64_t g = grp(i);
    return {__ldg(alpha + g), __ldg(beta + g)};
  }
  __device__ estimate_source bind(std::int64_t i0) const {
    estimate_source b = *this;
    b.e = at_index(i0);
    b.bound = true;
    return b;
  }
};

struct quantize_op {
  static constexpr bool needs_position = false, needs_index = true;
  estimate_source src;
  emu::policy pol;
  __device__ quantize_op at(std::int64_t i0) const {
    quantize_op o = *this;
    if (src.uniform_chunks)
      o.src = src.bind(i0);
    return o;
  }
  template <class In>
  __device__ std::uint8_t operator()(In x, std::int64_t i, std::int64_t, std::uint32_t rb) const {
    return ops::quantize(element_ops::load(x), src.at_index(i), pol, rb);
  }
};

template <class Out> struct dequantize_op {
  static constexpr bool needs_position = false, needs_index = true;
  estimate_source src;
  __device__ dequantize_op at(std::int64_t i0) const {
    dequantize_op o = *this;
    if (src.uniform_chunks)
      o.src = src.bind(i0);
    return o;
  }
  __device__ Out operator()(std::uint8_t c, std::int64_t i, std::int64_t, std::uint32_t) const {
    const float v = ops::dequantize(c, src.at_index(i));
    if constexpr (std::is_same_v<Out, float>)
      return v;
    else if constexpr (Out::bf16)
      return Out{ops::to_bf16(v)};
    else
      return Out{ops::to_f16(v)};
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

template <class In, class Out> estimate_source source_of(const actquant_problem& p) {
  constexpr int C = flat_shape<In, Out>::C;
  return estimate_source{p.alpha, p.beta, p.group, p.group.run % C == 0};
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
      if (p.quantize) {
        const quantize_op op{source_of<In, std::uint8_t>(p), p.pol};
        launch_map(static_cast<const In*>(p.x.data), p.n, static_cast<std::uint8_t*>(p.codes.data),
                   p.n, 1, p.n, op, p.pol.round == emu::rounding::stochastic, p.rng, s);
      }
    }
  });
}

void actquant_dequantize(const actquant_problem& p, const exec& ex) {
  const cudaStream_t s = stream_of(ex);
  const auto* codes = static_cast<const std::uint8_t*>(p.codes.data);
  const auto run = [&](auto out_tag) {
    using Out = decltype(out_tag);
    const dequantize_op<Out> op{source_of<std::uint8_t, Out>(p)};
    launch_map(codes, p.n, static_cast<Out*>(p.out.data), p.n, 1, p.n, op, false, {}, s);
  };
  switch (p.out.type) {
  case dtype::bfloat16: run(bf16_out{}); break;
  case dtype::float16: run(f16_out{}); break;
  default: run(float{}); break;
  }
}

} // namespace lowbit::kernels::cuda
