// Residual master weights (kernels/residual.hpp, docs/techniques/residual.md): the CPU twin's
// split and join against the exact reference (reference/residual.hpp) on edge-biased float32
// inputs for every k in 1..16 and both 16-bit formats; the documented claims (the weight is the
// nearest value, ties away from zero; k = 16 with bfloat16 is exact; the bound for k < 16;
// float16's exact range); split(join(w, r)) = (w, r); exhaustive sweeps over all 2^32 float32
// bit patterns (label exhaustive); and the optimizer steps with a residual: one step on
// (weight, residual) equals the split of the float32-master step on join(weight, residual), bit
// for bit, for every optimizer with 32- and 8-bit states, so bfloat16 + 16-bit residual follows
// the float32 master exactly over many steps; the non-finite rule; the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/optim.hpp>
#include <lowbit/kernels/residual.hpp>
#include <lowbit/reference/residual.hpp>

#include "support.hpp"

namespace {

using namespace lowbit;
namespace test = lowbit::proptest::test;
using kernels::dtype;
using kernels::optimizer;
using kernels::tensor_view;

enum class wk { bf16, f16 };

dtype dtype_of(wk t) {
  return t == wk::bf16 ? dtype::bfloat16 : dtype::float16;
}
reference::residual_weight ref_of(wk t) {
  return t == wk::bf16 ? reference::residual_weight::bf16 : reference::residual_weight::f16;
}
emu::format format_of(wk t) {
  return t == wk::bf16 ? emu::format(emu::bfloat16) : emu::format(emu::float16);
}
int extra_of(wk t) {
  return t == wk::bf16 ? 16 : 13;
}

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
bool same_bits(float a, float b) {
  return bits_of(a) == bits_of(b);
}

tensor_view flat(const void* data, dtype t, std::int64_t n) {
  return tensor_view::contiguous(data, t, {n});
}

// The twin on a vector: weights, residuals (as int32), and the join of them.
struct split_out {
  std::vector<std::uint16_t> w;
  std::vector<std::int32_t> r;
  std::vector<float> y;
};
split_out twin_split_join(wk t, int bits, const std::vector<float>& x, int threads = 1) {
  const auto n = static_cast<std::int64_t>(x.size());
  split_out o;
  o.w.resize(x.size());
  o.r.resize(x.size());
  o.y.resize(x.size());
  std::vector<std::int8_t> r8(bits <= 8 ? x.size() : 0);
  std::vector<std::int16_t> r16(bits > 8 ? x.size() : 0);
  const dtype rt = kernels::residual_dtype(bits);
  void* rp = bits <= 8 ? static_cast<void*>(r8.data()) : static_cast<void*>(r16.data());
  const kernels::exec ex{threads, nullptr};
  kernels::residual_split(flat(x.data(), dtype::float32, n), flat(o.w.data(), dtype_of(t), n),
                          flat(rp, rt, n), bits, ex);
  kernels::residual_join(flat(o.w.data(), dtype_of(t), n), flat(rp, rt, n), bits,
                         flat(o.y.data(), dtype::float32, n), ex);
  for (std::size_t i = 0; i < x.size(); ++i)
    o.r[i] = bits <= 8 ? r8[i] : r16[i];
  return o;
}

// Edge-biased float32 values: exact ties and their neighbours for both 16-bit formats, binade
// edges, the overflow thresholds, subnormals of float32 and of float16, zeros, Inf and NaN.
float edge_float(std::mt19937_64& r) {
  const std::uint32_t sign = (r() & 1) ? 0x80000000u : 0u;
  const int d = static_cast<int>(r() % 5) - 2; // -2..2 float32 steps
  switch (r() % 10) {
  case 0: return float_of(static_cast<std::uint32_t>(r())); // any pattern
  case 1: {                                                 // bfloat16 midpoints
    const std::uint32_t hi = static_cast<std::uint32_t>(r()) & 0x7F7F0000u;
    return float_of(sign | static_cast<std::uint32_t>(static_cast<std::int64_t>(hi | 0x8000u) + d));
  }
  case 2: { // float16 midpoints: a float16 value plus half its ulp, +-d steps
    const std::uint16_t c = static_cast<std::uint16_t>(r() % 0x7C00u);
    const float v = emu::decode<float>(emu::float16, c);
    const float nx = emu::decode<float>(emu::float16, static_cast<std::uint16_t>(c + 1));
    const float mid = v + (nx - v) * 0.5f; // exact: a float32 value
    const auto m = static_cast<std::int64_t>(bits_of(mid)) + d;
    return float_of(sign | static_cast<std::uint32_t>(std::max<std::int64_t>(0, m)));
  }
  case 3: { // binade edges
    const std::uint32_t e = 1u + static_cast<std::uint32_t>(r() % 254u);
    return float_of(sign | static_cast<std::uint32_t>(static_cast<std::int64_t>(e << 23) + d));
  }
  case 4: { // the overflow thresholds: bfloat16 near float32's max, float16 near 65504/65520
    const float base = (r() & 1) ? std::numeric_limits<float>::max() : 65520.0f;
    const auto m =
        static_cast<std::int64_t>(bits_of(base)) - static_cast<std::int64_t>(r() % 70000);
    return float_of(sign | static_cast<std::uint32_t>(m));
  }
  case 5: return float_of(sign | static_cast<std::uint32_t>(r() % 0x00800000u)); // subnormal
  case 6: { // around float16's subnormal range and 2^-17, 2^-14
    const float e = std::ldexp(1.0f, -12 - static_cast<int>(r() % 16));
    return float_of(sign | (bits_of(e) + static_cast<std::uint32_t>(r() % 0x10000u)));
  }
  case 7: return float_of(sign | (static_cast<std::uint32_t>(r() % 3) == 0 ? 0x7F800000u : 0u));
  case 8: return float_of(sign | 0x7F800000u | (1u + static_cast<std::uint32_t>(r() % 0x7FFFFFu)));
  default:
    return static_cast<float>(std::normal_distribution<double>(0.0, 1.0)(r)) *
           std::ldexp(1.0f, static_cast<int>(r() % 40) - 20);
  }
}

std::vector<float> edge_floats(std::mt19937_64& r, std::size_t n) {
  std::vector<float> x(n);
  for (float& v : x)
    v = edge_float(r);
  return x;
}

// ---- split and join against the reference -------------------------------------------------------

TEST(residual_twin, split_and_join_match_the_exact_reference) {
  test::check_property("residual.reference", 300, [] {
    std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
    const wk t = r() % 2 ? wk::bf16 : wk::f16;
    const int bits = 1 + static_cast<int>(r() % 16);
    const std::vector<float> x = edge_floats(r, 64);
    const split_out o = twin_split_join(t, bits, x);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const reference::residual_parts e = reference::residual_split_exact(ref_of(t), bits, x[i]);
      const std::string what = std::string(t == wk::bf16 ? "bf16" : "f16") +
                               " k=" + std::to_string(bits) + " x=" + test::describe_input(x[i]);
      if (o.w[i] != e.w || o.r[i] != e.r)
        RC_FAIL(what + ": twin (" + test::hex_code(o.w[i]) + ", " + std::to_string(o.r[i]) +
                ") reference (" + test::hex_code(e.w) + ", " + std::to_string(e.r) + ")");
      const float j = reference::residual_join_exact(ref_of(t), bits, e.w, e.r);
      if (!same_bits(o.y[i], j) &&
          !(std::isnan(o.y[i]) && std::isnan(j) && std::signbit(o.y[i]) == std::signbit(j)))
        RC_FAIL(what + ": join twin " + test::describe_input(o.y[i]) + " reference " +
                test::describe_input(j));
    }
  });
}

// The claims of the doc, checked on the twin: w is the nearest value of w's format (ties away
// from zero, overflow to Inf: emu::encode under nearest_away), r lies in k signed bits, and the
// reconstruction error in float32 steps (rank difference) obeys the bound.
void check_claims(wk t, int bits, float x, std::uint16_t w, std::int32_t rr, float y,
                  std::string& fail) {
  // built on failure only: the sweeps call this 2^32 times
  const auto what = [&] {
    return std::string(t == wk::bf16 ? "bf16" : "f16") + " k=" + std::to_string(bits) +
           " x=" + test::describe_input(x) + ": ";
  };
  if (std::isnan(x)) {
    if (!std::isnan(y) || std::signbit(y) != std::signbit(x) || rr != 0)
      fail = what() + "NaN not kept as a NaN of its sign";
    return;
  }
  constexpr emu::format bf16 = emu::bfloat16, f16 = emu::float16;
  constexpr emu::policy away{emu::rounding::nearest_away};
  const auto nearest = static_cast<std::uint16_t>(t == wk::bf16 ? emu::encode(bf16, x, away)
                                                                : emu::encode(f16, x, away));
  if (w != nearest) {
    fail =
        what() + "weight " + test::hex_code(w) + ", nearest (ties away) " + test::hex_code(nearest);
    return;
  }
  const std::int32_t hi = (1 << (bits - 1)) - 1, lo = -hi - 1;
  if (rr < lo || rr > hi) {
    fail = what() + "residual " + std::to_string(rr) + " outside k bits";
    return;
  }
  if (std::signbit(y) != std::signbit(x)) {
    fail = what() + "sign lost";
    return;
  }
  const std::int64_t dy = static_cast<std::int64_t>(bits_of(y) & 0x7FFFFFFFu) -
                          static_cast<std::int64_t>(bits_of(x) & 0x7FFFFFFFu);
  const std::int64_t err = dy < 0 ? -dy : dy;
  const int s = std::max(0, extra_of(t) - bits);
  const std::int64_t q = std::int64_t{1} << s;
  const float wv = t == wk::bf16 ? emu::decode<float>(bf16, w) : emu::decode<float>(f16, w);
  const double ax = std::fabs(static_cast<double>(x));
  if (t == wk::bf16 || (ax >= std::ldexp(1.0, -14) && ax < 65520.0)) {
    // The normal range of w (all of float32 for bfloat16): |err| <= q/2, or q - 1 when the
    // residual saturated at its top (d within q/2 of 2^(e-1)); exact for q = 1.
    const std::int64_t bound = q == 1 ? 0 : (rr == hi ? q - 1 : q / 2);
    if (err > bound)
      fail = what() + "reconstruction " + test::describe_input(y) + " is " + std::to_string(err) +
             " float32 steps away; bound " + std::to_string(bound);
    return;
  }
  if (t == wk::f16 && bits == 16 && ax >= std::ldexp(1.0, -17) && ax < 65520.0) {
    if (err != 0)
      fail = what() + "not exact in float16's k = 16 range [2^-17, 65520)";
    return;
  }
  if (ax >= 65520.0) { // float16 overflow: the weight is Inf and so is the join
    if (!std::isinf(wv) || !std::isinf(y))
      fail = what() + "float16 overflow not Inf";
    return;
  }
  // float16 below its normal range: never farther from x than the weight itself.
  if (!(std::fabs(static_cast<double>(y) - x) <= std::fabs(static_cast<double>(wv) - x)))
    fail = what() + "reconstruction " + test::describe_input(y) + " farther than the weight";
}

TEST(residual_twin, weight_is_nearest_ties_away_and_the_reconstruction_obeys_the_bound) {
  test::check_property("residual.claims", 300, [] {
    std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
    const wk t = r() % 2 ? wk::bf16 : wk::f16;
    const int bits = 1 + static_cast<int>(r() % 16);
    const std::vector<float> x = edge_floats(r, 256);
    const split_out o = twin_split_join(t, bits, x);
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::string fail;
      check_claims(t, bits, x[i], o.w[i], o.r[i], o.y[i], fail);
      if (!fail.empty())
        RC_FAIL(fail);
    }
  });
}

TEST(residual_twin, split_of_a_join_gives_the_pair_back_and_threads_change_nothing) {
  test::check_property("residual.idempotent", 200, [] {
    std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
    const wk t = r() % 2 ? wk::bf16 : wk::f16;
    const int bits = 1 + static_cast<int>(r() % 16);
    std::vector<float> x = edge_floats(r, 300);
    for (float& v : x) // NaN pairs are canonical, not round trips of arbitrary NaNs
      if (std::isnan(v))
        v = 1.0f;
    const split_out a = twin_split_join(t, bits, x);
    const split_out b = twin_split_join(t, bits, a.y, 4);
    RC_ASSERT(a.w == b.w);
    RC_ASSERT(a.r == b.r);
    for (std::size_t i = 0; i < x.size(); ++i)
      RC_ASSERT(same_bits(a.y[i], b.y[i]));
  });
}

TEST(residual_api, refuses_bad_arguments_naming_them) {
  std::vector<float> x(4, 1.0f);
  std::vector<std::uint16_t> w(4);
  std::vector<std::int16_t> r16(4);
  std::vector<std::int8_t> r8(4);
  const auto expect_error = [](auto&& fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] {
        kernels::residual_split(flat(x.data(), dtype::float32, 4),
                                flat(w.data(), dtype::bfloat16, 4),
                                flat(r16.data(), dtype::int16, 4), 17);
      },
      "bits");
  expect_error(
      [&] {
        kernels::residual_split(flat(x.data(), dtype::float32, 4),
                                flat(w.data(), dtype::bfloat16, 4),
                                flat(r16.data(), dtype::int16, 4), 8);
      },
      "int8");
  expect_error(
      [&] {
        kernels::residual_split(flat(x.data(), dtype::float32, 4),
                                flat(w.data(), dtype::bfloat16, 3),
                                flat(r16.data(), dtype::int16, 4), 16);
      },
      "elements");
  expect_error(
      [&] {
        kernels::residual_split(flat(x.data(), dtype::float32, 4), flat(w.data(), dtype::uint16, 4),
                                flat(r8.data(), dtype::int8, 4), 8);
      },
      "weight");
  expect_error(
      [&] {
        kernels::residual_join(flat(w.data(), dtype::bfloat16, 4), flat(r8.data(), dtype::int8, 4),
                               8, flat(w.data(), dtype::bfloat16, 4));
      },
      "out");
  // Empty tensors are fine.
  kernels::residual_split(flat(nullptr, dtype::float32, 0), flat(nullptr, dtype::bfloat16, 0),
                          flat(nullptr, dtype::int16, 0), 16);
}

// ---- exhaustive sweeps (label exhaustive)
// --------------------------------------------------------

// Every float32 bit pattern through the twin (chunks of 2^22 on each of the machine's threads);
// check(x, w, r, y) returns an empty string or a description of what is wrong.
template <class Check> void sweep(wk t, int bits, const char* name, Check&& check) {
  const double start = test::now_seconds();
  constexpr std::uint64_t chunk = 1u << 22, chunks = (std::uint64_t{1} << 32) / chunk;
  std::atomic<std::uint64_t> next{0}, bad{0};
  std::mutex mu;
  std::string first;
  const int threads = std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  test::on_threads(threads, [&](int) {
    std::vector<float> x(chunk);
    for (std::uint64_t c; (c = next.fetch_add(1)) < chunks;) {
      for (std::uint64_t i = 0; i < chunk; ++i)
        x[i] = float_of(static_cast<std::uint32_t>(c * chunk + i));
      const split_out o = twin_split_join(t, bits, x);
      for (std::uint64_t i = 0; i < chunk; ++i) {
        std::string f = check(x[i], o.w[i], o.r[i], o.y[i]);
        if (f.empty())
          continue;
        if (bad.fetch_add(1) == 0) {
          const std::lock_guard<std::mutex> lock(mu);
          first = f;
        }
      }
    }
  });
  std::printf("[wall time] %s: %.1f s\n", name, test::now_seconds() - start);
  EXPECT_EQ(bad.load(), 0u) << name << ": the first failure: " << first;
}

TEST(residual_exhaustive, every_float32_splits_into_bfloat16_and_16_bits_and_joins_exactly) {
  sweep(wk::bf16, 16, "bfloat16 + 16 bits", [](float x, std::uint16_t w, std::int32_t r, float y) {
    if (std::isnan(x))
      return std::string(std::isnan(y) && std::signbit(y) == std::signbit(x) ? "" : "NaN lost");
    if (!same_bits(x, y))
      return "x=" + test::describe_input(x) + " joins to " + test::describe_input(y);
    std::string fail;
    check_claims(wk::bf16, 16, x, w, r, y, fail);
    return fail;
  });
}

TEST(residual_exhaustive, every_float32_with_bfloat16_and_8_bits_obeys_the_bound) {
  sweep(wk::bf16, 8, "bfloat16 + 8 bits", [](float x, std::uint16_t w, std::int32_t r, float y) {
    std::string fail;
    check_claims(wk::bf16, 8, x, w, r, y, fail);
    return fail;
  });
}

TEST(residual_exhaustive, every_float32_with_float16_and_16_bits_obeys_the_documented_range) {
  sweep(wk::f16, 16, "float16 + 16 bits", [](float x, std::uint16_t w, std::int32_t r, float y) {
    std::string fail;
    check_claims(wk::f16, 16, x, w, r, y, fail);
    return fail;
  });
}

// ---- the optimizer steps with a residual
// ---------------------------------------------------------

const optimizer all_optimizers[] = {optimizer::adam,   optimizer::adamw, optimizer::stable_adamw,
                                    optimizer::sgd,    optimizer::lion,  optimizer::rmsprop,
                                    optimizer::adagrad};

kernels::optim_hparams random_hparams(optimizer o, std::mt19937_64& r) {
  kernels::optim_hparams h;
  const auto pick = [&](std::initializer_list<double> v) {
    return *(v.begin() + static_cast<std::ptrdiff_t>(r() % v.size()));
  };
  h.lr = pick({1e-3, 3e-4, 1e-5, 0.1});
  h.beta1 = pick({0.9, 0.0, 0.5});
  h.beta2 = pick({0.999, 0.99, 0.5});
  h.eps = pick({1e-8, 1e-6});
  h.weight_decay = pick({0.0, 0.01, 0.1});
  h.maximize = r() % 8 == 0;
  if (o == optimizer::sgd) {
    h.momentum = pick({0.0, 0.9});
    h.nesterov = h.momentum > 0 && r() % 2;
  }
  return h;
}

// One tensor's storage: either a float32 master, or a 16-bit weight plus residual.
struct model {
  std::int64_t n = 0;
  std::vector<float> p, g;           // float32 master and gradient
  std::vector<std::uint16_t> w, g16; // 16-bit weight and gradient
  std::vector<std::int16_t> r16;
  std::vector<std::int8_t> r8;
  std::vector<float> s[2], absmax[2];
  std::vector<std::uint8_t> code[2];
};

void alloc_states(model& m, int ns, bool eight, std::int64_t block) {
  const std::int64_t blocks = (m.n + block - 1) / block;
  for (int k = 0; k < ns; ++k) {
    if (eight) {
      // the code of 0 in both dynamic maps is found by the step itself on the first write; start
      // from codes of a zero absmax, which decode to 0 whatever the code
      m.code[k].assign(static_cast<std::size_t>(m.n), 0);
      m.absmax[k].assign(static_cast<std::size_t>(blocks), 0.0f);
    } else {
      m.s[k].assign(static_cast<std::size_t>(m.n), 0.0f);
    }
  }
}

kernels::optim_tensor views(model& m, int ns, bool eight, bool residual, wk t, int bits,
                            std::int64_t block) {
  kernels::optim_tensor v;
  const std::int64_t n = m.n, blocks = (n + block - 1) / block;
  if (residual) {
    v.param = flat(m.w.data(), dtype_of(t), n);
    v.grad = flat(m.g16.data(), dtype_of(t), n);
    v.residual =
        bits == 16 ? flat(m.r16.data(), dtype::int16, n) : flat(m.r8.data(), dtype::int8, n);
  } else {
    v.param = flat(m.p.data(), dtype::float32, n);
    v.grad = flat(m.g.data(), dtype::float32, n);
  }
  tensor_view* sv[2] = {&v.state1, &v.state2};
  tensor_view* av[2] = {&v.absmax1, &v.absmax2};
  for (int k = 0; k < ns; ++k) {
    if (eight) {
      *sv[k] = flat(m.code[k].data(), dtype::uint8, n);
      *av[k] = flat(m.absmax[k].data(), dtype::float32, blocks);
    } else {
      *sv[k] = flat(m.s[k].data(), dtype::float32, n);
    }
  }
  return v;
}

// The float32 values of the residual form, by the twin's join.
std::vector<float> joined(model& m, wk t, int bits) {
  std::vector<float> y(static_cast<std::size_t>(m.n));
  kernels::residual_join(flat(m.w.data(), dtype_of(t), m.n),
                         bits == 16 ? flat(m.r16.data(), dtype::int16, m.n)
                                    : flat(m.r8.data(), dtype::int8, m.n),
                         bits, flat(y.data(), dtype::float32, m.n));
  return y;
}

void split_into(model& m, wk t, int bits, const std::vector<float>& x) {
  m.w.resize(x.size());
  m.r16.assign(bits == 16 ? x.size() : 0, 0);
  m.r8.assign(bits == 8 ? x.size() : 0, 0);
  kernels::residual_split(flat(x.data(), dtype::float32, m.n), flat(m.w.data(), dtype_of(t), m.n),
                          bits == 16 ? flat(m.r16.data(), dtype::int16, m.n)
                                     : flat(m.r8.data(), dtype::int8, m.n),
                          bits);
}

bool same_states(const model& a, const model& b) {
  const auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() &&
           (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  for (int k = 0; k < 2; ++k)
    if (!same(a.s[k], b.s[k]) || !same(a.absmax[k], b.absmax[k]) || !same(a.code[k], b.code[k]))
      return false;
  return true;
}

// Fresh 16-bit gradients (the same values, widened, for the float32 master).
void new_grads(model& m, wk t, std::mt19937_64& r, double scale) {
  std::normal_distribution<double> nd(0.0, scale);
  m.g.resize(static_cast<std::size_t>(m.n));
  m.g16.resize(static_cast<std::size_t>(m.n));
  for (std::int64_t i = 0; i < m.n; ++i) {
    m.g16[i] = static_cast<std::uint16_t>(
        emu::encode(format_of(t), static_cast<float>(nd(r)), emu::policy{}));
    m.g[i] = emu::decode<float>(format_of(t), m.g16[i]);
  }
}

// Steps of the residual form against the float32-master twin started from join(w, r): after
// every step the residual form must be the split of the master (bit for bit), and the states
// equal. With bfloat16 and k = 16 the join is then the master itself.
void check_steps(optimizer o, wk t, int bits, bool eight, int steps, std::mt19937_64& r) {
  kernels::optim_hparams h = random_hparams(o, r);
  const int ns = kernels::optimizer_states(o, h);
  kernels::optim_config cfg;
  cfg.block = r() % 4 == 0 ? 2048 : 256;
  const std::int64_t sizes[] = {1, 3, 255, 256, 257, 1000, 2049, 3000};
  model a;
  a.n = sizes[r() % std::size(sizes)];
  std::vector<float> x0(static_cast<std::size_t>(a.n));
  std::normal_distribution<double> nd(0.0, 1.0);
  for (float& v : x0)
    v = static_cast<float>(nd(r) * (r() % 4 == 0 ? 1e-3 : 1.0));
  split_into(a, t, bits, x0);
  model b; // the float32 master
  b.n = a.n;
  b.p = joined(a, t, bits);
  alloc_states(a, ns, eight, cfg.block);
  alloc_states(b, ns, eight, cfg.block);
  const std::string what = std::string(kernels::optimizer_name(o)) +
                           (t == wk::bf16 ? " bf16" : " f16") + " k=" + std::to_string(bits) +
                           (eight ? " 8-bit states" : " 32-bit states") +
                           " n=" + std::to_string(a.n);
  for (int step = 1; step <= steps; ++step) {
    h.step = step;
    new_grads(a, t, r, r() % 2 ? 1e-2 : 1.0);
    b.g = a.g;
    std::vector<std::int64_t> sa(1, 0), sb(1, 0);
    const kernels::optim_tensor va = views(a, ns, eight, true, t, bits, cfg.block);
    const kernels::optim_tensor vb = views(b, ns, eight, false, t, bits, cfg.block);
    kernels::optimizer_step(o, h, &va, 1, flat(sa.data(), dtype::int64, 1), cfg);
    kernels::optimizer_step(o, h, &vb, 1, flat(sb.data(), dtype::int64, 1), cfg);
    RC_PRE(sa[0] == 0 && sb[0] == 0);
    model want;
    want.n = a.n;
    split_into(want, t, bits, b.p);
    if (want.w != a.w || want.r16 != a.r16 || want.r8 != a.r8)
      RC_FAIL(what + " step " + std::to_string(step) +
              ": (weight, residual) differ from the split of the float32-master step");
    if (!same_states(a, b))
      RC_FAIL(what + " step " + std::to_string(step) + ": states differ");
    if (t == wk::bf16 && bits == 16) {
      const std::vector<float> y = joined(a, t, bits);
      for (std::int64_t i = 0; i < a.n; ++i)
        if (!same_bits(y[i], b.p[i]))
          RC_FAIL(what + ": join " + test::describe_input(y[i]) + " master " +
                  test::describe_input(b.p[i]));
    }
    b.p = joined(a, t, bits); // for k < 16 the master follows the stored form
  }
}

TEST(residual_optim, a_step_on_weight_and_residual_is_the_split_of_the_float32_master_step) {
  for (optimizer o : all_optimizers)
    test::check_property(std::string("residual.optim.") + kernels::optimizer_name(o), 24, [o] {
      std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
      const wk t = r() % 3 == 0 ? wk::f16 : wk::bf16;
      const int bits = r() % 3 == 0 ? 8 : 16;
      check_steps(o, t, bits, r() % 2 == 0, 3, r);
    });
}

TEST(residual_optim, bfloat16_with_16_bit_residual_follows_the_float32_master_for_100_steps) {
  for (bool eight : {false, true})
    test::check_property(std::string("residual.optim.adamw100.") + (eight ? "8" : "32"), 3,
                         [eight] {
                           std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
                           check_steps(optimizer::adamw, wk::bf16, 16, eight, 100, r);
                         });
}

TEST(residual_optim, non_finite_blocks_leave_weight_and_residual_untouched) {
  const std::int64_t n = 600, block = 256;
  model a;
  a.n = n;
  std::vector<float> x0(n);
  for (std::int64_t i = 0; i < n; ++i)
    x0[i] = 1.0f + static_cast<float>(i) * 0x1p-20f;
  x0[520] = std::numeric_limits<float>::max(); // block 2: its weight overflows after the step
  split_into(a, wk::bf16, 16, x0);
  kernels::optim_hparams h;
  h.lr = 0.1;
  alloc_states(a, 2, false, block);
  new_grads(a, wk::bf16, *std::make_unique<std::mt19937_64>(1), 1.0);
  a.g16[10] = 0x7FC0;  // NaN in block 0
  a.g16[520] = 0xBF80; // -1: adam moves max further up, past bfloat16's overflow threshold
  h.maximize = false;
  const std::vector<std::uint16_t> w0 = a.w;
  const std::vector<std::int16_t> r0 = a.r16;
  std::vector<std::int64_t> skipped(1, 0);
  const kernels::optim_tensor v = views(a, 2, false, true, wk::bf16, 16, block);
  kernels::optimizer_step(optimizer::adam, h, &v, 1, flat(skipped.data(), dtype::int64, 1));
  EXPECT_EQ(skipped[0], 2);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool untouched = i < 256 || i >= 512;
    if (untouched) {
      EXPECT_EQ(a.w[i], w0[i]) << i;
      EXPECT_EQ(a.r16[i], r0[i]) << i;
    }
  }
  EXPECT_NE(a.w[300], w0[300]); // block 1 stepped (lr 0.1 moves the bfloat16 weight)
}

TEST(residual_optim, refuses_bad_residuals_naming_them) {
  std::vector<float> p(8, 1.0f), g(8, 0.0f), s1(8), s2(8);
  std::vector<std::uint16_t> w(8), gw(8);
  std::vector<std::int16_t> r16(8);
  std::vector<std::uint8_t> u8(8);
  kernels::optim_hparams h;
  const auto expect_error = [&](kernels::optim_tensor t, const char* needle) {
    t.state1 = flat(s1.data(), dtype::float32, 8);
    t.state2 = flat(s2.data(), dtype::float32, 8);
    try {
      kernels::optimizer_step(optimizer::adam, h, &t, 1, tensor_view{});
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  kernels::optim_tensor t;
  t.param = flat(p.data(), dtype::float32, 8);
  t.grad = flat(g.data(), dtype::float32, 8);
  t.residual = flat(r16.data(), dtype::int16, 8);
  expect_error(t, "float32 parameter is its own master");
  t.param = flat(w.data(), dtype::bfloat16, 8);
  t.grad = flat(gw.data(), dtype::bfloat16, 8);
  t.residual = flat(u8.data(), dtype::uint8, 8);
  expect_error(t, "residual");
  t.residual = flat(r16.data(), dtype::int16, 7);
  expect_error(t, "residual: 7 elements");
}

} // namespace
