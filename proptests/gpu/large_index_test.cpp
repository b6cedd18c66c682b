// 64-bit indexing: tensors of more than 2^31 elements through the GPU kernels, compared with the
// CPU twin. Needs about 16 GB of device memory; skips without a device or without the memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/quantize.hpp>

#include "gpu_harness.hpp"

namespace {

using namespace lowbit;
using kernels::dtype;

TEST(gpu_large, more_than_2_pow_31_elements) {
  LOWBIT_REQUIRE_GPU();
  std::size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  const std::int64_t rows = (std::int64_t{1} << 20) + 3, cols = 2056; // 2^31 + 6.2M elements
  const std::int64_t n = rows * cols;
  if (free_b < static_cast<std::size_t>(n) * 7)
    GTEST_SKIP() << "needs ~" << n * 7 / (1 << 30) << " GiB";
  std::vector<float> x(static_cast<std::size_t>(n));
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (auto& v : x)
    v = d(g);
  for (std::int64_t c = 0; c < cols; ++c)
    x[static_cast<std::size_t>(n - cols + c)] = 1000.0f + c; // last row differs
  gpu_test::device_buffer dx(static_cast<std::size_t>(n) * 4), dc(static_cast<std::size_t>(n)),
      ds(static_cast<std::size_t>(std::max(rows * 4, n / 32)));
  dx.upload(x.data(), x.size() * 4);
  const kernels::device gpu{kernels::device_type::cuda, 0};
  const auto xin = kernels::tensor_view::contiguous(dx.get(), dtype::float32, {rows, cols}, gpu);
  const auto cin = kernels::tensor_view::contiguous(dc.get(), dtype::uint8, {rows, cols}, gpu);
  std::vector<std::uint8_t> cpu_codes(static_cast<std::size_t>(n)),
      gpu_codes(static_cast<std::size_t>(n));

  // plain cast, stochastic so that the random-bit index is exercised past 2^31
  const emu::policy sr = emu::stochastic(16, emu::overflow::saturate);
  kernels::cast(xin, cin, emu::e4m3fn, sr, {9, 1});
  dc.download(gpu_codes.data(), gpu_codes.size());
  kernels::cast(kernels::tensor_view::contiguous(x.data(), dtype::float32, {rows, cols}),
                kernels::tensor_view::contiguous(cpu_codes.data(), dtype::uint8, {rows, cols}),
                emu::e4m3fn, sr, {9, 1});
  EXPECT_EQ(std::memcmp(cpu_codes.data(), gpu_codes.data(), cpu_codes.size()), 0) << "cast";

  // row-wise int8 quantization
  std::vector<float> cpu_scales(static_cast<std::size_t>(rows)),
      gpu_scales(static_cast<std::size_t>(rows));
  const auto t = kernels::target::of(emu::int8_sym);
  const auto cin8 = kernels::tensor_view::contiguous(dc.get(), dtype::int8, {rows, cols}, gpu);
  kernels::quantize(xin, cin8,
                    kernels::tensor_view::contiguous(ds.get(), dtype::float32, {rows}, gpu), t,
                    kernels::grouping::per_row(), emu::rne);
  dc.download(gpu_codes.data(), gpu_codes.size());
  ds.download(gpu_scales.data(), gpu_scales.size() * 4);
  kernels::quantize(kernels::tensor_view::contiguous(x.data(), dtype::float32, {rows, cols}),
                    kernels::tensor_view::contiguous(cpu_codes.data(), dtype::int8, {rows, cols}),
                    kernels::tensor_view::contiguous(cpu_scales.data(), dtype::float32, {rows}), t,
                    kernels::grouping::per_row(), emu::rne);
  EXPECT_EQ(std::memcmp(cpu_codes.data(), gpu_codes.data(), cpu_codes.size()), 0)
      << "row-wise codes";
  EXPECT_EQ(std::memcmp(cpu_scales.data(), gpu_scales.data(), cpu_scales.size() * 4), 0)
      << "row-wise scales";

  // MXFP8 over the tensor's first n2 elements as rows of 4096 (still more than 2^31: the flat
  // group kernel's 64-bit indexing), stochastic so that the random-bit index passes 2^31 too
  const std::int64_t r2 = n / 4096, n2 = r2 * 4096, nb = n2 / 32;
  const auto mx = kernels::target::of(emu::e4m3fn);
  std::vector<std::uint8_t> cpu_mx(static_cast<std::size_t>(nb)),
      gpu_mx(static_cast<std::size_t>(nb));
  kernels::quantize_mx(kernels::tensor_view::contiguous(dx.get(), dtype::float32, {r2, 4096}, gpu),
                       kernels::tensor_view::contiguous(dc.get(), dtype::uint8, {r2, 4096}, gpu),
                       kernels::tensor_view::contiguous(ds.get(), dtype::uint8, {nb}, gpu), mx, sr,
                       32, {5, 2});
  dc.download(gpu_codes.data(), gpu_codes.size());
  ds.download(gpu_mx.data(), gpu_mx.size());
  kernels::quantize_mx(kernels::tensor_view::contiguous(x.data(), dtype::float32, {r2, 4096}),
                       kernels::tensor_view::contiguous(cpu_codes.data(), dtype::uint8, {r2, 4096}),
                       kernels::tensor_view::contiguous(cpu_mx.data(), dtype::uint8, {nb}), mx, sr,
                       32, {5, 2});
  EXPECT_EQ(std::memcmp(cpu_codes.data(), gpu_codes.data(), static_cast<std::size_t>(n2)), 0)
      << "MX codes";
  EXPECT_EQ(std::memcmp(cpu_mx.data(), gpu_mx.data(), cpu_mx.size()), 0) << "MX scales";
}

} // namespace
