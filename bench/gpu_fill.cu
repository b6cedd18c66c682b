// Normal-looking benchmark data made on the device: two 24-bit uniforms per element from the
// project's Philox stream, turned into one normal value by the Box-Muller transform. A GiB of
// input then costs milliseconds instead of seconds of host generation and a copy, and the values
// depend on (seed, index) alone.
#include "gpu_fill.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include <lowbit/emu/philox.hpp>

namespace lowbit::bench {

namespace {

__global__ void fill_normal_kernel(float* __restrict__ x, std::int64_t n, emu::random_stream rng,
                                   float sigma) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const emu::philox_block r = rng.block(static_cast<std::uint64_t>(i));
    // u1 in (0, 1] keeps the logarithm finite; u2 in [0, 1) picks the angle.
    const float u1 = static_cast<float>((r.v[0] >> 8) + 1u) * 0x1p-24f;
    const float u2 = static_cast<float>(r.v[1] >> 8) * 0x1p-24f;
    x[i] = sigma * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

} // namespace

void fill_normal(float* x, std::int64_t n, std::uint64_t seed, float sigma) {
  if (n <= 0)
    return;
  const int threads = 256;
  const auto grid =
      static_cast<unsigned>(std::min<std::int64_t>((n + threads - 1) / threads, 65536));
  fill_normal_kernel<<<grid, threads>>>(x, n, emu::random_stream{seed, 0}, sigma);
  check(cudaGetLastError(), "fill_normal_kernel launch");
  check(cudaDeviceSynchronize(), "fill_normal_kernel");
}

} // namespace lowbit::bench
