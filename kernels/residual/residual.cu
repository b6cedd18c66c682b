// CUDA kernels of residual split/join: the per-element code of residual_ops.hpp, grid-stride
// with 64-bit indices (the optimizer steps of kernels/optim call the same functions in place).
#include "../common/cuda.hpp"
#include "residual_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

constexpr int threads = 256;

template <class R>
__global__ void __launch_bounds__(threads)
    split_kernel(const float* x, std::uint16_t* w, R* r, std::int64_t n,
                 residual_ops::weight_kind kind, int bits) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const residual_ops::parts s = residual_ops::split(kind, bits, x[i]);
    w[i] = s.w;
    r[i] = static_cast<R>(s.r);
  }
}

template <class R>
__global__ void __launch_bounds__(threads)
    join_kernel(const std::uint16_t* w, const R* r, float* x, std::int64_t n,
                residual_ops::weight_kind kind, int bits) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    x[i] = residual_ops::join(kind, bits, w[i], static_cast<std::int32_t>(r[i]));
}

} // namespace

void residual_split(const residual_problem& p, const exec& ex) {
  const unsigned g = grid_for(p.n, threads);
  if (p.bits <= 8)
    split_kernel<<<g, threads, 0, stream_of(ex)>>>(p.x, p.w, static_cast<std::int8_t*>(p.r), p.n,
                                                   p.kind, p.bits);
  else
    split_kernel<<<g, threads, 0, stream_of(ex)>>>(p.x, p.w, static_cast<std::int16_t*>(p.r), p.n,
                                                   p.kind, p.bits);
  check_launch("residual split_kernel");
}

void residual_join(const residual_problem& p, const exec& ex) {
  const unsigned g = grid_for(p.n, threads);
  if (p.bits <= 8)
    join_kernel<<<g, threads, 0, stream_of(ex)>>>(p.w, static_cast<const std::int8_t*>(p.r), p.x,
                                                  p.n, p.kind, p.bits);
  else
    join_kernel<<<g, threads, 0, stream_of(ex)>>>(p.w, static_cast<const std::int16_t*>(p.r), p.x,
                                                  p.n, p.kind, p.bits);
  check_launch("residual join_kernel");
}

} // namespace lowbit::kernels::cuda
