// The CUDA kernels of quantize() and quantize_mx() (quantize.cu has the plan), for one input
// type a translation unit: quantize_input<In> is instantiated in quantize_f32.cu,
// quantize_bf16.cu and quantize_f16.cu, so that the three compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../common/cuda_map.cuh"
#include "../common/dispatch.hpp"
#include "../common/group_pass.cuh"
#include "quantize_internal.hpp"
#include "quantize_ops.hpp"

namespace lowbit::kernels::cuda {

namespace {

using quant_ops::abs_bits;

constexpr int threads = 256;

// ---- amax --------------------------------------------------------------------------------------

// |x| max bits of a tensor: each block's maximum to amax[block] (nothing to zero first).
template <class In>
__global__ void __launch_bounds__(threads)
    amax_tensor_kernel(const In* __restrict__ x, std::int64_t rows, std::int64_t cols,
                       std::int64_t rs, std::uint32_t* __restrict__ amax) {
  std::uint32_t m = 0;
  constexpr int V = 16 / sizeof(In);
  if (rs == cols) { // contiguous: one flat grid-stride loop, 16-byte loads where aligned
    const std::int64_t n = rows * cols;
    const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
      // U vectors in flight per thread, a warp's u-th load one contiguous span.
      constexpr int U = 8;
      const std::int64_t nv = n / V; // whole vectors
      std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * blockDim.x * U + threadIdx.x;
      for (; t0 + (U - 1) * blockDim.x < nv; t0 += step * U) {
        vec<In, V> w[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
          w[u] = *reinterpret_cast<const vec<In, V>*>(x + (t0 + u * blockDim.x) * V);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int e = 0; e < V; ++e)
            m = max(m, abs_bits(element_ops::load(w[u].v[e])));
      }
      for (; t0 < nv; t0 += blockDim.x) // the last, partial group of U (this thread's part)
        for (int e = 0; e < V; ++e)
          m = max(m, abs_bits(element_ops::load(x[t0 * V + e])));
      i = nv * V + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    }
    for (; i < n; i += step)
      m = max(m, abs_bits(element_ops::load(x[i])));
  } else {
    for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y)
      for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
           c < cols; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        m = max(m, abs_bits(element_ops::load(x[r * rs + c])));
  }
  m = block_max(m);
  if (threadIdx.x == 0)
    amax[blockIdx.y * gridDim.x + blockIdx.x] = m;
}

// Per-column amax: a 32 x 8 block covers 32 columns and strides down the rows.
template <class In>
__global__ void __launch_bounds__(threads)
    amax_columns_kernel(const In* __restrict__ x, std::int64_t rows, std::int64_t cols,
                        std::int64_t rs, std::uint32_t* __restrict__ amax) {
  __shared__ std::uint32_t part[8][33];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  std::uint32_t m = 0;
  if (c < cols)
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * 8 + threadIdx.y; r < rows;
         r += static_cast<std::int64_t>(gridDim.y) * 8)
      m = max(m, abs_bits(element_ops::load(x[r * rs + c])));
  part[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int k = 1; k < 8; ++k)
      m = max(m, part[k][threadIdx.x]);
    if (m != 0)
      atomicMax(amax + c, m);
  }
}

// Scales of every group from its amax: q to scratch, d to the output.
__global__ void scale_kernel(const std::uint32_t* __restrict__ amax, float* __restrict__ q,
                             float* __restrict__ d, std::int64_t groups, float target_max,
                             scaling sc) {
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto s = quant_ops::scale_from_amax(amax[g], target_max, sc);
    q[g] = s.q;
    if (d != nullptr)
      d[g] = s.d;
  }
}

// Current scaling's scale from the amax kernel's block maxima (one block): q to scratch for the
// cast (read once per thread there, a uniform value), d to the output.
__global__ void __launch_bounds__(threads)
    tensor_scale_kernel(const std::uint32_t* __restrict__ partial, int parts, float* __restrict__ q,
                        float* __restrict__ d, float target_max, scaling sc) {
  std::uint32_t m = 0;
  for (int j = threadIdx.x; j < parts; j += blockDim.x)
    m = max(m, partial[j]);
  m = block_max(m);
  if (threadIdx.x == 0) {
    const auto s = quant_ops::scale_from_amax(m, target_max, sc);
    *q = s.q;
    if (d != nullptr)
      *d = s.d;
  }
}

// Delayed scaling, step 1: the scale from the history, then the history shifted by one with a
// zero at the front for this step's amax (accumulated by the cast kernel).
__global__ void history_kernel(float* __restrict__ hist, int h, history_reduce reduce,
                               float* __restrict__ scale_pair, float target_max, scaling sc) {
  if (threadIdx.x != 0 || blockIdx.x != 0)
    return;
  std::uint32_t used = abs_bits(hist[0]);
  if (reduce == history_reduce::max)
    for (int k = 1; k < h; ++k)
      used = max(used, abs_bits(hist[k]));
  const auto s = quant_ops::scale_from_amax(used, target_max, sc);
  scale_pair[0] = s.q;
  scale_pair[1] = s.d;
  for (int k = h - 1; k > 0; --k)
    hist[k] = hist[k - 1];
  hist[0] = 0.0f;
}

// ---- element-wise cast with a scale per column or per tensor --------------------------------

template <class FT, class PT, class Code> struct column_op {
  static constexpr bool needs_position = true;
  target t;
  FT ft;
  PT pt;
  const float* q;
  template <class In>
  __device__ Code operator()(In x, std::int64_t, std::int64_t c, std::uint32_t rbits) const {
    return static_cast<Code>(
        quant_ops::quantize_element(t, ft, pt, element_ops::load(x), q[c], rbits));
  }
};

// Same with one scale for the tensor, read once per thread.
template <class FT, class PT, class Code> struct tensor_op {
  static constexpr bool needs_position = false;
  target t;
  FT ft;
  PT pt;
  const float* q;
  float qv = 0.0f;
  __device__ tensor_op prepare() const {
    tensor_op o = *this;
    o.qv = __ldg(q);
    return o;
  }
  template <class In>
  __device__ Code operator()(In x, std::int64_t, std::int64_t, std::uint32_t rbits) const {
    return static_cast<Code>(
        quant_ops::quantize_element(t, ft, pt, element_ops::load(x), qv, rbits));
  }
};

// Cast fused with the amax of the same elements (delayed scaling: quantize with the history's
// scale and measure this step's amax in one read of x).
template <class In, class Code, class FT, class PT>
__global__ void __launch_bounds__(threads)
    cast_amax_kernel(const In* __restrict__ x, std::int64_t rows, std::int64_t cols,
                     std::int64_t xrs, Code* __restrict__ codes, std::int64_t crs, target t, FT ft,
                     PT pt, const float* __restrict__ qp, std::uint32_t* __restrict__ amax,
                     emu::random_stream rng) {
  const float q = *qp;
  std::uint32_t m = 0;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         c < cols; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const float v = element_ops::load(x[r * xrs + c]);
      m = max(m, abs_bits(v));
      const std::uint32_t rb =
          pt.stochastic() ? rng.bits(static_cast<std::uint64_t>(r * cols + c)) : 0u;
      codes[r * crs + c] = static_cast<Code>(quant_ops::quantize_element(t, ft, pt, v, q, rb));
    }
  m = block_max(m);
  if (threadIdx.x == 0 && m != 0)
    atomicMax(amax, m);
}

// Per-column scales with the transposed write: a 32 x 32 tile goes through shared memory so that
// both the read of x and the write of x^T are coalesced.
template <class In, class Code, class FT, class PT>
__global__ void __launch_bounds__(threads)
    cast_transpose_kernel(const In* __restrict__ x, std::int64_t rows, std::int64_t cols,
                          std::int64_t xrs, Code* __restrict__ codes, std::int64_t crs, target t,
                          FT ft, PT pt, const float* __restrict__ q, emu::random_stream rng) {
  __shared__ float tile[32][33];
  const std::int64_t tiles_c = (cols + 31) / 32, tiles_r = (rows + 31) / 32;
  for (std::int64_t tix = blockIdx.x; tix < tiles_c * tiles_r; tix += gridDim.x) {
    const std::int64_t r0 = (tix / tiles_c) * 32, c0 = (tix % tiles_c) * 32;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 32; k += 8) {
      const std::int64_t r = r0 + threadIdx.y + k, c = c0 + threadIdx.x;
      if (r < rows && c < cols)
        tile[threadIdx.y + k][threadIdx.x] = element_ops::load(x[r * xrs + c]);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 32; k += 8) {
      const std::int64_t c = c0 + threadIdx.y + k, r = r0 + threadIdx.x; // output row c, col r
      if (r < rows && c < cols) {
        const std::uint32_t rb =
            pt.stochastic() ? rng.bits(static_cast<std::uint64_t>(r * cols + c)) : 0u;
        codes[c * crs + r] = static_cast<Code>(
            quant_ops::quantize_element(t, ft, pt, tile[threadIdx.x][threadIdx.y + k], q[c], rb));
      }
    }
  }
}

// ---- one pass per group (common/group_pass.cuh) ---------------------------------------------

// Groups scaled by the quantization rule of quantize.hpp: q = max / amax (margins, powers of two).
template <class FT, class PT> struct amax_rule {
  using scale_type = float;
  struct group {
    float q, d;
  };
  target t;
  FT ft;
  PT pt;
  float target_max;
  scaling sc;
  __device__ group begin(std::uint32_t amax_bits) const {
    const auto s = quant_ops::scale_from_amax(amax_bits, target_max, sc);
    return {s.q, s.d};
  }
  __device__ float stored(const group& g) const { return g.d; }
  __device__ std::uint32_t element(const group& g, float x, std::uint32_t rbits) const {
    return quant_ops::quantize_element(t, ft, pt, x, g.q, rbits);
  }
  __device__ bool stochastic() const { return pt.stochastic(); }
};

// OCP MX: the E8M0 scale code from the block's amax, elements divided by it exactly.
template <class FT, class PT> struct mx_rule {
  using scale_type = std::uint8_t;
  struct group {
    std::uint32_t code;
  };
  target t;
  FT ft;
  PT pt;
  int emax; // of the element format (target::emax)
  __device__ group begin(std::uint32_t amax_bits) const {
    return {quant_ops::mx_scale_code(amax_bits, emax)};
  }
  __device__ std::uint8_t stored(const group& g) const { return static_cast<std::uint8_t>(g.code); }
  __device__ std::uint32_t element(const group& g, float x, std::uint32_t rbits) const {
    return quant_ops::mx_element(t, ft, pt, x, g.code, rbits);
  }
  __device__ bool stochastic() const { return pt.stochastic(); }
};

// Calls fn(Code tag, format tag, policy tag) for a call's types, input In. The code type follows
// from the target: uint8 for the fixed fp8 formats, else whatever the codes view holds.
template <class In, class Fn>
void with_kernel_types(dtype code, const target& t, const emu::policy& pol, Fn&& fn) {
  detail::dispatch_target_for<In>(t, [&](auto ft) {
    const auto with_code = [&](auto code_tag) {
      detail::dispatch_policy(pol, [&](auto pt) { fn(code_tag, ft, pt); });
    };
    if constexpr (std::is_same_v<decltype(ft), detail::runtime_format>) {
      if (code == dtype::int8)
        return with_code(std::int8_t{});
      if (code == dtype::uint16)
        return with_code(std::uint16_t{});
    }
    with_code(std::uint8_t{});
  });
}

// How quantize() runs a problem: which kernels, in which order.
enum class schedule : std::uint8_t {
  given_scale, // the cast with the caller's scale
  history,     // delayed scaling: the scale from the history, then the cast fused with the amax
  tensor,      // the amax kernel's block maxima -> tensor_scale_kernel -> the cast
  columns,     // per-column amax -> scale_kernel -> the cast (transposed or not); also the single
               // scale of an empty tensor
  groups,      // one pass per group (group_pass.cuh), or an empty input's scales alone
};

schedule schedule_of(const quant_problem& p) {
  if (p.src == scale_source::given)
    return schedule::given_scale;
  if (p.src == scale_source::history)
    return schedule::history;
  switch (p.g.k) {
  case grouping::kind::tensor:
    return p.xm.rows * p.xm.cols != 0 ? schedule::tensor : schedule::columns;
  case grouping::kind::columns: return schedule::columns;
  default: return schedule::groups;
  }
}

// The launches of each schedule for one set of kernel types (with_kernel_types).
template <class In, class Code, class FT, class PT> struct quantize_launch {
  const quant_problem& p;
  FT ft;
  PT pt;
  cudaStream_t stream;

  std::int64_t m() const { return p.xm.rows; }
  std::int64_t n() const { return p.xm.cols; }
  const In* x() const { return p.x.ptr<const In>(); }
  Code* codes() const { return p.codes.ptr<Code>(); }
  float* scales() const { return p.scales.ptr<float>(); }

  void tensor_cast(const float* q) const {
    launch_map(x(), p.xm.row_stride, codes(), p.cm.row_stride, m(), n(),
               tensor_op<FT, PT, Code>{p.t, ft, pt, q}, pt.stochastic(), p.rng, stream);
  }

  // scales[g] = d from amax[g] (q to `q`) for `groups` groups.
  void group_scales(const std::uint32_t* amax, float* q, std::int64_t groups) const {
    scale_kernel<<<grid_for(groups, threads), threads, 0, stream>>>(amax, q, scales(), groups,
                                                                    p.target_max, p.sc);
    check_launch("scale_kernel");
  }

  void given_scale() const { tensor_cast(p.scale_in.ptr<const float>()); }

  void history() const {
    float* hist = p.scale_in.ptr<float>();
    history_kernel<<<1, 32, 0, stream>>>(hist, static_cast<int>(p.scale_in.numel()), p.reduce,
                                         scales(), p.target_max, p.sc);
    check_launch("history_kernel");
    if (m() * n() == 0)
      return;
    cast_amax_kernel<<<grid_2d_for(n(), m(), threads), threads, 0, stream>>>(
        x(), m(), n(), p.xm.row_stride, codes(), p.cm.row_stride, p.t, ft, pt, scales(),
        reinterpret_cast<std::uint32_t*>(hist), p.rng);
    check_launch("cast_amax_kernel");
  }

  // The amax kernel's grid: one flat loop where x is contiguous, else rows along y.
  dim3 amax_grid() const {
    const bool flat = p.xm.contiguous();
    const unsigned gx = grid_for(flat ? m() * n() : n(), threads);
    return dim3(gx, flat ? 1u : grid_rows_for(m(), gx));
  }

  // The amax kernel's block maxima (nothing to zero first), the scale from them, the cast.
  void tensor() const {
    const dim3 grid = amax_grid();
    const int parts = static_cast<int>(grid.x * grid.y);
    scratch partial(sizeof(std::uint32_t) * parts + sizeof(float), stream);
    amax_tensor_kernel<<<grid, threads, 0, stream>>>(x(), m(), n(), p.xm.row_stride,
                                                     partial.as<std::uint32_t>());
    check_launch("amax_tensor_kernel");
    float* q = reinterpret_cast<float*>(partial.as<std::uint32_t>() + parts);
    tensor_scale_kernel<<<1, threads, 0, stream>>>(partial.as<const std::uint32_t>(), parts, q,
                                                   scales(), p.target_max, p.sc);
    check_launch("tensor_scale_kernel");
    tensor_cast(q);
  }

  void columns() const {
    const bool cols = p.g.k == grouping::kind::columns;
    const std::int64_t groups = cols ? n() : 1;
    scratch amax(sizeof(std::uint32_t) * groups, stream), q(sizeof(float) * groups, stream);
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(amax.as<void>(), 0, sizeof(std::uint32_t) * groups, stream));
    if (m() * n() != 0) { // columns (an empty tensor only needs its scale)
      const auto gx = static_cast<unsigned>((n() + 31) / 32);
      amax_columns_kernel<<<dim3(gx, grid_rows_for((m() + 7) / 8, gx)), dim3(32, 8), 0, stream>>>(
          x(), m(), n(), p.xm.row_stride, amax.as<std::uint32_t>());
      check_launch("amax_columns_kernel");
    }
    group_scales(amax.as<std::uint32_t>(), q.as<float>(), groups);
    if (m() * n() == 0)
      return; // an empty tensor's scale only
    if (p.transpose) {
      const std::int64_t tiles = ((m() + 31) / 32) * ((n() + 31) / 32);
      cast_transpose_kernel<<<grid_for(tiles * threads, threads), dim3(32, 8), 0, stream>>>(
          x(), m(), n(), p.xm.row_stride, codes(), p.cm.row_stride, p.t, ft, pt,
          q.as<const float>(), p.rng);
      check_launch("cast_transpose_kernel");
    } else {
      launch_map(x(), p.xm.row_stride, codes(), p.cm.row_stride, m(), n(),
                 column_op<FT, PT, Code>{p.t, ft, pt, q.as<const float>()}, pt.stochastic(), p.rng,
                 stream);
    }
  }

  void groups() const {
    if (m() * n() == 0) {
      // Groups without elements still get their scale: amax 0 gives d = 1.
      const std::int64_t groups = p.g.scale_rows(m()) * p.g.scale_cols(n());
      if (groups == 0)
        return;
      scratch amax(sizeof(std::uint32_t) * groups, stream), q(sizeof(float) * groups, stream);
      LOWBIT_CUDA_CHECK(
          cudaMemsetAsync(amax.as<void>(), 0, sizeof(std::uint32_t) * groups, stream));
      group_scales(amax.as<std::uint32_t>(), q.as<float>(), groups);
      return;
    }
    const std::int64_t gr = p.g.k == grouping::kind::tiles ? p.g.tile_rows : 1;
    const std::int64_t gc =
        p.g.k == grouping::kind::rows ? std::max<std::int64_t>(n(), 1) : p.g.tile_cols;
    launch_groups(x(), p.xm, codes(), p.cm, scales(), gr, gc,
                  amax_rule<FT, PT>{p.t, ft, pt, p.target_max, p.sc}, p.rng, stream);
  }

  void run(schedule s) const {
    switch (s) {
    case schedule::given_scale: return given_scale();
    case schedule::history: return history();
    case schedule::tensor: return tensor();
    case schedule::columns: return columns();
    case schedule::groups: return groups();
    }
  }
};

} // namespace

template <class In> void quantize_input(const quant_problem& p, const exec& ex) {
  const schedule s = schedule_of(p);
  with_kernel_types<In>(p.codes.type, p.t, p.pol, [&](auto code_tag, auto ft, auto pt) {
    quantize_launch<In, decltype(code_tag), decltype(ft), decltype(pt)>{p, ft, pt, stream_of(ex)}
        .run(s);
  });
}

template <class In> void quantize_mx_input(const mx_problem& p, const exec& ex) {
  with_kernel_types<In>(p.codes.type, p.t, p.pol, [&](auto code_tag, auto ft, auto pt) {
    using Code = decltype(code_tag);
    if constexpr (!std::is_same_v<Code, std::uint16_t>) {
      launch_groups(p.x.ptr<const In>(), p.xm, p.codes.ptr<Code>(), p.cm,
                    p.scales.ptr<std::uint8_t>(), 1, p.block,
                    mx_rule<decltype(ft), decltype(pt)>{p.t, ft, pt, p.t.emax()}, p.rng,
                    stream_of(ex));
    }
  });
}

} // namespace lowbit::kernels::cuda
