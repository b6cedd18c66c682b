// Exhaustive on the GPU: every one of the 2^32 float32 inputs converts to e4m3fn and e5m2
// (nearest-even, saturating) exactly as the GPU's own conversion instruction does (sm_89+:
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32), and exactly as emu does on the host; the block-wise
// kernels' reciprocal is correctly rounded on all its arguments. Label: gpu, exhaustive. Skips
// without a device, or (the conversions) on devices older than sm_89.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/cast.hpp>

#include "../../kernels/blockwise/blockwise_ops.hpp"

#include "gpu_harness.hpp"

namespace {

using namespace lowbit;

// bits[i] = the float32 pattern base + i.
__global__ void iota_kernel(std::uint32_t* bits, std::uint64_t base, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    bits[i] = static_cast<std::uint32_t>(base + i);
}

// The hardware conversion of pairs of floats; E5M2 when e5m2 is true.
__global__ void hardware_kernel(const float* x, std::uint8_t* out, std::uint64_t n, bool e5m2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  for (std::uint64_t i = 2 * (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x);
       i + 1 < n; i += 2 * static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    unsigned short r;
    if (e5m2)
      asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x[i + 1]), "f"(x[i]));
    else
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x[i + 1]), "f"(x[i]));
    out[i] = static_cast<std::uint8_t>(r & 0xFF);
    out[i + 1] = static_cast<std::uint8_t>(r >> 8);
  }
#else
  (void)x, (void)out, (void)n, (void)e5m2;
#endif
}

// Counts the v in [2^-22, 2) (float bits lo .. hi - 1) where scaled_divisor's reciprocal differs
// from the correctly rounded division 1 / v.
__global__ void reciprocal_diff_kernel(std::uint32_t lo, std::uint32_t hi,
                                       unsigned long long* count, unsigned long long* first) {
  for (std::uint32_t b = lo + blockIdx.x * blockDim.x + threadIdx.x; b < hi;
       b += gridDim.x * blockDim.x) {
    const float v = __uint_as_float(b);
    if (__float_as_uint(kernels::blockwise_ops::scaled_divisor::reciprocal(v)) !=
        __float_as_uint(__fdiv_rn(1.0f, v))) {
      atomicAdd(count, 1ull);
      atomicMin(first, static_cast<unsigned long long>(b));
    }
  }
}

__global__ void count_diff_kernel(const std::uint8_t* a, const std::uint8_t* b, std::uint64_t n,
                                  unsigned long long* count, unsigned long long* first) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    if (a[i] != b[i]) {
      atomicAdd(count, 1ull);
      atomicMin(first, static_cast<unsigned long long>(i));
    }
}

TEST(gpu_exhaustive, all_floats_match_hardware_cvt_and_emu) {
  LOWBIT_REQUIRE_GPU();
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major * 10 + minor < 89)
    GTEST_SKIP() << "fp8 conversion instructions need sm_89+";

  const std::uint64_t chunk = std::uint64_t{1} << 28;
  gpu_test::device_buffer x(chunk * 4), ours(chunk), hw(chunk), counts(16);
  std::vector<std::uint8_t> host_codes(chunk);
  for (const auto& [fmt, e5m2] : {std::pair{emu::e4m3fn, false}, std::pair{emu::e5m2, true}}) {
    // The instruction's NaN is the positive all-ones code, so compare with nan_sign::positive.
    emu::policy pol = emu::rne_sat;
    pol.nan = emu::nan_sign::positive;
    std::uint64_t hw_diffs = 0, emu_diffs = 0, first_hw = ~0ull;
    for (std::uint64_t base = 0; base < (std::uint64_t{1} << 32); base += chunk) {
      iota_kernel<<<1024, 256>>>(static_cast<std::uint32_t*>(x.get()), base, chunk);
      const auto in = kernels::tensor_view::contiguous(x.get(), kernels::dtype::float32,
                                                       {static_cast<std::int64_t>(chunk)},
                                                       {kernels::device_type::cuda, dev});
      const auto out = kernels::tensor_view::contiguous(ours.get(), kernels::dtype::uint8,
                                                        {static_cast<std::int64_t>(chunk)},
                                                        {kernels::device_type::cuda, dev});
      kernels::cast(in, out, fmt, pol);
      hardware_kernel<<<1024, 256>>>(static_cast<const float*>(x.get()),
                                     static_cast<std::uint8_t*>(hw.get()), chunk, e5m2);
      unsigned long long init[2] = {0ull, ~0ull};
      counts.upload(init, sizeof init);
      auto* c = static_cast<unsigned long long*>(counts.get());
      count_diff_kernel<<<1024, 256>>>(static_cast<const std::uint8_t*>(ours.get()),
                                       static_cast<const std::uint8_t*>(hw.get()), chunk, c, c + 1);
      unsigned long long res[2];
      counts.download(res, sizeof res);
      hw_diffs += res[0];
      if (res[0] != 0)
        first_hw = std::min<std::uint64_t>(first_hw, base + res[1]);
      // The GPU's codes against emu on the host, all 16 host threads.
      ours.download(host_codes.data(), chunk);
      const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
      std::vector<std::uint64_t> bad(nt, 0);
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < nt; ++t)
        pool.emplace_back([&, t] {
          for (std::uint64_t i = t; i < chunk; i += nt) {
            const float v = emu::detail::bit_cast<float>(static_cast<std::uint32_t>(base + i));
            if (emu::encode(fmt, v, pol) != host_codes[i])
              ++bad[t];
          }
        });
      for (auto& th : pool)
        th.join();
      for (auto b : bad)
        emu_diffs += b;
    }
    EXPECT_EQ(hw_diffs, 0u) << (e5m2 ? "e5m2" : "e4m3fn")
                            << ": codes differing from cvt; first input bits 0x" << std::hex
                            << first_hw;
    EXPECT_EQ(emu_diffs, 0u) << (e5m2 ? "e5m2" : "e4m3fn") << ": GPU codes differing from emu";
  }
}

TEST(gpu_exhaustive, scaled_divisor_reciprocal_is_correctly_rounded) {
  LOWBIT_REQUIRE_GPU();
  gpu_test::device_buffer counts(16);
  unsigned long long init[2] = {0ull, ~0ull};
  counts.upload(init, sizeof init);
  auto* c = static_cast<unsigned long long*>(counts.get());
  reciprocal_diff_kernel<<<1024, 256>>>(0x34800000u, 0x40000000u, c, c + 1); // [2^-22, 2)
  unsigned long long res[2];
  counts.download(res, sizeof res);
  EXPECT_EQ(res[0], 0u) << "first differing argument bits 0x" << std::hex << res[1];
}

} // namespace
