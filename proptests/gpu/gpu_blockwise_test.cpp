// Block-wise codebook quantization and SRAM-quantiles: the CUDA kernels against the CPU twin,
// bit for bit (codes, absmax, nested absmax, dequantized values, quantile estimates).
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/blockwise.hpp>

#include "../common/blockwise_inputs.hpp"
#include "gpu_harness.hpp"

namespace {

using namespace lowbit;
using gpu_test::mirrored;
using gpu_test::same_bytes;
using kernels::codebook;
using kernels::dtype;

// Values of one dtype with zeros, ties of the codebook, tiny values, NaN/Inf now and then.
// `wide`: runs of 64 values share a scale from 2^-140 to 2^119, so that blocks of every size get
// absmax values far outside [2^-60, 2^61) too (the kernels' second form of the division).
void fill(mirrored& in, dtype t, std::int64_t n, std::uint64_t seed, bool specials,
          bool wide = false) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd;
  int run_exp = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 64 == 0)
      run_exp = static_cast<int>(g() % 260) - 140;
    float v = nd(g) * std::ldexp(1.0f, wide ? run_exp : static_cast<int>(g() % 40) - 20);
    const auto k = g() % 100;
    if (k < 5)
      v = 0.0f;
    if (specials && k == 99)
      v = std::numeric_limits<float>::quiet_NaN();
    if (specials && k == 98)
      v = -std::numeric_limits<float>::infinity();
    if (t == dtype::float32) {
      std::memcpy(in.host.data() + 4 * i, &v, 4);
    } else {
      const auto b = static_cast<std::uint16_t>(
          emu::encode(t == dtype::float16 ? emu::float16 : emu::bfloat16, v, emu::policy{}, 0));
      std::memcpy(in.host.data() + 2 * i, &b, 2);
    }
  }
  in.push();
}

// A codebook whose entries crowd, so that the GPU's bucket search walks several midpoints.
codebook crowded_codebook() {
  const std::vector<float> v = lowbit::proptest::test::crowded_codebook_values();
  return codebook::from_values(v.data(), static_cast<std::int64_t>(v.size()));
}

TEST(gpu_vs_cpu, blockwise_quantize_dequantize_nested) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.blockwise", [] {
    const std::vector<codebook> cbs = {codebook::dynamic_tree(true), codebook::dynamic_tree(false),
                                       codebook::linear(true), codebook::from_format(emu::e4m3fn),
                                       crowded_codebook()};
    const codebook cb = *rc::gen::elementOf(cbs);
    kernels::blockwise_config cfg;
    cfg.block = *rc::gen::element<std::int64_t>(64, 128, 256, 512, 1024, 2048, 4096);
    cfg.rounding = *rc::gen::element(kernels::codebook_rounding::nearest,
                                     kernels::codebook_rounding::stochastic);
    cfg.rng = {*rc::gen::arbitrary<std::uint64_t>(), 9};
    const dtype in_t = *rc::gen::element(dtype::float32, dtype::float16, dtype::bfloat16);
    const std::int64_t n = *rc::gen::inRange<std::int64_t>(0, 300000);
    const std::int64_t nb = kernels::blockwise_blocks(n, cfg.block);
    const std::int64_t nb2 = kernels::blockwise_blocks(nb, kernels::nested_block);
    // One time in four the input starts one element into its buffer: not 16-byte aligned, so
    // the GPU takes the segment kernel instead of the flat one.
    const std::int64_t off = *rc::gen::inRange(0, 4) == 0 ? 1 : 0;
    mirrored in(static_cast<std::size_t>(n + off) * kernels::dtype_size(in_t));
    fill(in, in_t, n + off, *rc::gen::arbitrary<std::uint64_t>(), *rc::gen::inRange(0, 3) == 0,
         *rc::gen::inRange(0, 3) == 0);
    mirrored codes(static_cast<std::size_t>(n)), absmax(static_cast<std::size_t>(nb) * 4);
    mirrored codes2(static_cast<std::size_t>(nb)), absmax2(static_cast<std::size_t>(nb2) * 4);
    const bool nested = *rc::gen::arbitrary<bool>();
    for (bool gpu : {false, true}) {
      if (nested)
        kernels::quantize_blockwise_nested(
            in.flat(gpu, in_t, n, off), codes.flat(gpu, dtype::uint8, n),
            {codes2.flat(gpu, dtype::uint8, nb), absmax2.flat(gpu, dtype::float32, nb2)}, cb, cfg);
      else
        kernels::quantize_blockwise(in.flat(gpu, in_t, n, off), codes.flat(gpu, dtype::uint8, n),
                                    absmax.flat(gpu, dtype::float32, nb), cb, cfg);
    }
    RC_ASSERT(same_bytes(codes.host, codes.pull(), "codes"));
    if (nested) {
      RC_ASSERT(same_bytes(codes2.host, codes2.pull(), "nested codes"));
      RC_ASSERT(same_bytes(absmax2.host, absmax2.pull(), "nested absmax"));
    } else {
      RC_ASSERT(same_bytes(absmax.host, absmax.pull(), "absmax"));
    }
    mirrored out(static_cast<std::size_t>(n) * 4);
    for (bool gpu : {false, true}) {
      if (nested)
        kernels::dequantize_blockwise_nested(
            codes.flat(gpu, dtype::uint8, n),
            {codes2.flat(gpu, dtype::uint8, nb), absmax2.flat(gpu, dtype::float32, nb2)},
            out.flat(gpu, dtype::float32, n), cb, cfg.block);
      else
        kernels::dequantize_blockwise(codes.flat(gpu, dtype::uint8, n),
                                      absmax.flat(gpu, dtype::float32, nb),
                                      out.flat(gpu, dtype::float32, n), cb, cfg.block);
    }
    RC_ASSERT(same_bytes(out.host, out.pull(), "dequantized values"));
  }));
}

TEST(gpu_vs_cpu, sram_quantiles) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.sram_quantiles", [] {
    const dtype in_t = *rc::gen::element(dtype::float32, dtype::float16, dtype::bfloat16);
    // Mostly one group of chunks (n <= 2^20), sometimes up to three (the two-level sums).
    const std::int64_t n = *rc::gen::inRange(0, 4) == 0
                               ? *rc::gen::inRange<std::int64_t>(1 << 20, 3 << 20)
                               : *rc::gen::inRange<std::int64_t>(1, 1 << 20);
    const std::int64_t k = *rc::gen::element<std::int64_t>(256, 255, 1, 17, 4096);
    mirrored in(static_cast<std::size_t>(n) * kernels::dtype_size(in_t));
    fill(in, in_t, n, *rc::gen::arbitrary<std::uint64_t>(), *rc::gen::inRange(0, 4) == 0);
    mirrored out(static_cast<std::size_t>(k) * 4);
    for (bool gpu : {false, true})
      kernels::estimate_quantiles(in.flat(gpu, in_t, n), out.flat(gpu, dtype::float32, k));
    RC_ASSERT(same_bytes(out.host, out.pull(), "quantile estimates"));
  }));
}

// float32 values that tie on their high 24 bits, which the GPU's chunk sort orders first
// (quantiles.cu, coarse_bits): exact repeats of a few values (runs of one key), values a
// relative 2^-20 apart around a few hundred centres (short mixed runs, resolved by counting),
// and values crowded into [1, 1 + 2^-16) (a mixed run of the whole chunk: sorted again in full),
// alone or mixed with Gaussian values.
TEST(gpu_vs_cpu, sram_quantiles_tied_high_bits) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.sram_quantiles_tied_high_bits", [] {
    const std::int64_t n = *rc::gen::inRange<std::int64_t>(1, 1 << 18);
    const std::int64_t k = *rc::gen::element<std::int64_t>(256, 255, 17, 4096);
    const int mode = *rc::gen::inRange(0, 4); // repeats, near ties, crowded, all three + Gaussian
    std::mt19937_64 g(*rc::gen::arbitrary<std::uint64_t>());
    std::normal_distribution<float> nd;
    std::vector<float> centres(*rc::gen::inRange(1, 500));
    for (float& c : centres)
      c = nd(g) * std::ldexp(1.0f, static_cast<int>(g() % 8) - 4);
    mirrored in(static_cast<std::size_t>(n) * 4);
    for (std::int64_t i = 0; i < n; ++i) {
      const int m = mode == 3 ? static_cast<int>(g() % 4) : mode;
      const float u = static_cast<float>(g() % 65536) / 65536.0f;
      const float c = centres[g() % centres.size()];
      const float v = m == 0   ? c
                      : m == 1 ? c * (1.0f + u * std::ldexp(1.0f, -20))
                      : m == 2 ? 1.0f + u * std::ldexp(1.0f, -16)
                               : nd(g);
      std::memcpy(in.host.data() + 4 * i, &v, 4);
    }
    in.push();
    mirrored out(static_cast<std::size_t>(k) * 4);
    for (bool gpu : {false, true})
      kernels::estimate_quantiles(in.flat(gpu, dtype::float32, n),
                                  out.flat(gpu, dtype::float32, k));
    RC_ASSERT(same_bytes(out.host, out.pull(), "quantile estimates"));
  }));
}

TEST(gpu_vs_cpu, sram_quantiles_group_order) {
  LOWBIT_REQUIRE_GPU();
  // Chunks of constant values whose products m_c Q(c) are 2^53, 1 (chunks 0 and 1) and 1, -2^53
  // (the first two chunks of group 1): the definition's order gives 1 / n, the plain chunk order
  // 0 (proptests/src/test_blockwise.cpp, sums_in_groups_of_chunks_then_groups).
  const std::int64_t chunk = kernels::quantile_chunk, g = kernels::quantile_group;
  const std::int64_t n = (g + 2) * chunk, k = 7;
  const std::vector<float> x = lowbit::proptest::test::cancelling_chunks_input();
  mirrored in(static_cast<std::size_t>(n) * 4);
  std::memcpy(in.host.data(), x.data(), in.host.size());
  in.push();
  mirrored out(static_cast<std::size_t>(k) * 4);
  for (bool gpu : {false, true})
    kernels::estimate_quantiles(in.flat(gpu, dtype::float32, n), out.flat(gpu, dtype::float32, k));
  EXPECT_TRUE(same_bytes(out.host, out.pull(), "quantile estimates"));
  const float want = static_cast<float>(1.0 / static_cast<double>(n));
  for (std::int64_t i = 0; i < k; ++i) {
    float v;
    std::memcpy(&v, out.host.data() + 4 * i, 4);
    EXPECT_EQ(v, want) << i;
  }
}

} // namespace
