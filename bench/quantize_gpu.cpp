// GPU throughput of the cast and quantization kernels, timed with CUDA events (manual time).
// Every result carries `of_copy`: its bandwidth (bytes read + written once) as a fraction of a
// device-to-device copy measured in the same run. Inputs are 2^28 floats (1 GiB), well past L2.
// main() runs every GPU benchmark of the project: these, then blockwise_gpu.cpp's.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/quantize.hpp>

#include "gpu_bench.hpp"

namespace {

using namespace lowbit;
using namespace lowbit::bench;
using kernels::dtype;

struct buffers {
  std::int64_t n = std::int64_t{1} << 28;
  void* x = nullptr;     // float32 input
  void* codes = nullptr; // 1 byte per element
  void* out = nullptr;   // float32 output
  void* scales = nullptr;
  buffers() {
    ok(cudaMalloc(&x, n * 4));
    ok(cudaMalloc(&codes, n));
    ok(cudaMalloc(&out, n * 4));
    ok(cudaMalloc(&scales, n / 8 * 4));
    // Gaussian data (never zeros: zeros hide wrong indexing and run faster).
    std::vector<float> h(static_cast<std::size_t>(n));
    std::mt19937 g(1);
    std::normal_distribution<float> d(0.0f, 2.0f);
    for (auto& v : h)
      v = d(g);
    ok(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice));
    ok(cudaMemset(scales, 0, n / 8 * 4));
    const float one = 1.0f;
    ok(cudaMemcpy(scales, &one, 4, cudaMemcpyHostToDevice));
  }
};

buffers& buf() {
  static buffers b;
  return b;
}

void bm_copy(benchmark::State& state) {
  auto& B = buf();
  const double bytes = 2.0 * 4 * B.n;
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a));
  ok(cudaEventCreate(&b));
  ok(cudaMemcpyAsync(B.out, B.x, B.n * 4, cudaMemcpyDeviceToDevice));
  double total_ms = 0;
  for (auto _ : state) {
    ok(cudaEventRecord(a));
    ok(cudaMemcpyAsync(B.out, B.x, B.n * 4, cudaMemcpyDeviceToDevice));
    ok(cudaEventRecord(b));
    ok(cudaEventSynchronize(b));
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b));
    total_ms += ms;
    state.SetIterationTime(ms / 1e3);
  }
  copy_bytes_per_s = bytes * state.iterations() / (total_ms / 1e3);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void bm_cast(benchmark::State& state, emu::format f, emu::policy p) {
  auto& B = buf();
  const double bytes = 5.0 * B.n;
  const auto x = dev_view(B.x, dtype::float32, {B.n});
  const auto c = dev_view(B.codes, dtype::uint8, {B.n});
  timed(state, bytes, [&] { kernels::cast(x, c, f, p, {1, 0}); });
  add_ratio(state, bytes);
}

void bm_decode(benchmark::State& state) {
  auto& B = buf();
  const double bytes = 5.0 * B.n;
  const auto c = dev_view(B.codes, dtype::uint8, {B.n});
  const auto o = dev_view(B.out, dtype::float32, {B.n});
  timed(state, bytes, [&] { kernels::decode(c, o, emu::e4m3fn); });
  add_ratio(state, bytes);
}

void bm_cast_scaled(benchmark::State& state) {
  auto& B = buf();
  const double bytes = 5.0 * B.n;
  const auto x = dev_view(B.x, dtype::float32, {B.n});
  const auto c = dev_view(B.codes, dtype::uint8, {B.n});
  const auto s = dev_view(B.scales, dtype::float32, {1});
  timed(state, bytes,
        [&] { kernels::cast_scaled(x, c, s, kernels::target::of(emu::e4m3fn), emu::rne_sat); });
  add_ratio(state, bytes);
}

// A (rows x cols) view whose rows lie `pad` elements apart beyond their length (padded rows:
// the group pass then walks row segments instead of one flat run of groups).
kernels::tensor_view padded_rows(void* p, dtype t, std::int64_t rows, std::int64_t cols,
                                 std::int64_t pad) {
  auto v = dev_view(p, t, {rows, cols});
  v.strides[0] = cols + pad;
  return v;
}

// Quantization of an (rows x cols) float32 matrix: bytes = input + codes + scales, once each.
void bm_quantize(benchmark::State& state, kernels::target t, kernels::grouping g, std::int64_t cols,
                 bool transpose, emu::policy p, std::int64_t pad = 0) {
  auto& B = buf();
  const std::int64_t rows = B.n / (cols + pad), n = rows * cols;
  const std::int64_t ns = g.scale_rows(rows) * g.scale_cols(cols);
  const double bytes = 4.0 * n + 1.0 * n + 4.0 * ns;
  const auto x = padded_rows(B.x, dtype::float32, rows, cols, pad);
  const auto c = transpose ? dev_view(B.codes, t.code_dtype(), {cols, rows})
                           : padded_rows(B.codes, t.code_dtype(), rows, cols, pad);
  const auto s = dev_view(B.scales, dtype::float32, {ns});
  timed(state, bytes, [&] { kernels::quantize(x, c, s, t, g, p, {}, {2, 0}, transpose); });
  add_ratio(state, bytes);
}

// Row quantization of a bfloat16 (rows x cols) matrix, the layout of the SwitchBack layer's
// activations: bytes = input + codes + scales, once each. Its own buffers (65536 x 5120 takes
// more than buf()'s), the input buf()'s Gaussian values rounded to bfloat16 (repeated past 2^28).
struct bf16_buffers {
  static constexpr std::int64_t n = std::int64_t{65536} * 8192;
  void* x = nullptr;     // bfloat16 input
  void* codes = nullptr; // 1 byte per element
  void* scales = nullptr;
  bf16_buffers() {
    ok(cudaMalloc(&x, n * 2));
    ok(cudaMalloc(&codes, n));
    ok(cudaMalloc(&scales, 65536 * 4 * 4));
    auto& B = buf();
    for (std::int64_t at = 0; at < n; at += B.n) {
      const std::int64_t len = std::min(B.n, n - at);
      kernels::cast(dev_view(B.x, dtype::float32, {len}),
                    dev_view(static_cast<std::uint16_t*>(x) + at, dtype::uint16, {len}),
                    emu::bfloat16, emu::rne);
    }
    ok(cudaDeviceSynchronize());
  }
};

void bm_quantize_bf16_rows(benchmark::State& state, kernels::target t, std::int64_t rows,
                           std::int64_t cols, emu::policy p, std::int64_t pad = 0) {
  static bf16_buffers B;
  const std::int64_t n = rows * cols;
  const double bytes = 2.0 * n + 1.0 * n + 4.0 * rows;
  const auto x = padded_rows(B.x, dtype::bfloat16, rows, cols, pad);
  const auto c = padded_rows(B.codes, t.code_dtype(), rows, cols, pad);
  const auto s = dev_view(B.scales, dtype::float32, {rows});
  timed(state, bytes, [&] {
    kernels::quantize(x, c, s, t, kernels::grouping::per_row(), p, {}, {2, 0}, false);
  });
  add_ratio(state, bytes);
}

void bm_mx(benchmark::State& state, kernels::target t, std::int64_t pad = 0) {
  auto& B = buf();
  const std::int64_t cols = 4096, rows = B.n / (cols + pad), n = rows * cols, ns = n / 32;
  const double bytes = 4.0 * n + 1.0 * n + ns;
  const auto x = padded_rows(B.x, dtype::float32, rows, cols, pad);
  const auto c = padded_rows(B.codes, t.code_dtype(), rows, cols, pad);
  const auto s = dev_view(B.scales, dtype::uint8, {ns});
  timed(state, bytes, [&] { kernels::quantize_mx(x, c, s, t, emu::rne_sat); });
  add_ratio(state, bytes);
}

void bm_dequantize(benchmark::State& state, kernels::grouping g, std::int64_t cols) {
  auto& B = buf();
  const std::int64_t rows = B.n / cols, ns = g.scale_rows(rows) * g.scale_cols(cols);
  const double bytes = 1.0 * B.n + 4.0 * B.n + 4.0 * ns;
  const auto t = kernels::target::of(emu::e4m3fn);
  const auto c = dev_view(B.codes, dtype::uint8, {rows, cols});
  const auto s = dev_view(B.scales, dtype::float32, {ns});
  const auto o = dev_view(B.out, dtype::float32, {rows, cols});
  timed(state, bytes, [&] { kernels::dequantize(c, s, o, t, g); });
  add_ratio(state, bytes);
}

void register_all() {
  const auto reg = [](const std::string& name, auto fn) { register_gpu(name, fn); };
  reg("copy_d2d_f32", bm_copy);
  const auto sr = emu::stochastic(8, emu::overflow::saturate);
  reg("cast_f32_e4m3fn_rne_nonsat", [](benchmark::State& s) { bm_cast(s, emu::e4m3fn, emu::rne); });
  reg("cast_f32_e4m3fn_rne_sat",
      [](benchmark::State& s) { bm_cast(s, emu::e4m3fn, emu::rne_sat); });
  // e4m3 (IEEE-style) is not a compile-time format: the run-time format path, for comparison.
  reg("cast_f32_e4m3_runtime_format_rne_sat",
      [](benchmark::State& s) { bm_cast(s, emu::e4m3, emu::rne_sat); });
  reg("cast_f32_e5m2_rne_sat", [](benchmark::State& s) { bm_cast(s, emu::e5m2, emu::rne_sat); });
  reg("cast_f32_e4m3fn_stochastic8", [sr](benchmark::State& s) { bm_cast(s, emu::e4m3fn, sr); });
  reg("cast_f32_e2m1fn_rne_sat",
      [](benchmark::State& s) { bm_cast(s, emu::e2m1fn, emu::rne_sat); });
  reg("cast_f32_e4m3fn_toward_zero", [](benchmark::State& s) {
    bm_cast(s, emu::e4m3fn, emu::policy{emu::rounding::toward_zero, emu::overflow::saturate});
  });
  reg("decode_e4m3fn_f32", bm_decode);
  reg("cast_scaled_f32_e4m3fn", bm_cast_scaled);
  const auto e4 = kernels::target::of(emu::e4m3fn);
  const auto i8 = kernels::target::of(emu::int8_sym);
  reg("quantize_tensor_current_e4m3fn", [e4](benchmark::State& s) {
    bm_quantize(s, e4, kernels::grouping::per_tensor(), 4096, false, emu::rne_sat);
  });
  reg("quantize_rows_int8_4096", [i8](benchmark::State& s) {
    bm_quantize(s, i8, kernels::grouping::per_row(), 4096, false, emu::rne);
  });
  reg("quantize_rows_int8_4096_padded", [i8](benchmark::State& s) {
    bm_quantize(s, i8, kernels::grouping::per_row(), 4096, false, emu::rne, 4);
  });
  reg("quantize_rows_int8_1024", [i8](benchmark::State& s) {
    bm_quantize(s, i8, kernels::grouping::per_row(), 1024, false, emu::rne);
  });
  reg("quantize_rows_e4m3fn_4096", [e4](benchmark::State& s) {
    bm_quantize(s, e4, kernels::grouping::per_row(), 4096, false, emu::rne_sat);
  });
  // bfloat16 rows (SwitchBack's activations): 1280 and 5120 take the segment kernel, 4096
  // unpadded the flat kernel, 8192 and the padded rows the segment kernel.
  for (const std::int64_t cols : {1280, 4096, 5120, 8192}) {
    const std::int64_t rows = cols == 8192 ? 32768 : 65536;
    const std::string tail = std::to_string(rows) + "x" + std::to_string(cols);
    reg("quantize_rows_bf16_int8_" + tail,
        [=](benchmark::State& s) { bm_quantize_bf16_rows(s, i8, rows, cols, emu::rne); });
    reg("quantize_rows_bf16_e4m3fn_" + tail,
        [=](benchmark::State& s) { bm_quantize_bf16_rows(s, e4, rows, cols, emu::rne_sat); });
  }
  reg("quantize_rows_bf16_int8_65536x5120_padded",
      [i8](benchmark::State& s) { bm_quantize_bf16_rows(s, i8, 65536, 5120, emu::rne, 8); });
  // rows of a multiple of 4 but not 8 elements: 8-byte halves of the 16-byte chunks
  reg("quantize_rows_bf16_int8_65536x5124",
      [i8](benchmark::State& s) { bm_quantize_bf16_rows(s, i8, 65536, 5124, emu::rne); });
  reg("quantize_columns_transpose_int8_4096", [i8](benchmark::State& s) {
    bm_quantize(s, i8, kernels::grouping::per_column(), 4096, true, emu::rne);
  });
  reg("quantize_blocks128_e4m3fn", [e4](benchmark::State& s) {
    bm_quantize(s, e4, kernels::grouping::blocks(128), 4096, false, emu::rne_sat);
  });
  reg("quantize_tiles128x128_e4m3fn", [e4](benchmark::State& s) {
    bm_quantize(s, e4, kernels::grouping::tiles(128, 128), 4096, false, emu::rne_sat);
  });
  reg("quantize_mxfp8_e4m3fn", [e4](benchmark::State& s) { bm_mx(s, e4); });
  reg("quantize_mxfp8_e4m3fn_padded", [e4](benchmark::State& s) { bm_mx(s, e4, 4); });
  reg("quantize_mxfp4_e2m1fn",
      [](benchmark::State& s) { bm_mx(s, kernels::target::of(emu::e2m1fn)); });
  reg("dequantize_rows_e4m3fn_4096",
      [](benchmark::State& s) { bm_dequantize(s, kernels::grouping::per_row(), 4096); });
}

} // namespace

int main(int argc, char** argv) {
  if (!kernels::cuda_available()) {
    std::printf("no CUDA device: GPU benchmarks skipped\n");
    return 0;
  }
  register_all();
  lowbit::bench::register_blockwise();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
