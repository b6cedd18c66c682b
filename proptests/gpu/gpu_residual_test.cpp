// Residual master weights on the GPU: split and join of the CUDA kernel against the CPU twin, bit
// for bit (random float32 patterns and every pattern of a few ranges, both 16-bit formats, every
// k), and the optimizer steps with residuals (kernels/optim): CUDA == CPU twin bitwise over
// multi-tensor calls that mix residual and plain tensors, 8- and 16-bit residuals, bfloat16 and
// float16 weights, 32- and 8-bit states (three of them: amsgrad, RMSprop centered with momentum),
// non-finite gradients, several steps in a row.
#include <rapidcheck.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/optim.hpp>
#include <lowbit/kernels/residual.hpp>

#include "gpu_harness.hpp"

namespace {

using namespace lowbit;
using gpu_test::mirrored;
using gpu_test::same_bytes;
using kernels::dtype;
using kernels::optimizer;

void split_join_case(std::uint64_t seed) {
  std::mt19937_64 r(seed);
  const dtype wt = r() % 2 ? dtype::bfloat16 : dtype::float16;
  const int bits = 1 + static_cast<int>(r() % 16);
  const dtype rt = kernels::residual_dtype(bits);
  const std::int64_t sizes[] = {1, 5, 1000, 65536 + 3, (1 << 20) + 1};
  const std::int64_t n = sizes[r() % std::size(sizes)];
  mirrored x(4 * n), w(2 * n), res(kernels::dtype_size(rt) * n), y(4 * n);
  const std::uint32_t base = static_cast<std::uint32_t>(r());
  for (std::int64_t i = 0; i < n; ++i) {
    // half the cases: consecutive patterns (every tie and neighbour of a range), else random
    const std::uint32_t u =
        seed % 2 ? base + static_cast<std::uint32_t>(i) : static_cast<std::uint32_t>(r());
    std::memcpy(x.host.data() + 4 * i, &u, 4);
  }
  x.push();
  for (bool gpu : {false, true}) {
    kernels::residual_split(x.flat(gpu, dtype::float32, n), w.flat(gpu, wt, n),
                            res.flat(gpu, rt, n), bits);
    kernels::residual_join(w.flat(gpu, wt, n), res.flat(gpu, rt, n), bits,
                           y.flat(gpu, dtype::float32, n));
  }
  const std::string what = std::string(wt == dtype::bfloat16 ? "bf16" : "f16") +
                           " k=" + std::to_string(bits) + " n=" + std::to_string(n);
  RC_ASSERT(same_bytes(w.host, w.pull(), what + " weight"));
  RC_ASSERT(same_bytes(res.host, res.pull(), what + " residual"));
  RC_ASSERT(same_bytes(y.host, y.pull(), what + " join"));
}

TEST(gpu_residual, split_and_join_equal_the_cpu_twin_bitwise) {
  LOWBIT_REQUIRE_GPU();
  const auto result = rc::check("gpu_residual.split_join",
                                [] { split_join_case(*rc::gen::arbitrary<std::uint64_t>()); });
  EXPECT_TRUE(result);
}

struct tensor {
  std::int64_t n = 0;
  dtype pt = dtype::bfloat16, rt = dtype::int16;
  bool residual = true, eight = false;
  std::unique_ptr<mirrored> p, g, res, s[3], a[3];
};

void put16(mirrored& m, dtype t, std::int64_t i, float v) {
  const auto b = static_cast<std::uint16_t>(
      emu::encode(t == dtype::float16 ? emu::float16 : emu::bfloat16, v, emu::policy{}));
  std::memcpy(m.host.data() + 2 * i, &b, 2);
}

tensor make(std::mt19937_64& r, std::int64_t n, int ns, std::int64_t block) {
  tensor t;
  t.n = n;
  t.pt = r() % 3 == 0 ? dtype::float16 : dtype::bfloat16;
  t.residual = r() % 5 != 0;
  t.rt = r() % 3 == 0 ? dtype::int8 : dtype::int16;
  t.eight = r() % 2 == 0;
  t.p = std::make_unique<mirrored>(2 * n);
  t.g = std::make_unique<mirrored>(2 * n);
  t.res = std::make_unique<mirrored>(kernels::dtype_size(t.rt) * n);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x)
    v = nd(r) * 0.5f;
  mirrored xs(4 * n);
  std::memcpy(xs.host.data(), x.data(), 4 * n);
  kernels::residual_split(xs.flat(false, dtype::float32, n), t.p->flat(false, t.pt, n),
                          t.res->flat(false, t.rt, n), t.rt == dtype::int16 ? 16 : 8);
  t.p->push();
  t.res->push();
  const std::int64_t blocks = kernels::blockwise_blocks(n, block);
  for (int k = 0; k < ns; ++k) {
    if (t.eight) {
      t.s[k] = std::make_unique<mirrored>(n, 0);
      t.a[k] = std::make_unique<mirrored>(4 * blocks, 0);
      t.a[k]->push();
    } else {
      t.s[k] = std::make_unique<mirrored>(4 * n, 0);
    }
    t.s[k]->push();
  }
  return t;
}

kernels::optim_tensor views(tensor& t, bool gpu, int ns) {
  kernels::optim_tensor v;
  v.param = t.p->flat(gpu, t.pt, t.n);
  v.grad = t.g->flat(gpu, t.pt, t.n);
  if (t.residual)
    v.residual = t.res->flat(gpu, t.rt, t.n);
  kernels::tensor_view* st[3] = {&v.state1, &v.state2, &v.state3};
  kernels::tensor_view* am[3] = {&v.absmax1, &v.absmax2, &v.absmax3};
  for (int k = 0; k < ns; ++k) {
    *st[k] = t.s[k]->flat(gpu, t.eight ? dtype::uint8 : dtype::float32, t.n);
    if (t.eight)
      *am[k] =
          t.a[k]->flat(gpu, dtype::float32, static_cast<std::int64_t>(t.a[k]->host.size() / 4));
  }
  return v;
}

const optimizer all_optimizers[] = {optimizer::adam,   optimizer::adamw, optimizer::stable_adamw,
                                    optimizer::sgd,    optimizer::lion,  optimizer::rmsprop,
                                    optimizer::adagrad};

void step_case(std::uint64_t seed) {
  std::mt19937_64 r(seed);
  const optimizer o = all_optimizers[r() % std::size(all_optimizers)];
  kernels::optim_hparams h;
  h.lr = r() % 2 ? 1e-3 : 1e-5;
  h.weight_decay = r() % 2 ? 0.0 : 0.01;
  if (o == optimizer::sgd)
    h.momentum = r() % 2 ? 0.9 : 0.0;
  if (o == optimizer::adam || o == optimizer::adamw)
    h.amsgrad = r() % 2 == 0;
  if (o == optimizer::rmsprop) { // plain, with momentum, centered, or both
    const auto mode = r() % 4;
    h.momentum = mode % 2 == 1 ? 0.9 : 0.0;
    h.centered = mode >= 2;
  }
  const int ns = kernels::optimizer_states(o, h);
  kernels::optim_config cfg;
  cfg.block = r() % 3 == 0 ? 2048 : 256;
  const bool specials = r() % 3 == 0;
  const std::int64_t sizes[] = {1, 7, 255, 256, 257, 2049, 70001};
  const int count = 1 + static_cast<int>(r() % 6);
  std::vector<tensor> ts;
  for (int j = 0; j < count; ++j)
    ts.push_back(make(r, sizes[r() % std::size(sizes)], ns, cfg.block));
  mirrored skipped(8 * static_cast<std::size_t>(count), 0);
  skipped.push();
  const std::string what = std::string(kernels::optimizer_name(o)) +
                           " states=" + std::to_string(ns) + " seed=" + std::to_string(seed);
  std::normal_distribution<float> nd;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    for (auto& t : ts) {
      for (std::int64_t i = 0; i < t.n; ++i) {
        float v = nd(r) * 1e-2f;
        if (specials && r() % 500 == 0)
          v = std::numeric_limits<float>::quiet_NaN();
        put16(*t.g, t.pt, i, v);
      }
      t.g->push();
    }
    std::vector<kernels::optim_tensor> cv, gv;
    for (auto& t : ts) {
      cv.push_back(views(t, false, ns));
      gv.push_back(views(t, true, ns));
    }
    kernels::optimizer_step(o, h, cv.data(), count, skipped.flat(false, dtype::int64, count), cfg);
    kernels::optimizer_step(o, h, gv.data(), count, skipped.flat(true, dtype::int64, count), cfg);
    RC_ASSERT(same_bytes(skipped.host, skipped.pull(), what + " skipped"));
    for (int j = 0; j < count; ++j) {
      auto& t = ts[static_cast<std::size_t>(j)];
      const std::string at = what + " step " + std::to_string(step) + " tensor " +
                             std::to_string(j) + " n=" + std::to_string(t.n);
      RC_ASSERT(same_bytes(t.p->host, t.p->pull(), at + " weight"));
      RC_ASSERT(same_bytes(t.res->host, t.res->pull(), at + " residual"));
      for (int k = 0; k < ns; ++k) {
        RC_ASSERT(same_bytes(t.s[k]->host, t.s[k]->pull(), at + " state" + std::to_string(k + 1)));
        if (t.eight)
          RC_ASSERT(
              same_bytes(t.a[k]->host, t.a[k]->pull(), at + " absmax" + std::to_string(k + 1)));
      }
    }
  }
}

TEST(gpu_residual, optimizer_steps_with_residuals_equal_the_cpu_twin_bitwise) {
  LOWBIT_REQUIRE_GPU();
  const auto result = rc::check("gpu_residual.optimizer_steps",
                                [] { step_case(*rc::gen::arbitrary<std::uint64_t>()); });
  EXPECT_TRUE(result);
}

} // namespace
