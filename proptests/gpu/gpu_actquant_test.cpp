// GPU activation quantization == CPU twin, bit for bit: the estimates after the update (first,
// and lagged: after the codes), the codes
// (nearest-even and stochastic) and the dequantized values, over shapes whose runs are and are
// not multiples of the vector width, with aligned and misaligned inputs, 16-bit inputs and
// outputs, and groups in and beyond shared memory.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/kernels/actquant.hpp>

#include "gpu_harness.hpp"

namespace {

using namespace lowbit;
using kernels::dtype;
using kernels::tensor_view;
using lowbit::gpu_test::mirrored;

tensor_view shaped(tensor_view v, const std::vector<std::int64_t>& shape) {
  v.ndim = static_cast<int>(shape.size());
  std::int64_t s = 1;
  for (int k = v.ndim - 1; k >= 0; --k) {
    v.shape[k] = shape[static_cast<std::size_t>(k)];
    v.strides[k] = s;
    s *= v.shape[k];
  }
  return v;
}

struct gpu_case {
  std::vector<std::int64_t> shape;
  kernels::actquant_groups g;
  dtype in;
  dtype out;
  std::int64_t offset; // elements into the buffers: misaligned inputs
};

void run_case(const gpu_case& c, const emu::policy& pol, std::uint64_t seed) {
  std::int64_t n = 1;
  for (auto e : c.shape)
    n *= e;
  const int nd = static_cast<int>(c.shape.size());
  const int d = c.g.dim < 0 ? c.g.dim + nd : c.g.dim;
  const std::int64_t groups = c.shape[static_cast<std::size_t>(d)] / c.g.group_size;
  const std::size_t isz = kernels::dtype_size(c.in), osz = kernels::dtype_size(c.out);
  mirrored x((static_cast<std::size_t>(n + c.offset)) * isz),
      codes(static_cast<std::size_t>(n + c.offset));
  mirrored alpha(static_cast<std::size_t>(groups) * 4), beta(static_cast<std::size_t>(groups) * 4);
  mirrored out(static_cast<std::size_t>(n + c.offset) * osz);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> nd01(0.0f, 1.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    const float scale = static_cast<float>(1 + (i * 7919 % 13)); // groups of different ranges
    float v = nd01(gen) * scale;
    if (i % 997 == 5)
      v = std::nanf("");
    auto* p = x.host.data() + (c.offset + i) * static_cast<std::int64_t>(isz);
    if (c.in == dtype::float32) {
      std::memcpy(p, &v, 4);
    } else {
      const auto h = static_cast<std::uint16_t>(
          emu::encode(c.in == dtype::bfloat16 ? emu::bfloat16 : emu::float16, v, emu::rne));
      std::memcpy(p, &h, 2);
    }
  }
  std::vector<float> a0(static_cast<std::size_t>(groups), -1.0f), b0(a0.size(), 0.0f);
  std::memcpy(alpha.host.data(), a0.data(), alpha.host.size());
  std::memcpy(beta.host.data(), b0.data(), beta.host.size());
  x.push();
  alpha.push();
  beta.push();
  const emu::random_stream rng{seed, 11};
  for (int step = 0; step < 3; ++step) { // initialise, a momentum update, a lagged one
    for (bool gpu : {false, true}) {
      const auto xv = shaped(x.flat(gpu, c.in, n, c.offset), c.shape);
      const auto cv = shaped(codes.flat(gpu, dtype::uint8, n, c.offset), c.shape);
      const auto av = alpha.flat(gpu, dtype::float32, groups);
      const auto bv = beta.flat(gpu, dtype::float32, groups);
      const auto ov = shaped(out.flat(gpu, c.out, n, c.offset), c.shape);
      if (step == 2) // lagged: the codes of the estimates as they are, then the update
        kernels::actquant_quantize_lagged(xv, cv, av, bv, c.g, pol, rng, 0.9f);
      else
        kernels::actquant_quantize(xv, cv, av, bv, c.g, pol, rng, true, 0.9f);
      kernels::actquant_dequantize(cv, av, bv, ov, c.g);
    }
    const std::string what = "step " + std::to_string(step) + ", dims " + std::to_string(nd) +
                             ", groups " + std::to_string(groups);
    ASSERT_EQ(alpha.host, alpha.pull()) << what << ": alpha";
    ASSERT_EQ(beta.host, beta.pull()) << what << ": beta";
    ASSERT_EQ(codes.host, codes.pull()) << what << ": codes";
    ASSERT_EQ(out.host, out.pull()) << what << ": dequantized";
  }
}

TEST(gpu_actquant, equals_cpu_twin) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<gpu_case> cases = {
      {{4, 12, 197, 64}, {1, 1}, dtype::bfloat16, dtype::bfloat16, 0}, // heads of ViT-B
      {{4, 12, 197, 64}, {1, 1}, dtype::float32, dtype::float32, 0},
      {{788, 768}, {-1, 64}, dtype::bfloat16, dtype::float16, 0},    // channel blocks
      {{788, 768}, {-1, 1}, dtype::float32, dtype::bfloat16, 0},     // per channel
      {{3, 5, 7, 11}, {2, 7}, dtype::float16, dtype::float32, 1},    // odd runs, misaligned
      {{2, 4099, 3}, {1, 1}, dtype::float32, dtype::float32, 3},     // groups beyond shared
      {{1 << 20}, {0, 1 << 20}, dtype::bfloat16, dtype::float32, 0}, // one group
      {{5}, {0, 1}, dtype::float32, dtype::float32, 0},
  };
  std::uint64_t seed = 1;
  for (const auto& c : cases)
    for (const emu::policy& pol : {emu::rne_sat, emu::stochastic(8, emu::overflow::saturate),
                                   emu::stochastic(32, emu::overflow::saturate)}) {
      SCOPED_TRACE("case with " + std::to_string(c.shape.size()) + " dims, seed " +
                   std::to_string(seed));
      run_case(c, pol, seed++);
      if (HasFatalFailure())
        return;
    }
}

// Frozen estimates of every kind the kernels treat apart, GPU == CPU twin bit for bit: normal
// and subnormal alphas (the reciprocal's scale), alphas whose codes overflow float32 or the
// 16-bit outputs, alpha 0 and negative, and NaN / Inf estimates (the 16-bit outputs then take
// the software rounding, which keeps NaN bits).
TEST(gpu_actquant, extreme_estimates_equal_cpu_twin) {
  LOWBIT_REQUIRE_GPU();
  const float nan = std::nanf(""), inf = INFINITY;
  const std::vector<std::pair<float, float>> est = {{0.01f, -1.0f},
                                                    {std::ldexp(1.0f, -140), 0.0f},
                                                    {3 * std::ldexp(1.0f, -138), 1e-40f},
                                                    {1e37f, 0.0f},
                                                    {2e36f, -3e38f},
                                                    {1e-3f, 70000.0f},
                                                    {0.0f, 0.5f},
                                                    {-0.25f, 2.0f},
                                                    {nan, 0.0f},
                                                    {1.0f, nan},
                                                    {inf, 0.0f},
                                                    {1.0f, -inf}};
  const std::int64_t groups = static_cast<std::int64_t>(est.size()), inner = 96, outer = 3;
  const std::vector<std::int64_t> shape = {outer, groups, inner};
  const std::int64_t n = outer * groups * inner;
  mirrored x(static_cast<std::size_t>(n) * 4), codes(static_cast<std::size_t>(n));
  mirrored alpha(static_cast<std::size_t>(groups) * 4), beta(static_cast<std::size_t>(groups) * 4);
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> pos(-20.0, 280.0);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& [a, b] = est[static_cast<std::size_t>((i / inner) % groups)];
    const double av = std::isfinite(a) && a != 0.0f ? std::fabs(static_cast<double>(a)) : 1.0;
    const double bv = std::isfinite(b) ? static_cast<double>(b) : 0.0;
    float v = static_cast<float>(bv + av * pos(gen));
    if (i % 89 == 3)
      v = nan;
    std::memcpy(x.host.data() + 4 * i, &v, 4);
  }
  for (std::int64_t g = 0; g < groups; ++g) {
    std::memcpy(alpha.host.data() + 4 * g, &est[static_cast<std::size_t>(g)].first, 4);
    std::memcpy(beta.host.data() + 4 * g, &est[static_cast<std::size_t>(g)].second, 4);
  }
  x.push();
  alpha.push();
  beta.push();
  const kernels::actquant_groups gr{1, 1};
  for (const emu::policy& pol : {emu::rne_sat, emu::stochastic(12, emu::overflow::saturate),
                                 emu::policy{emu::rounding::toward_zero}}) {
    for (bool gpu : {false, true})
      kernels::actquant_quantize(shaped(x.flat(gpu, dtype::float32, n, 0), shape),
                                 shaped(codes.flat(gpu, dtype::uint8, n, 0), shape),
                                 alpha.flat(gpu, dtype::float32, groups),
                                 beta.flat(gpu, dtype::float32, groups), gr, pol,
                                 emu::random_stream{3, 4}, false, 0.9f);
    ASSERT_EQ(codes.host, codes.pull()) << "codes";
    for (const dtype out_t : {dtype::float32, dtype::bfloat16, dtype::float16}) {
      mirrored out(static_cast<std::size_t>(n) * kernels::dtype_size(out_t));
      for (bool gpu : {false, true})
        kernels::actquant_dequantize(shaped(codes.flat(gpu, dtype::uint8, n, 0), shape),
                                     alpha.flat(gpu, dtype::float32, groups),
                                     beta.flat(gpu, dtype::float32, groups),
                                     shaped(out.flat(gpu, out_t, n, 0), shape), gr);
      ASSERT_EQ(out.host, out.pull()) << "dequantized, dtype " << static_cast<int>(out_t);
    }
  }
}

} // namespace
