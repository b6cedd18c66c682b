// The activation-quantization CPU twin (lowbit::kernels::actquant_*) against the exact reference
// (reference/actquant.hpp), within bounds derived here (u = 2^-24, the unit roundoff of float32;
// docs/techniques/mesa.md repeats them):
//
// - estimates: the twin computes fl(fl(m alpha) + fl(fl(1 - m) fl(fl(hi - lo) / 255))); each
//   term carries at most (1 + u)^k - 1 relative error for its k roundings (2 on m alpha, 5 on the
//   other term), so |alpha_twin - alpha*| <= 2.01u |m alpha| + 5.01u |(1 - m) a*| + 4 * 2^-149
//   (the last for results near float's underflow), and for beta (lo is exact) 2.01u |m beta| +
//   3.01u |(1 - m) lo| + 4 * 2^-149. Without an earlier estimate, alpha within 2.01u |a*| and
//   beta == lo exactly.
// - codes: the twin rounds t_f = fl(fl(fl(x - beta) s) r) with r = fl(1 / (alpha s)) and s a
//   power of two (actquant_ops::step; the product by s is exact, or overflows where the code
//   saturates anyway): three roundings, |t_f - t| <= (3u + 3u^2 + u^3) |t| + 2^-149 with
//   t = (x - beta) / alpha exact; its code must be the reference's code of one end of that
//   band (rounding is monotone in t for fixed random bits), and equal to it when both ends agree.
// - dequantize(quantize(x)): for x inside the covered range [beta, beta + 255 alpha], |v - x| <=
//   alpha (h + 255 (3u + 3u^2 + u^3)) + u (255 alpha) + u (255 alpha (1 + u) + |beta|) + 2^-148
//   with h = 1/2 for the nearest roundings and h = 1 for the directed and stochastic ones (the
//   code's error, the two roundings of code * alpha + beta); outside it, plus the distance to it
//   (saturation). A 16-bit output adds half an ulp of the value: 2^-8 |v| for bfloat16, 2^-11
//   |v| for float16 (normal range).
// - CPU twin with 1 thread == with many (the per-chunk reductions merge exactly).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/kernels/actquant.hpp>
#include <lowbit/reference/actquant.hpp>

#include "../../kernels/actquant/actquant_ops.hpp"
#include "support.hpp"

namespace {

using namespace lowbit;
using lowbit::proptest::test::check_property;
using lowbit::proptest::test::describe;
namespace ref = lowbit::reference;
using rational = ref::rational;
using kernels::dtype;
using kernels::tensor_view;

rational exact_of(float x) {
  return ref::exact(static_cast<double>(x));
}
rational rabs(const rational& r) {
  return r < 0 ? rational(-r) : r;
}
const rational u = rational(1, 1 << 24);
const rational tiny = rational(1) / (rational(ref::integer(1) << 149));
// The relative error of a code's position t_f (three roundings).
const rational position_error = 3 * u + 3 * u * u + u * u * u;

struct shape_case {
  std::vector<std::int64_t> shape;
  kernels::actquant_groups g;
  std::int64_t groups = 1;
};

tensor_view view_of(void* p, dtype t, const std::vector<std::int64_t>& shape) {
  tensor_view v;
  v.data = p;
  v.type = t;
  v.ndim = static_cast<int>(shape.size());
  std::int64_t s = 1;
  for (int k = v.ndim - 1; k >= 0; --k) {
    v.shape[k] = shape[static_cast<std::size_t>(k)];
    v.strides[k] = s;
    s *= v.shape[k];
  }
  return v;
}

std::int64_t numel(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto e : s)
    n *= e;
  return n;
}

shape_case gen_shape() {
  shape_case c;
  const int nd = *rc::gen::inRange(1, 5);
  for (int k = 0; k < nd; ++k)
    c.shape.push_back(*rc::gen::inRange<std::int64_t>(1, k == nd - 1 ? 40 : 6));
  const int d = *rc::gen::inRange(0, nd);
  const std::int64_t cdim = c.shape[static_cast<std::size_t>(d)];
  std::vector<std::int64_t> divisors;
  for (std::int64_t s = 1; s <= cdim; ++s)
    if (cdim % s == 0)
      divisors.push_back(s);
  c.g.group_size = *rc::gen::elementOf(divisors);
  c.g.dim = *rc::gen::arbitrary<bool>() ? d : d - nd; // negative dims count from the end
  c.groups = cdim / c.g.group_size;
  return c;
}

// The group of flat index i, from the definition: the index along dim, divided by group_size.
std::int64_t group_of(const shape_case& c, std::int64_t i) {
  const int nd = static_cast<int>(c.shape.size());
  const int d = c.g.dim < 0 ? c.g.dim + nd : c.g.dim;
  std::int64_t rest = i, idx = 0;
  for (int k = nd - 1; k >= 0; --k) {
    const std::int64_t e = c.shape[static_cast<std::size_t>(k)];
    if (k == d)
      idx = rest % e;
    rest /= e;
  }
  return idx / c.g.group_size;
}

// Values around 2^e0 for e0 in [e_lo, e_hi) (below -126: subnormal ones).
std::vector<float> gen_values(std::size_t n, bool specials, int e_lo = -40, int e_hi = 40) {
  std::vector<float> v(n);
  const int e0 = *rc::gen::inRange(e_lo, e_hi);
  const float shift = std::ldexp(static_cast<float>(*rc::gen::inRange(-100, 100)), e0 - 4);
  for (auto& x : v) {
    const int k = *rc::gen::inRange(0, 100);
    if (specials && k < 2)
      x = std::numeric_limits<float>::quiet_NaN();
    else if (specials && k < 4)
      x = (k == 2 ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity();
    else if (k < 8)
      x = 0.0f;
    else
      x = shift + std::ldexp(static_cast<float>(*rc::gen::inRange(-(1 << 24), 1 << 24)),
                             e0 - 24 + *rc::gen::inRange(-6, 2));
  }
  return v;
}

// Exact per-group min and max over the finite elements.
struct group_stats {
  bool any = false;
  rational lo, hi;
};
std::vector<group_stats> stats_of(const shape_case& c, const std::vector<float>& x) {
  std::vector<group_stats> s(static_cast<std::size_t>(c.groups));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]))
      continue;
    auto& g = s[static_cast<std::size_t>(group_of(c, static_cast<std::int64_t>(i)))];
    const rational v = exact_of(x[i]);
    if (!g.any || v < g.lo)
      g.lo = v;
    if (!g.any || v > g.hi)
      g.hi = v;
    g.any = true;
  }
  return s;
}

float gen_momentum() {
  const int k = *rc::gen::inRange(0, 6);
  if (k == 0)
    return 0.0f;
  if (k == 1)
    return 1.0f;
  if (k == 2)
    return 0.9f;
  if (k == 3)
    return 0.99f;
  return static_cast<float>(*rc::gen::inRange(0, 1 << 20)) / static_cast<float>(1 << 20);
}

TEST(actquant, estimate_update_within_derived_bound) {
  check_property("actquant_update_vs_reference", 300, [] {
    const shape_case c = gen_shape();
    const auto x =
        gen_values(static_cast<std::size_t>(numel(c.shape)), *rc::gen::inRange(0, 4) == 0);
    const float m = gen_momentum();
    std::vector<float> alpha(static_cast<std::size_t>(c.groups)), beta(alpha.size());
    for (std::size_t g = 0; g < alpha.size(); ++g) {
      const int k = *rc::gen::inRange(0, 4);
      alpha[g] = k == 0   ? -1.0f
                 : k == 1 ? std::numeric_limits<float>::quiet_NaN()
                          : std::ldexp(static_cast<float>(*rc::gen::inRange(1, 1 << 20)),
                                       *rc::gen::inRange(-40, 0));
      beta[g] = std::ldexp(static_cast<float>(*rc::gen::inRange(-(1 << 20), 1 << 20)),
                           *rc::gen::inRange(-40, 0));
    }
    const auto a0 = alpha, b0 = beta;
    kernels::actquant_update(view_of(const_cast<float*>(x.data()), dtype::float32, c.shape),
                             view_of(alpha.data(), dtype::float32, {c.groups}),
                             view_of(beta.data(), dtype::float32, {c.groups}), c.g, m);
    const auto st = stats_of(c, x);
    const rational rm = exact_of(m);
    for (std::size_t g = 0; g < alpha.size(); ++g) {
      if (!st[g].any) { // no finite element: the estimate is kept bit for bit
        RC_ASSERT(std::memcmp(&alpha[g], &a0[g], 4) == 0);
        RC_ASSERT(std::memcmp(&beta[g], &b0[g], 4) == 0);
        continue;
      }
      const bool known = a0[g] >= 0.0f;
      const ref::actquant_estimate old =
          known ? ref::actquant_estimate{exact_of(a0[g]), exact_of(b0[g])}
                : ref::actquant_estimate{0, 0};
      const auto want = ref::actquant_update(old, known, st[g].lo, st[g].hi, rm);
      RC_ASSERT(std::isfinite(alpha[g]) && std::isfinite(beta[g]));
      const rational astar = (st[g].hi - st[g].lo) / 255;
      const rational ea = rabs(exact_of(alpha[g]) - want.alpha);
      const rational eb = rabs(exact_of(beta[g]) - want.beta);
      if (!known) {
        RC_ASSERT(ea <= rational(201, 100) * u * astar + 4 * tiny);
        RC_ASSERT(eb == 0);
      } else {
        RC_ASSERT(ea <= rational(201, 100) * u * rabs(rm * old.alpha) +
                            rational(501, 100) * u * rabs((1 - rm) * astar) + 4 * tiny);
        RC_ASSERT(eb <= rational(201, 100) * u * rabs(rm * old.beta) +
                            rational(301, 100) * u * rabs((1 - rm) * st[g].lo) + 4 * tiny);
      }
    }
  });
}

std::vector<emu::policy> policies() {
  auto p = lowbit::proptest::test::rounding_overflow_policies();
  for (int k : {1, 8, 16, 32})
    p.push_back(emu::stochastic(k, emu::overflow::saturate));
  return p;
}

TEST(actquant, codes_within_derived_bound_of_reference) {
  check_property("actquant_codes_vs_reference", 300, [] {
    const shape_case c = gen_shape();
    // One case in four at subnormal scales, where a group's reciprocal takes the scale s = 2^64.
    const bool subnormal = *rc::gen::inRange(0, 4) == 0;
    const auto x =
        gen_values(static_cast<std::size_t>(numel(c.shape)), *rc::gen::inRange(0, 4) == 0,
                   subnormal ? -150 : -40, subnormal ? -118 : 40);
    const auto pols = policies();
    const emu::policy pol = *rc::gen::elementOf(pols);
    const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(),
                                 *rc::gen::arbitrary<std::uint64_t>()};
    const bool update = *rc::gen::arbitrary<bool>();
    std::vector<float> alpha(static_cast<std::size_t>(c.groups)), beta(alpha.size());
    const int e0 = subnormal ? *rc::gen::inRange(-150, -120) : *rc::gen::inRange(-40, 30);
    for (std::size_t g = 0; g < alpha.size(); ++g) {
      alpha[g] =
          update ? -1.0f : std::ldexp(static_cast<float>(*rc::gen::inRange(1, 1 << 20)), e0 - 20);
      beta[g] = std::ldexp(static_cast<float>(*rc::gen::inRange(-(1 << 20), 1 << 20)), e0 - 12);
    }
    std::vector<std::uint8_t> codes(x.size());
    kernels::actquant_quantize(view_of(const_cast<float*>(x.data()), dtype::float32, c.shape),
                               view_of(codes.data(), dtype::uint8, c.shape),
                               view_of(alpha.data(), dtype::float32, {c.groups}),
                               view_of(beta.data(), dtype::float32, {c.groups}), c.g, pol, rng,
                               update, 0.5f);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const auto g = static_cast<std::size_t>(group_of(c, static_cast<std::int64_t>(i)));
      const std::uint32_t rb = rng.bits(i);
      if (std::isnan(x[i])) {
        RC_ASSERT(codes[i] == 0u);
        continue;
      }
      if (!(alpha[g] > 0.0f)) // a constant group (alpha 0) or one without finite elements
        continue;
      if (std::isinf(x[i])) {
        RC_ASSERT(codes[i] == (x[i] > 0 ? 255u : 0u));
        continue;
      }
      const ref::actquant_estimate e{exact_of(alpha[g]), exact_of(beta[g])};
      const rational t = (exact_of(x[i]) - e.beta) / e.alpha;
      const rational eps = position_error * rabs(t) + tiny;
      const std::uint32_t lo = ref::round_int(emu::uint8, t - eps, pol, rb);
      const std::uint32_t hi = ref::round_int(emu::uint8, t + eps, pol, rb);
      const std::uint32_t mid = ref::round_int(emu::uint8, t, pol, rb);
      if (lo == hi)
        RC_ASSERT(codes[i] == mid);
      else
        RC_ASSERT(codes[i] == lo || codes[i] == hi);
    }
    (void)describe;
  });
}

bool nearest(const emu::policy& p) {
  return p.round == emu::rounding::nearest_even || p.round == emu::rounding::nearest_away;
}

template <class Store>
void check_round_trip(dtype out_t, std::size_t out_size, Store read, const rational& rel) {
  const shape_case c = gen_shape();
  const auto x = gen_values(static_cast<std::size_t>(numel(c.shape)), false);
  const auto pols = policies();
  const emu::policy pol = *rc::gen::elementOf(pols);
  const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(), 7};
  std::vector<float> alpha(static_cast<std::size_t>(c.groups), -1.0f), beta(alpha.size());
  std::vector<std::uint8_t> codes(x.size());
  const float m = gen_momentum();
  // A first batch initialises the estimates, a shifted second batch moves them by momentum m,
  // so that elements of the second fall outside the covered range when m > 0.
  kernels::actquant_update(view_of(const_cast<float*>(x.data()), dtype::float32, c.shape),
                           view_of(alpha.data(), dtype::float32, {c.groups}),
                           view_of(beta.data(), dtype::float32, {c.groups}), c.g, 0.0f);
  std::vector<float> x2 = x;
  for (auto& v : x2)
    v = v * 1.5f + 0.25f * std::fabs(v);
  kernels::actquant_quantize(
      view_of(x2.data(), dtype::float32, c.shape), view_of(codes.data(), dtype::uint8, c.shape),
      view_of(alpha.data(), dtype::float32, {c.groups}),
      view_of(beta.data(), dtype::float32, {c.groups}), c.g, pol, rng, true, m);
  std::vector<unsigned char> out(x.size() * out_size);
  kernels::actquant_dequantize(view_of(codes.data(), dtype::uint8, c.shape),
                               view_of(alpha.data(), dtype::float32, {c.groups}),
                               view_of(beta.data(), dtype::float32, {c.groups}),
                               view_of(out.data(), out_t, c.shape), c.g);
  const rational h = nearest(pol) ? rational(1, 2) : rational(1);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto g = static_cast<std::size_t>(group_of(c, static_cast<std::int64_t>(i)));
    const rational a = exact_of(alpha[g]), b = exact_of(beta[g]);
    const rational xv = exact_of(x2[i]), top = b + 255 * a;
    const rational dist = xv < b ? rational(b - xv) : (xv > top ? rational(xv - top) : rational(0));
    const rational v = read(out.data(), i);
    const rational bound = a * (h + 255 * position_error) + u * 255 * a +
                           u * (255 * a * (1 + u) + rabs(b)) + 2 * tiny + dist +
                           rel * (rabs(b) + 255 * a);
    RC_ASSERT(rabs(v - xv) <= bound);
  }
}

TEST(actquant, dequantize_of_quantize_within_derived_bound) {
  check_property("actquant_round_trip_f32", 200, [] {
    check_round_trip(
        dtype::float32, 4,
        [](const unsigned char* p, std::size_t i) {
          float f;
          std::memcpy(&f, p + 4 * i, 4);
          return exact_of(f);
        },
        rational(0));
  });
  check_property("actquant_round_trip_bf16", 100, [] {
    check_round_trip(
        dtype::bfloat16, 2,
        [](const unsigned char* p, std::size_t i) {
          std::uint16_t b;
          std::memcpy(&b, p + 2 * i, 2);
          return ref::exact(emu::decode<double>(emu::bfloat16, b));
        },
        rational(1, 256));
  });
}

TEST(actquant, sixteen_bit_inputs_quantize_as_their_float_values) {
  check_property("actquant_16bit_inputs", 100, [] {
    const shape_case c = gen_shape();
    const auto x = gen_values(static_cast<std::size_t>(numel(c.shape)), true);
    const bool bf = *rc::gen::arbitrary<bool>();
    const emu::format f = bf ? emu::bfloat16 : emu::float16;
    std::vector<std::uint16_t> h(x.size());
    std::vector<float> hx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      h[i] = static_cast<std::uint16_t>(emu::encode(f, x[i] * 1e-6f, emu::rne));
      hx[i] = emu::decode<float>(f, h[i]);
    }
    const emu::policy pol = emu::stochastic(16, emu::overflow::saturate);
    const emu::random_stream rng{3, 4};
    std::vector<float> a1(static_cast<std::size_t>(c.groups), -1.0f), b1(a1.size(), 0.0f);
    auto a2 = a1, b2 = b1;
    std::vector<std::uint8_t> c1(x.size()), c2(x.size());
    kernels::actquant_quantize(
        view_of(h.data(), bf ? dtype::bfloat16 : dtype::float16, c.shape),
        view_of(c1.data(), dtype::uint8, c.shape), view_of(a1.data(), dtype::float32, {c.groups}),
        view_of(b1.data(), dtype::float32, {c.groups}), c.g, pol, rng, true, 0.9f);
    kernels::actquant_quantize(
        view_of(hx.data(), dtype::float32, c.shape), view_of(c2.data(), dtype::uint8, c.shape),
        view_of(a2.data(), dtype::float32, {c.groups}),
        view_of(b2.data(), dtype::float32, {c.groups}), c.g, pol, rng, true, 0.9f);
    RC_ASSERT(c1 == c2);
    RC_ASSERT(std::memcmp(a1.data(), a2.data(), 4 * a1.size()) == 0);
    RC_ASSERT(std::memcmp(b1.data(), b2.data(), 4 * b1.size()) == 0);
  });
}

TEST(actquant, lagged_is_frozen_quantization_then_update) {
  check_property("actquant_lagged", 150, [] {
    const shape_case c = gen_shape();
    const auto x =
        gen_values(static_cast<std::size_t>(numel(c.shape)), *rc::gen::inRange(0, 4) == 0);
    const auto pols = policies();
    const emu::policy pol = *rc::gen::elementOf(pols);
    const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(), 3};
    const float m = gen_momentum();
    std::vector<float> a1(static_cast<std::size_t>(c.groups)), b1(a1.size());
    for (std::size_t g = 0; g < a1.size(); ++g) {
      a1[g] =
          std::ldexp(static_cast<float>(*rc::gen::inRange(1, 1 << 20)), *rc::gen::inRange(-30, 0));
      b1[g] = std::ldexp(static_cast<float>(*rc::gen::inRange(-(1 << 20), 1 << 20)), -20);
    }
    auto a2 = a1, b2 = b1;
    std::vector<std::uint8_t> c1(x.size()), c2(x.size());
    const auto xv = view_of(const_cast<float*>(x.data()), dtype::float32, c.shape);
    kernels::actquant_quantize_lagged(xv, view_of(c1.data(), dtype::uint8, c.shape),
                                      view_of(a1.data(), dtype::float32, {c.groups}),
                                      view_of(b1.data(), dtype::float32, {c.groups}), c.g, pol, rng,
                                      m);
    // The same as quantizing with the estimates frozen, then updating them.
    kernels::actquant_quantize(xv, view_of(c2.data(), dtype::uint8, c.shape),
                               view_of(a2.data(), dtype::float32, {c.groups}),
                               view_of(b2.data(), dtype::float32, {c.groups}), c.g, pol, rng,
                               false);
    kernels::actquant_update(xv, view_of(a2.data(), dtype::float32, {c.groups}),
                             view_of(b2.data(), dtype::float32, {c.groups}), c.g, m);
    RC_ASSERT(c1 == c2);
    RC_ASSERT(std::memcmp(a1.data(), a2.data(), 4 * a1.size()) == 0);
    RC_ASSERT(std::memcmp(b1.data(), b2.data(), 4 * b1.size()) == 0);
  });
}

TEST(actquant, threads_do_not_change_bits) {
  // 3 x 5 x 70001 elements grouped along dim 1: runs longer than a thread's chunk and shorter.
  for (const auto& [shape, g] :
       std::vector<std::pair<std::vector<std::int64_t>, kernels::actquant_groups>>{
           {{3, 5, 70001}, {1, 1}}, {{70001, 12}, {-1, 4}}, {{1 << 18}, {0, 1 << 18}}}) {
    const std::int64_t n = numel(shape);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      x[static_cast<std::size_t>(i)] =
          std::sin(0.001f * static_cast<float>(i)) * static_cast<float>(1 + (i % 7));
    const std::int64_t groups = shape[static_cast<std::size_t>(
                                    g.dim < 0 ? g.dim + static_cast<int>(shape.size()) : g.dim)] /
                                g.group_size;
    std::vector<std::uint8_t> c1(x.size()), c2(x.size());
    std::vector<float> a1(static_cast<std::size_t>(groups), -1.0f), b1(a1.size(), 0.0f);
    auto a2 = a1, b2 = b1;
    const emu::policy pol = emu::stochastic(8, emu::overflow::saturate);
    for (int pass = 0; pass < 2; ++pass) { // initialise, then a momentum update
      kernels::actquant_quantize(
          view_of(x.data(), dtype::float32, shape), view_of(c1.data(), dtype::uint8, shape),
          view_of(a1.data(), dtype::float32, {groups}),
          view_of(b1.data(), dtype::float32, {groups}), g, pol, {1, 2}, true, 0.9f, {1, nullptr});
      kernels::actquant_quantize(
          view_of(x.data(), dtype::float32, shape), view_of(c2.data(), dtype::uint8, shape),
          view_of(a2.data(), dtype::float32, {groups}),
          view_of(b2.data(), dtype::float32, {groups}), g, pol, {1, 2}, true, 0.9f, {8, nullptr});
      ASSERT_EQ(c1, c2);
      ASSERT_EQ(0, std::memcmp(a1.data(), a2.data(), 4 * a1.size()));
      ASSERT_EQ(0, std::memcmp(b1.data(), b2.data(), 4 * b1.size()));
      for (auto& v : x)
        v *= 1.25f;
    }
  }
}

TEST(actquant, first_update_initialises_from_the_batch) {
  std::vector<float> x = {3.0f, -2.0f, 0.5f, 7.0f, 1.0f, 1.0f};
  std::vector<float> alpha = {-1.0f, std::numeric_limits<float>::quiet_NaN(), 0.5f};
  std::vector<float> beta = {9.0f, 9.0f, 10.0f};
  std::vector<std::uint8_t> codes(6);
  kernels::actquant_quantize(
      view_of(x.data(), dtype::float32, {3, 2}), view_of(codes.data(), dtype::uint8, {3, 2}),
      view_of(alpha.data(), dtype::float32, {3}), view_of(beta.data(), dtype::float32, {3}), {0, 1},
      emu::rne, {}, true, 0.25f);
  EXPECT_EQ(alpha[0], 5.0f / 255.0f);
  EXPECT_EQ(beta[0], -2.0f);
  EXPECT_EQ(alpha[1], 6.5f / 255.0f);
  EXPECT_EQ(beta[1], 0.5f);
  // A known estimate moves by the momentum: the batch's range is 0, its minimum 1.
  EXPECT_EQ(alpha[2], 0.25f * 0.5f);
  EXPECT_EQ(beta[2], 0.25f * 10.0f + 0.75f);
  EXPECT_EQ(codes[0], 255u);
  EXPECT_EQ(codes[1], 0u);
  EXPECT_EQ(codes[2], 0u);
  EXPECT_EQ(codes[3], 255u);
  EXPECT_EQ(codes[4], 0u); // below beta: saturates to 0 (no wrap-around)
}

// The kernels' group index: actquant_ops::u32_divider is floor(n / d) for every 32-bit n and d.
TEST(actquant, divider_is_exact) {
  const auto check = [](std::uint32_t d, std::uint32_t n) {
    RC_ASSERT(kernels::actquant_ops::u32_divider::of(d).div(n) == n / d);
  };
  check_property("actquant_divider", 2000, [&] {
    const int bits = *rc::gen::inRange(1, 33);
    const std::uint64_t top = std::uint64_t{1} << bits;
    const auto d = static_cast<std::uint32_t>(
        std::max<std::uint64_t>(1, *rc::gen::arbitrary<std::uint32_t>() % top));
    const auto n = *rc::gen::arbitrary<std::uint32_t>();
    check(d, n);
    // Around the multiples of d, where a wrong quotient shows first.
    const std::uint32_t k = n / d;
    for (const std::uint64_t m : {std::uint64_t{k} * d, std::uint64_t{k + 1} * d})
      for (const std::int64_t e : {-1, 0, 1})
        if (static_cast<std::int64_t>(m) + e >= 0 && m + e <= 0xFFFFFFFFu)
          check(d, static_cast<std::uint32_t>(m + e));
  });
  for (const std::uint32_t d :
       {1u, 2u, 3u, 7u, 12608u, 0x7FFFFFFFu, 0x80000000u, 0x80000001u, 0xFFFFFFFEu, 0xFFFFFFFFu})
    for (const std::uint32_t n : {0u, 1u, d - 1, d, d + 1, 0x7FFFFFFFu, 0xFFFFFFFEu, 0xFFFFFFFFu})
      EXPECT_EQ(kernels::actquant_ops::u32_divider::of(d).div(n), n / d) << d << " " << n;
}

TEST(actquant, bad_arguments_are_refused) {
  std::vector<float> x(12), a(3, 1.0f), b(3, 0.0f);
  std::vector<std::uint8_t> c(12);
  const auto xv = view_of(x.data(), dtype::float32, {3, 4});
  const auto cv = view_of(c.data(), dtype::uint8, {3, 4});
  const auto av = view_of(a.data(), dtype::float32, {3}),
             bv = view_of(b.data(), dtype::float32, {3});
  EXPECT_THROW(kernels::actquant_quantize(xv, cv, av, bv, {1, 3}, emu::rne), lowbit::error);
  EXPECT_THROW(kernels::actquant_quantize(xv, cv, av, bv, {2, 1}, emu::rne), lowbit::error);
  EXPECT_THROW(kernels::actquant_quantize(xv, cv, av, bv, {1, 1}, emu::rne), lowbit::error);
  EXPECT_THROW(kernels::actquant_quantize(xv, cv, av, bv, {0, 0}, emu::rne), lowbit::error);
  EXPECT_THROW(kernels::actquant_update(xv, av, bv, {0, 1}, 1.5f), lowbit::error);
  EXPECT_THROW(kernels::actquant_update(xv, av, bv, {0, 1}, std::nanf("")), lowbit::error);
  EXPECT_THROW(kernels::actquant_quantize(xv, view_of(c.data(), dtype::int8, {3, 4}), av, bv,
                                          {0, 1}, emu::rne),
               lowbit::error);
  EXPECT_THROW(
      kernels::actquant_dequantize(cv, av, bv, view_of(x.data(), dtype::float32, {4, 3}), {0, 1}),
      lowbit::error);
  EXPECT_NO_THROW(kernels::actquant_quantize(xv, cv, av, bv, {0, 1}, emu::rne));
  EXPECT_EQ(kernels::actquant_group_count(xv, {-1, 2}), 2);
}

} // namespace
