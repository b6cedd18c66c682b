// GPU throughput of block-wise codebook quantization with the dynamic tree map and of the
// SRAM-quantiles estimator (lowbit/kernels/blockwise.hpp), timed with CUDA events like
// quantize_gpu.cpp. Every row carries GB/s and `of_copy` (bytes of the call's inputs and outputs,
// each read or written once, as a fraction of the device-to-device copy bandwidth of the same
// run); the quantile row also carries items_per_second, input values per second. Input: 2^28
// float32 normal values (sigma 2, 1 GiB), generated once on the device.
#include <cstdint>
#include <string>

#include <lowbit/kernels/blockwise.hpp>

#include "gpu_bench.hpp"

namespace lowbit::bench {

namespace {

using kernels::dtype;

constexpr std::int64_t smallest_block = 256; // sizes the absmax buffers for every row
constexpr std::int64_t quantiles_k = 256;

struct blockwise_buffers {
  std::int64_t n = std::int64_t{1} << 28;
  float* x = nullptr;             // input
  std::uint8_t* codes = nullptr;  // one code per element
  float* out = nullptr;           // dequantized values
  float* absmax = nullptr;        // one per block
  std::uint8_t* codes2 = nullptr; // nested: one absmax code per block
  float* absmax2 = nullptr;       // nested: one per nested block
  float* quantiles = nullptr;     // quantiles_k estimates
  blockwise_buffers() {
    const std::int64_t nb = kernels::blockwise_blocks(n, smallest_block);
    const std::int64_t nb2 = kernels::blockwise_blocks(nb, kernels::nested_block);
    ok(cudaMalloc(&x, n * 4));
    ok(cudaMalloc(&codes, n));
    ok(cudaMalloc(&out, n * 4));
    ok(cudaMalloc(&absmax, nb * 4));
    ok(cudaMalloc(&codes2, nb));
    ok(cudaMalloc(&absmax2, nb2 * 4));
    ok(cudaMalloc(&quantiles, quantiles_k * 4));
    fill_normal(x, n, 1, 2.0f);
  }
};

// Allocated and filled by the first benchmark that needs it (none when a filter excludes all).
blockwise_buffers& buf() {
  static blockwise_buffers b;
  ensure_copy_bandwidth(b.out, b.x, static_cast<std::size_t>(b.n) * 4);
  return b;
}

const kernels::codebook& dynamic_map() {
  static const kernels::codebook cb = kernels::codebook::dynamic_tree(true);
  return cb;
}

kernels::nested_absmax nested_views(blockwise_buffers& B, std::int64_t block) {
  const std::int64_t nb = kernels::blockwise_blocks(B.n, block);
  const std::int64_t nb2 = kernels::blockwise_blocks(nb, kernels::nested_block);
  kernels::nested_absmax nested;
  nested.codes = dev_view(B.codes2, dtype::uint8, {nb});
  nested.absmax = dev_view(B.absmax2, dtype::float32, {nb2});
  return nested; // cb: the default unsigned dynamic tree map
}

// float32 -> uint8 codes + float32 absmax per block: reads 4n, writes n + 4 * blocks.
// `offset`: the input starts that many elements into its buffer (1: not 16-byte aligned, so the
// segment kernel runs instead of the flat one), n - offset elements.
void bm_quantize(benchmark::State& state, std::int64_t block, kernels::codebook_rounding r,
                 std::int64_t offset = 0) {
  auto& B = buf();
  const std::int64_t n = B.n - offset;
  const std::int64_t nb = kernels::blockwise_blocks(n, block);
  const double bytes = 4.0 * n + 1.0 * n + 4.0 * nb;
  const auto x = dev_view(B.x + offset, dtype::float32, {n});
  const auto c = dev_view(B.codes, dtype::uint8, {n});
  const auto a = dev_view(B.absmax, dtype::float32, {nb});
  kernels::blockwise_config cfg;
  cfg.block = block;
  cfg.rounding = r;
  cfg.rng = {42, 0};
  timed(state, bytes, [&] { kernels::quantize_blockwise(x, c, a, dynamic_map(), cfg); });
  add_ratio(state, bytes);
}

// uint8 codes + float32 absmax -> float32: reads n + 4 * blocks, writes 4n. The codes are those
// of the Gaussian input (quantized once before timing), not a constant pattern.
void bm_dequantize(benchmark::State& state, std::int64_t block) {
  auto& B = buf();
  const std::int64_t nb = kernels::blockwise_blocks(B.n, block);
  const double bytes = 1.0 * B.n + 4.0 * nb + 4.0 * B.n;
  const auto x = dev_view(B.x, dtype::float32, {B.n});
  const auto c = dev_view(B.codes, dtype::uint8, {B.n});
  const auto a = dev_view(B.absmax, dtype::float32, {nb});
  const auto o = dev_view(B.out, dtype::float32, {B.n});
  kernels::blockwise_config cfg;
  cfg.block = block;
  kernels::quantize_blockwise(x, c, a, dynamic_map(), cfg);
  timed(state, bytes, [&] { kernels::dequantize_blockwise(c, a, o, dynamic_map(), block); });
  add_ratio(state, bytes);
}

// Nested absmax: reads 4n, writes n codes + one absmax code per block + 4 bytes per nested
// block (the float absmax the call keeps in scratch between its two passes is not counted).
void bm_quantize_nested(benchmark::State& state, std::int64_t block) {
  auto& B = buf();
  const std::int64_t nb = kernels::blockwise_blocks(B.n, block);
  const std::int64_t nb2 = kernels::blockwise_blocks(nb, kernels::nested_block);
  const double bytes = 4.0 * B.n + 1.0 * B.n + 1.0 * nb + 4.0 * nb2;
  const auto x = dev_view(B.x, dtype::float32, {B.n});
  const auto c = dev_view(B.codes, dtype::uint8, {B.n});
  const auto nested = nested_views(B, block);
  kernels::blockwise_config cfg;
  cfg.block = block;
  timed(state, bytes,
        [&] { kernels::quantize_blockwise_nested(x, c, nested, dynamic_map(), cfg); });
  add_ratio(state, bytes);
}

// Nested dequantize: reads n + nb + 4 * nb2, writes 4n.
void bm_dequantize_nested(benchmark::State& state, std::int64_t block) {
  auto& B = buf();
  const std::int64_t nb = kernels::blockwise_blocks(B.n, block);
  const std::int64_t nb2 = kernels::blockwise_blocks(nb, kernels::nested_block);
  const double bytes = 1.0 * B.n + 1.0 * nb + 4.0 * nb2 + 4.0 * B.n;
  const auto x = dev_view(B.x, dtype::float32, {B.n});
  const auto c = dev_view(B.codes, dtype::uint8, {B.n});
  const auto o = dev_view(B.out, dtype::float32, {B.n});
  const auto nested = nested_views(B, block);
  kernels::blockwise_config cfg;
  cfg.block = block;
  kernels::quantize_blockwise_nested(x, c, nested, dynamic_map(), cfg);
  timed(state, bytes,
        [&] { kernels::dequantize_blockwise_nested(c, nested, o, dynamic_map(), block); });
  add_ratio(state, bytes);
}

// SRAM-quantiles: reads 4n, writes 4k; items are input values.
void bm_quantiles(benchmark::State& state) {
  auto& B = buf();
  const double bytes = 4.0 * B.n + 4.0 * quantiles_k;
  const auto x = dev_view(B.x, dtype::float32, {B.n});
  const auto q = dev_view(B.quantiles, dtype::float32, {quantiles_k});
  timed(state, bytes, [&] { kernels::estimate_quantiles(x, q); });
  add_ratio(state, bytes);
  state.SetItemsProcessed(B.n * state.iterations());
}

} // namespace

void register_blockwise() {
  using kernels::codebook_rounding;
  register_gpu("blockwise_quantize_dynamic_f32_b256",
               [](benchmark::State& s) { bm_quantize(s, 256, codebook_rounding::nearest); });
  register_gpu("blockwise_quantize_dynamic_f32_b2048",
               [](benchmark::State& s) { bm_quantize(s, 2048, codebook_rounding::nearest); });
  register_gpu("blockwise_quantize_dynamic_f32_b256_misaligned",
               [](benchmark::State& s) { bm_quantize(s, 256, codebook_rounding::nearest, 1); });
  register_gpu("blockwise_quantize_dynamic_f32_b2048_stochastic",
               [](benchmark::State& s) { bm_quantize(s, 2048, codebook_rounding::stochastic); });
  register_gpu("blockwise_dequantize_dynamic_f32_b256",
               [](benchmark::State& s) { bm_dequantize(s, 256); });
  register_gpu("blockwise_dequantize_dynamic_f32_b2048",
               [](benchmark::State& s) { bm_dequantize(s, 2048); });
  register_gpu("blockwise_nested_quantize_dynamic_f32_b256",
               [](benchmark::State& s) { bm_quantize_nested(s, 256); });
  register_gpu("blockwise_nested_dequantize_dynamic_f32_b256",
               [](benchmark::State& s) { bm_dequantize_nested(s, 256); });
  register_gpu("sram_quantiles_f32_k256", bm_quantiles);
}

} // namespace lowbit::bench
