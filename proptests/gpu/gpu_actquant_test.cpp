// GPU activation quantization == CPU twin, bit for bit: the estimates after the update (first,
// and lagged: after the codes), the codes
// (nearest-even and stochastic) and the dequantized values, over shapes whose runs are and are
// not multiples of the vector width, with aligned and misaligned inputs, 16-bit inputs and
// outputs, and groups in and beyond shared memory. LayerNorm's backward from codes: gx, gw and
// gb over rows held in registers and wider ones read again, runs of four and the scalar path,
// chunks of rows over several float64 segments, NaN gradients and absent outputs. The
// activations' backward from codes: gx and value of every activation and dtype, runs that are
// and are not multiples of four, misaligned buffers, NaN / Inf in dy and in x.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
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
using lowbit::gpu_test::same_bytes;

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

// ---- LayerNorm's backward from codes (actquant_layer_norm_backward) ---------------------------

struct ln_gpu_case {
  std::int64_t cols, rows, group_size;
  dtype type;
  bool weight;
  std::int64_t offset;      // elements into the gy and gx buffers (1: misaligned runs of four)
  std::int64_t code_offset; // bytes into the codes buffer
  bool nan;                 // NaN in a few gy elements
  float eps = 1e-5f;
  bool want_gx = true, want_gw = true, want_gb = true;
  int extreme = 0; // 1: group 0's alpha puts x beyond float16's range; 2: group 1's beta NaN
};

std::string describe_ln(const ln_gpu_case& c) {
  return "cols " + std::to_string(c.cols) + ", rows " + std::to_string(c.rows) + ", group size " +
         std::to_string(c.group_size) + ", dtype " + kernels::dtype_name(c.type) +
         (c.weight ? ", weight" : ", no weight") + ", offsets " + std::to_string(c.offset) + "/" +
         std::to_string(c.code_offset) + (c.nan ? ", NaN in gy" : "") + ", eps " +
         std::to_string(c.eps) + ", outputs" + (c.want_gx ? " gx" : "") + (c.want_gw ? " gw" : "") +
         (c.want_gb ? " gb" : "") +
         (c.extreme > 0 ? ", extreme estimates " + std::to_string(c.extreme) : "");
}

void run_ln_case(const ln_gpu_case& c, std::uint64_t seed) {
  const std::int64_t C = c.cols, R = c.rows, n = R * C, G = C / c.group_size;
  const std::size_t esz = kernels::dtype_size(c.type);
  const std::vector<std::int64_t> shape = {R, C};
  mirrored codes(static_cast<std::size_t>(n + c.code_offset));
  mirrored alpha(static_cast<std::size_t>(G) * 4), beta(static_cast<std::size_t>(G) * 4);
  mirrored gy(static_cast<std::size_t>(n + c.offset) * esz),
      gx(static_cast<std::size_t>(n + c.offset) * esz);
  mirrored weight(static_cast<std::size_t>(C) * 4), gw(static_cast<std::size_t>(C) * 4),
      gb(static_cast<std::size_t>(C) * 4);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> nd01(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 9);
  // Codes: rows of uniform codes, rows in a narrow band, constant rows.
  for (std::int64_t r = 0; r < R; ++r) {
    const int kind = pick(gen), base = byte(gen);
    for (std::int64_t cc = 0; cc < C; ++cc) {
      int v =
          kind < 6 ? byte(gen) : (kind < 9 ? std::clamp(base + byte(gen) % 7 - 3, 0, 255) : base);
      codes.host[static_cast<std::size_t>(c.code_offset + r * C + cc)] =
          static_cast<unsigned char>(v);
    }
  }
  for (std::int64_t g = 0; g < G; ++g) {
    float a = std::ldexp(1.0f + static_cast<float>(g % 5), -7 - static_cast<int>(g % 3));
    float b = -1.0f + 0.125f * nd01(gen);
    if (c.extreme == 1 && g == 0)
      a = 1024.0f; // codes above 63 give x beyond 65504: Inf in float16
    if (c.extreme == 2 && g == 1)
      b = std::nanf("");
    std::memcpy(alpha.host.data() + 4 * g, &a, 4);
    std::memcpy(beta.host.data() + 4 * g, &b, 4);
  }
  for (std::int64_t r = 0; r < R; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r % 7) - 6);
    for (std::int64_t cc = 0; cc < C; ++cc) {
      const std::int64_t i = r * C + cc;
      float v = nd01(gen) * scale;
      if (c.nan && i % 1009 == 17)
        v = std::nanf("");
      if (c.nan && i % 4999 == 3)
        v = -std::nanf("");
      auto* p = gy.host.data() + (c.offset + i) * static_cast<std::int64_t>(esz);
      if (c.type == dtype::float32) {
        std::memcpy(p, &v, 4);
      } else {
        const auto h = static_cast<std::uint16_t>(
            emu::encode(c.type == dtype::bfloat16 ? emu::bfloat16 : emu::float16, v, emu::rne));
        std::memcpy(p, &h, 2);
      }
    }
  }
  for (std::int64_t cc = 0; cc < C; ++cc) {
    const float w = 1.0f + 0.25f * nd01(gen);
    std::memcpy(weight.host.data() + 4 * cc, &w, 4);
  }
  codes.push();
  alpha.push();
  beta.push();
  gy.push();
  weight.push();
  const auto poison = gw.host; // what an output not written keeps
  for (bool gpu : {false, true}) {
    const auto opt = [&](bool want, const kernels::tensor_view& v) {
      return want ? v : kernels::tensor_view{};
    };
    kernels::actquant_layer_norm_backward(
        shaped(codes.flat(gpu, dtype::uint8, n, c.code_offset), shape),
        alpha.flat(gpu, dtype::float32, G), beta.flat(gpu, dtype::float32, G), c.group_size,
        shaped(gy.flat(gpu, c.type, n, c.offset), shape),
        opt(c.weight, weight.flat(gpu, dtype::float32, C)), c.eps,
        opt(c.want_gx, shaped(gx.flat(gpu, c.type, n, c.offset), shape)),
        opt(c.want_gw, gw.flat(gpu, dtype::float32, C)),
        opt(c.want_gb, gb.flat(gpu, dtype::float32, C)));
  }
  ASSERT_TRUE(same_bytes(gx.host, gx.pull(), "gx"));
  ASSERT_TRUE(same_bytes(gw.host, gw.pull(), "gw"));
  ASSERT_TRUE(same_bytes(gb.host, gb.pull(), "gb"));
  if (!c.want_gx) {
    ASSERT_EQ(gx.host, std::vector<unsigned char>(gx.host.size(), 0xA5)) << "gx absent, written";
  }
  if (!c.want_gw) {
    ASSERT_EQ(gw.host, poison) << "gw absent, written";
  }
  if (!c.want_gb) {
    ASSERT_EQ(gb.host, poison) << "gb absent, written";
  }
  if (R == 0) { // no rows: gw = gb = +0
    const std::vector<unsigned char> zero(gw.host.size(), 0);
    if (c.want_gw) {
      ASSERT_EQ(gw.host, zero) << "gw of no rows";
    }
    if (c.want_gb) {
      ASSERT_EQ(gb.host, zero) << "gb of no rows";
    }
  }
}

TEST(gpu_actquant, layer_norm_backward_equals_cpu_twin) {
  LOWBIT_REQUIRE_GPU();
  const dtype f32 = dtype::float32, bf16 = dtype::bfloat16, f16 = dtype::float16;
  std::vector<ln_gpu_case> cases = {
      // ViT-B's LayerNorm: 5000 rows are 157 chunks of 32 rows, three float64 segments.
      {768, 5000, 64, bf16, true, 0, 0, true},
      {768, 5000, 768, f32, false, 0, 0, false},
      {768, 5000, 1, f16, true, 1, 1, true}, // misaligned gy, gx and codes
      {768, 33, 64, f32, true, 1, 0, true},
      {768, 100, 12, f16, false, 0, 3, false},
      {768, 1, 12, bf16, true, 0, 0, false},
      {64, 100, 16, bf16, true, 0, 0, true},
      {64, 5000, 1, f32, false, 1, 0, false},
      {64, 33, 64, f16, true, 0, 0, false},
      {200, 33, 8, f32, true, 0, 0, true}, // a partial run of four lanes' columns
      {200, 100, 200, f16, false, 1, 3, false},
      {200, 5000, 25, bf16, true, 0, 0, false},
      {130, 100, 13, f16, true, 0, 0, true}, // not a multiple of 4: the scalar path
      {130, 5000, 65, bf16, false, 0, 0, false},
      {130, 1, 1, f32, true, 0, 0, false},
      {130, 33, 2, f32, true, 1, 1, true},
      {1500, 100, 375, f32, true, 0, 0, true}, // wider than 1024: read again per pass
      {1500, 33, 1, bf16, false, 1, 0, false},
      {1500, 5000, 100, f16, true, 0, 0, true},
      {1500, 1, 1500, f16, true, 0, 0, false},
      {3, 5000, 1, f16, true, 0, 0, true},
      {3, 33, 3, f32, false, 1, 1, false},
      {3, 1, 1, bf16, true, 0, 0, false},
      {3, 100, 1, bf16, false, 0, 0, true},
      // The edges of the register-held widths (128 J for J = 1, 2, 4, 8) and beyond.
      {128, 100, 32, bf16, true, 0, 0, false},
      {129, 100, 43, f32, true, 0, 0, false},
      {512, 100, 64, f16, false, 0, 0, false},
      {1024, 100, 128, bf16, true, 0, 0, true},
      {1025, 100, 25, f32, true, 0, 0, false},
      {1, 70, 1, f32, true, 0, 0, false},
  };
  // eps of 0 (constant rows: rstd = Inf, NaN rows) and others.
  cases.push_back({768, 100, 64, f32, true, 0, 0, false, 0.0f});
  cases.push_back({130, 100, 13, bf16, true, 0, 0, false, 0.1f});
  cases.push_back({1500, 100, 1, f16, false, 0, 0, false, 1e-6f});
  // Absent outputs: gx alone, the parameter gradients alone, each alone.
  for (const std::int64_t cols : {768, 130, 1500}) {
    const std::int64_t gs = cols == 130 ? 13 : 4;
    cases.push_back({cols, 100, gs, bf16, true, 0, 0, true, 1e-5f, true, false, false});
    cases.push_back({cols, 100, gs, f32, true, 1, 0, true, 1e-5f, false, true, true});
    cases.push_back({cols, 5000, gs, f16, false, 0, 0, false, 1e-5f, false, true, false});
    cases.push_back({cols, 33, gs, f32, true, 0, 0, false, 1e-5f, false, false, true});
    cases.push_back({cols, 33, gs, bf16, true, 0, 0, false, 1e-5f, true, false, true});
  }
  // Estimates that make x Inf in float16 (some rows) or NaN (every row).
  for (const dtype t : {f16, bf16, f32}) {
    cases.push_back({768, 100, 64, t, true, 0, 0, false, 1e-5f, true, true, true, 1});
    cases.push_back({1500, 33, 100, t, false, 0, 0, false, 1e-5f, true, true, true, 1});
    cases.push_back({130, 33, 13, t, true, 0, 0, false, 1e-5f, true, true, true, 2});
  }
  // No rows: gw = gb = +0 (the buffers start poisoned).
  for (const std::int64_t cols : {768, 130, 1500, 3})
    cases.push_back({cols, 0, 1, cols == 3 ? f16 : f32, true, 0, 0, false});
  cases.push_back({768, 0, 1, bf16, false, 0, 0, false, 1e-5f, true, false, true});
  std::uint64_t seed = 1;
  for (const auto& c : cases) {
    SCOPED_TRACE(describe_ln(c));
    run_ln_case(c, seed++);
    if (HasFatalFailure())
      return;
  }
}

// ---- The activations' backward from codes (actquant_activation_backward) --------------------

struct act_gpu_case {
  std::vector<std::int64_t> shape;
  kernels::actquant_groups g;
  std::int64_t offset;      // elements into the dy, gx and value buffers (1, 3: misaligned)
  std::int64_t code_offset; // bytes into the codes buffer
  bool specials;            // NaN / Inf in dy; with 3 groups or more, estimates giving NaN / Inf x
};

std::string describe_act(const act_gpu_case& c, dtype t, kernels::actquant_activation f,
                         bool value) {
  std::string shape;
  for (auto e : c.shape)
    shape += (shape.empty() ? "" : " x ") + std::to_string(e);
  return "shape " + shape + ", dim " + std::to_string(c.g.dim) + ", group size " +
         std::to_string(c.g.group_size) + ", offsets " + std::to_string(c.offset) + "/" +
         std::to_string(c.code_offset) + (c.specials ? ", NaN / Inf" : "") + ", dtype " +
         kernels::dtype_name(t) + ", activation " + std::to_string(static_cast<int>(f)) +
         (value ? ", value" : ", no value");
}

void run_act_case(const act_gpu_case& c, dtype t, kernels::actquant_activation f, bool value,
                  std::uint64_t seed) {
  std::int64_t n = 1;
  for (auto e : c.shape)
    n *= e;
  const int nd = static_cast<int>(c.shape.size());
  const int d = c.g.dim < 0 ? c.g.dim + nd : c.g.dim;
  const std::int64_t G = c.shape[static_cast<std::size_t>(d)] / c.g.group_size;
  const std::size_t esz = kernels::dtype_size(t);
  mirrored codes(static_cast<std::size_t>(n + c.code_offset));
  mirrored alpha(static_cast<std::size_t>(G) * 4), beta(static_cast<std::size_t>(G) * 4);
  mirrored dy(static_cast<std::size_t>(n + c.offset) * esz),
      gx(static_cast<std::size_t>(n + c.offset) * esz),
      val(static_cast<std::size_t>(n + c.offset) * esz);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> nd01(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (std::int64_t i = 0; i < n; ++i)
    codes.host[static_cast<std::size_t>(c.code_offset + i)] = static_cast<unsigned char>(byte(gen));
  // x spans [-2, 2], [-12, 12], [-40, 40] or [-120, 120] by group (the functions' branches,
  // silu's exp(-x) overflow); with specials, group 0's alpha is NaN, group 1's codes from 35 up
  // are +Inf (float16: from 1), group 2's x lie around -3e38 (-Inf in float16).
  const float spans[4] = {4.0f, 24.0f, 80.0f, 240.0f};
  for (std::int64_t g = 0; g < G; ++g) {
    const float span = spans[g % 4];
    float a = span / 255.0f, b = -span / 2 + 0.25f * nd01(gen);
    if (c.specials && G >= 3 && g < 3) {
      a = g == 0 ? std::nanf("") : (g == 1 ? 1e37f : 1e36f);
      b = g == 2 ? -3e38f : 0.0f;
    }
    std::memcpy(alpha.host.data() + 4 * g, &a, 4);
    std::memcpy(beta.host.data() + 4 * g, &b, 4);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    float v = nd01(gen) * std::ldexp(1.0f, static_cast<int>(i % 7) - 3);
    if (i % 61 == 9)
      v = 0.0f;
    if (c.specials) {
      if (i % 1009 == 17 || n == 5)
        v = std::nanf("");
      if (i % 4999 == 3)
        v = -std::nanf("");
      if (i % 773 == 5)
        v = INFINITY;
      if (i % 1201 == 7)
        v = -INFINITY;
    }
    auto* p = dy.host.data() + (c.offset + i) * static_cast<std::int64_t>(esz);
    if (t == dtype::float32) {
      std::memcpy(p, &v, 4);
    } else {
      const auto h = static_cast<std::uint16_t>(
          emu::encode(t == dtype::bfloat16 ? emu::bfloat16 : emu::float16, v, emu::rne));
      std::memcpy(p, &h, 2);
    }
  }
  codes.push();
  alpha.push();
  beta.push();
  dy.push();
  for (bool gpu : {false, true})
    kernels::actquant_activation_backward(
        shaped(codes.flat(gpu, dtype::uint8, n, c.code_offset), c.shape),
        alpha.flat(gpu, dtype::float32, G), beta.flat(gpu, dtype::float32, G), c.g, f,
        shaped(dy.flat(gpu, t, n, c.offset), c.shape),
        shaped(gx.flat(gpu, t, n, c.offset), c.shape),
        value ? shaped(val.flat(gpu, t, n, c.offset), c.shape) : kernels::tensor_view{});
  ASSERT_TRUE(same_bytes(gx.host, gx.pull(), "gx"));
  ASSERT_TRUE(same_bytes(val.host, val.pull(), "value"));
  if (!value) {
    ASSERT_EQ(val.host, std::vector<unsigned char>(val.host.size(), 0xA5))
        << "value absent, written";
  }
  // The elements before the offset are not written.
  ASSERT_EQ(std::vector<unsigned char>(gx.host.begin(), gx.host.begin() + c.offset * esz),
            std::vector<unsigned char>(static_cast<std::size_t>(c.offset) * esz, 0xA5));
}

TEST(gpu_actquant, activation_backward_equals_cpu_twin) {
  LOWBIT_REQUIRE_GPU();
  const std::vector<act_gpu_case> cases = {
      // ViT-B's MLP hidden layer (64 images of 197 tokens: 50432 / 64 rows), one group.
      {{50432 / 64, 3072}, {-1, 3072}, 0, 0, true},
      {{197, 3072}, {0, 197}, 1, 3, false},   // one group, misaligned
      {{4, 12, 197, 64}, {1, 1}, 0, 0, true}, // heads: runs of 12608
      {{4, 12, 197, 64}, {1, 1}, 3, 1, true},
      {{788, 768}, {-1, 64}, 0, 0, true}, // channel blocks: runs of 64
      {{788, 768}, {-1, 4}, 1, 0, false},
      {{3, 5, 7, 11}, {2, 7}, 1, 0, true}, // runs of 77: not multiples of 4
      {{3, 5, 21, 11}, {2, 7}, 0, 0, true},
      {{3, 5, 21, 11}, {-2, 7}, 3, 3, true},
      {{2, 4099, 3}, {1, 1}, 0, 3, true}, // runs of 3
      {{1}, {0, 1}, 0, 0, false},
      {{1}, {0, 1}, 1, 1, true},
      {{5}, {0, 1}, 0, 0, true}, // runs of 1, specials: NaN dy everywhere, NaN / Inf x
      {{5}, {0, 5}, 3, 0, false},
      {{5}, {0, 5}, 0, 1, true},
  };
  std::uint64_t seed = 1;
  for (const auto& c : cases)
    for (const dtype t : {dtype::float32, dtype::bfloat16, dtype::float16})
      for (const auto f :
           {kernels::actquant_activation::gelu, kernels::actquant_activation::gelu_tanh,
            kernels::actquant_activation::silu, kernels::actquant_activation::relu})
        for (const bool value : {true, false}) {
          SCOPED_TRACE(describe_act(c, t, f, value));
          run_act_case(c, t, f, value, seed++);
          if (HasFatalFailure())
            return;
        }
}

} // namespace
