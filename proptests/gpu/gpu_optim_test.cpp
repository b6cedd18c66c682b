// The fused optimizer steps: the CUDA kernel against the CPU twin, bit for bit (parameters,
// states, absmax, skip counts), over random multi-tensor calls: every optimizer, tiny and
// non-multiple-of-block tensors mixed with large ones, 32-bit and 8-bit states in one call,
// float32/bfloat16/float16 parameters, blocks of 256 and 2048, nearest and stochastic rounding,
// zero, extreme and non-finite gradients, several steps in a row; the forms of three states
// (adam and adamw with amsgrad, rmsprop with momentum and centered); for StableAdamW, LAMB and
// LARS the per-tensor pre-pass (RMS, norms, trust ratios) in the same tree on both sides.
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/optim.hpp>

#include "gpu_harness.hpp"

namespace {

using namespace lowbit;
using gpu_test::mirrored;
using gpu_test::same_bytes;
using kernels::dtype;
using kernels::optimizer;

struct gpu_tensor {
  std::int64_t n = 0;
  dtype pt = dtype::float32;
  bool eight = false;
  std::unique_ptr<mirrored> p, g, s[3], a[3];
};

const optimizer all_optimizers[] = {optimizer::adam,    optimizer::adamw, optimizer::stable_adamw,
                                    optimizer::sgd,     optimizer::lion,  optimizer::rmsprop,
                                    optimizer::adagrad, optimizer::lamb,  optimizer::lars};

void put(mirrored& m, dtype t, std::int64_t i, float v) {
  if (t == dtype::float32) {
    std::memcpy(m.host.data() + 4 * i, &v, 4);
    return;
  }
  const auto b = static_cast<std::uint16_t>(
      emu::encode(t == dtype::float16 ? emu::float16 : emu::bfloat16, v, emu::policy{}));
  std::memcpy(m.host.data() + 2 * i, &b, 2);
}

// Gradients: Gaussian with a scale per run of 64 (2^-40 .. 2^20), zeros, and now and then
// extremes and NaN/Inf.
void fill_grad(gpu_tensor& t, std::mt19937_64& r, bool specials) {
  std::normal_distribution<float> nd;
  int e = 0;
  for (std::int64_t i = 0; i < t.n; ++i) {
    if (i % 64 == 0)
      e = static_cast<int>(r() % 60) - 40;
    float v = nd(r) * std::ldexp(1.0f, e);
    const auto k = r() % 1000;
    if (k < 30)
      v = 0.0f;
    if (k == 997)
      v = 3e38f;
    if (specials && k == 998)
      v = std::numeric_limits<float>::quiet_NaN();
    if (specials && k == 999)
      v = -std::numeric_limits<float>::infinity();
    put(*t.g, t.pt, i, v);
  }
  t.g->push();
}

gpu_tensor make(std::mt19937_64& r, std::int64_t n, dtype pt, bool eight, int states,
                std::int64_t block) {
  gpu_tensor t;
  t.n = n;
  t.pt = pt;
  t.eight = eight;
  const std::size_t es = kernels::dtype_size(pt);
  t.p = std::make_unique<mirrored>(es * n);
  t.g = std::make_unique<mirrored>(es * n);
  std::normal_distribution<float> nd;
  for (std::int64_t i = 0; i < n; ++i)
    put(*t.p, pt, i, nd(r) * 0.5f);
  t.p->push();
  const std::int64_t blocks = kernels::blockwise_blocks(n, block);
  for (int k = 0; k < states; ++k) {
    if (eight) {
      t.s[k] = std::make_unique<mirrored>(n);
      t.a[k] = std::make_unique<mirrored>(4 * blocks);
      for (auto& b : t.s[k]->host)
        b = static_cast<unsigned char>(r() % 256);
      for (std::int64_t b = 0; b < blocks; ++b) {
        const float a = r() % 8 == 0 ? 0.0f : std::ldexp(1.0f, static_cast<int>(r() % 40) - 30);
        std::memcpy(t.a[k]->host.data() + 4 * b, &a, 4);
      }
      t.a[k]->push();
    } else {
      t.s[k] = std::make_unique<mirrored>(4 * n);
      for (std::int64_t i = 0; i < n; ++i) {
        float v = nd(r) * 1e-3f;
        if (k == 1 || !kernels::optimizer_state_signed(optimizer::rmsprop, 0))
          v = std::fabs(v);
        std::memcpy(t.s[k]->host.data() + 4 * i, &v, 4);
      }
    }
    t.s[k]->push();
  }
  return t;
}

kernels::optim_tensor views(gpu_tensor& t, bool gpu, int states) {
  kernels::optim_tensor v;
  v.param = t.p->flat(gpu, t.pt, t.n);
  v.grad = t.g->flat(gpu, t.pt, t.n);
  kernels::tensor_view* st[3] = {&v.state1, &v.state2, &v.state3};
  kernels::tensor_view* am[3] = {&v.absmax1, &v.absmax2, &v.absmax3};
  for (int k = 0; k < states; ++k) {
    *st[k] = t.s[k]->flat(gpu, t.eight ? dtype::uint8 : dtype::float32, t.n);
    if (t.eight)
      *am[k] =
          t.a[k]->flat(gpu, dtype::float32, static_cast<std::int64_t>(t.a[k]->host.size() / 4));
  }
  return v;
}

// forced >= 0: that entry of all_optimizers instead of a random one; three: the optimizer's form
// of three states (amsgrad for adam and adamw, momentum and centered for rmsprop).
void one_case(std::uint64_t seed, bool large = false, int forced = -1, bool three = false) {
  std::mt19937_64 r(seed);
  const std::size_t pick = r() % std::size(all_optimizers);
  const optimizer o = all_optimizers[forced >= 0 ? static_cast<std::size_t>(forced) : pick];
  kernels::optim_hparams h;
  h.lr = r() % 2 ? 1e-3 : 0.1;
  h.beta1 = r() % 4 == 0 ? 0.0 : 0.9;
  h.beta2 = r() % 2 ? 0.999 : 0.95;
  h.weight_decay = r() % 2 ? 0.0 : 0.01;
  h.maximize = r() % 10 == 0;
  if (o == optimizer::sgd || o == optimizer::lars) {
    h.momentum = r() % 3 == 0 ? 0.0 : 0.9;
    h.nesterov = h.momentum > 0 && r() % 2;
  }
  if (o == optimizer::rmsprop) { // plain, with momentum, centered, or both
    const auto mode = three ? 3 : r() % 4;
    h.momentum = mode % 2 == 1 ? 0.9 : 0.0;
    h.centered = mode >= 2;
  }
  if (o == optimizer::adam || o == optimizer::adamw)
    h.amsgrad = three || r() % 3 == 0;
  if (o == optimizer::lamb || o == optimizer::lars) {
    h.max_trust_ratio = r() % 2 ? std::numeric_limits<double>::infinity() : 0.5;
    h.trust_coefficient = r() % 2 ? 1e-3 : 0.5;
    h.adapt = r() % 5 != 0;
    h.bias_correction = r() % 2 == 0;
  }
  const int ns = kernels::optimizer_states(o, h);
  kernels::optim_config cfg;
  cfg.block = r() % 3 == 0 ? 2048 : 256;
  if (r() % 3 == 0) {
    cfg.rounding = kernels::codebook_rounding::stochastic;
    cfg.seed = r();
  }
  const bool specials = r() % 3 == 0;
  const std::int64_t sizes[] = {0, 1, 7, 255, 256, 257, 1000, 2047, 2048, 2049, 4096, 70001, 0};
  const int count = 1 + static_cast<int>(r() % 8);
  const std::int64_t big = large ? (std::int64_t{1} << 20) + 3 : 70001;
  std::vector<gpu_tensor> ts;
  const dtype pts[] = {dtype::float32, dtype::bfloat16, dtype::float16};
  for (int j = 0; j < count; ++j) {
    std::int64_t n = sizes[r() % std::size(sizes)];
    n = n == 0 && j % 2 == 1 ? big : n;
    ts.push_back(make(r, n, pts[r() % 3], r() % 3 != 0, ns, cfg.block));
  }
  mirrored skipped(8 * static_cast<std::size_t>(count), 0);
  const std::string what = std::string(kernels::optimizer_name(o)) + (h.adapt ? "" : " no-adapt") +
                           " states=" + std::to_string(ns) + " block=" + std::to_string(cfg.block) +
                           " tensors=" + std::to_string(count) + " seed=" + std::to_string(seed);
  for (int step = 1; step <= 4; ++step) {
    h.step = step;
    for (auto& t : ts)
      fill_grad(t, r, specials);
    std::vector<kernels::optim_tensor> cv, gv;
    for (auto& t : ts) {
      cv.push_back(views(t, false, ns));
      gv.push_back(views(t, true, ns));
    }
    kernels::optimizer_step(o, h, cv.data(), count, skipped.flat(false, dtype::int64, count), cfg);
    kernels::optimizer_step(o, h, gv.data(), count, skipped.flat(true, dtype::int64, count), cfg);
    cfg.offset += static_cast<std::uint64_t>(ns > 2 ? 3 : 2) * static_cast<std::uint64_t>(count);
    RC_ASSERT(same_bytes(skipped.host, skipped.pull(), what + " skipped"));
    for (int j = 0; j < count; ++j) {
      auto& t = ts[static_cast<std::size_t>(j)];
      const std::string at = what + " step " + std::to_string(step) + " tensor " +
                             std::to_string(j) + " n=" + std::to_string(t.n);
      RC_ASSERT(same_bytes(t.p->host, t.p->pull(), at + " param"));
      for (int k = 0; k < ns; ++k) {
        RC_ASSERT(same_bytes(t.s[k]->host, t.s[k]->pull(), at + " state" + std::to_string(k + 1)));
        if (t.eight)
          RC_ASSERT(
              same_bytes(t.a[k]->host, t.a[k]->pull(), at + " absmax" + std::to_string(k + 1)));
      }
    }
  }
}

TEST(gpu_optim, step_equals_cpu_twin_bitwise) {
  LOWBIT_REQUIRE_GPU();
  const auto result = rc::check("gpu_optim.step_equals_cpu_twin_bitwise",
                                [] { one_case(*rc::gen::arbitrary<std::uint64_t>()); });
  EXPECT_TRUE(result);
}

TEST(gpu_optim, every_optimizer_on_a_large_mixed_call) {
  LOWBIT_REQUIRE_GPU();
  // A fixed sweep whose calls may hold tensors above a million elements, two per optimizer.
  for (std::uint64_t seed = 1; seed <= 2 * std::size(all_optimizers); ++seed)
    EXPECT_NO_THROW(one_case(seed * 0x9E3779B97F4A7C15ull, true,
                             static_cast<int>((seed - 1) % std::size(all_optimizers))))
        << "seed " << seed;
}

// The forms of three states alone (each case one of adam, adamw with amsgrad, rmsprop with
// momentum and centered), random calls, then a fixed sweep with tensors above a million elements.
TEST(gpu_optim, three_state_forms_equal_cpu_twin_bitwise) {
  LOWBIT_REQUIRE_GPU();
  const auto index_of = [](optimizer o) {
    return static_cast<int>(std::find(std::begin(all_optimizers), std::end(all_optimizers), o) -
                            std::begin(all_optimizers));
  };
  const int forms[] = {index_of(optimizer::adam), index_of(optimizer::adamw),
                       index_of(optimizer::rmsprop)};
  const auto result = rc::check("gpu_optim.three_state_forms", [&] {
    const auto seed = *rc::gen::arbitrary<std::uint64_t>();
    one_case(seed, false, forms[seed % 3], true);
  });
  EXPECT_TRUE(result);
  for (std::uint64_t seed = 1; seed <= 6; ++seed)
    EXPECT_NO_THROW(one_case(seed * 0x9E3779B97F4A7C15ull, true, forms[(seed - 1) % 3], true))
        << "seed " << seed;
}

TEST(gpu_optim, refuses_host_memory_in_device_views) {
  LOWBIT_REQUIRE_GPU();
  std::mt19937_64 r(5);
  gpu_tensor t = make(r, 300, dtype::float32, true, 2, 256);
  kernels::optim_tensor v = views(t, true, 2);
  v.grad = t.g->flat(false, dtype::float32, t.n);
  v.grad.dev = v.param.dev;
  try {
    kernels::optimizer_step(optimizer::adamw, {}, &v, 1, {});
    FAIL() << "no error";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("tensors[0].grad"), std::string::npos) << e.what();
  }
}

} // namespace
