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
//
// LayerNorm's backward from codes (actquant_layer_norm_backward) against LayerNorm's backward
// evaluated in 166-bit binary floating point (boost::multiprecision::cpp_bin_float_50, local to
// this file: the reference library is rationals only, and the rstd needs a square root) at the
// same inputs: x as actquant_dequantize writes it in gy's dtype D, gy and weight as stored. Its
// own error (2^-166 relative per operation on terms no larger than the bounded ones) is far below
// the bounds. The bound is a running error bound, propagated per row and element in long double
// with the exact side's magnitudes (mu, V, rho, xhat*, g*, A, B, gx* below are exact):
// - every row sum S runs each term through at most k = 4 ceil(C / 128) + 5 roundings (a lane's
//   sequential sum of its <= 4 ceil(C / 128) elements, then 5 butterfly levels), so
//   |S(t~) - sum t| <= sum |t~_c - t_c| + gamma_k sum |t~_c|, gamma_k = k u / (1 - k u) (each
//   term is multiplied by at most k factors 1 + delta, |delta| <= u, whose product is within
//   gamma_k of 1: Higham, Accuracy and Stability of Numerical Algorithms, lemma 3.1 and 4.2).
// - each further operation o: |fl(o~) - o*| <= |o~ - o*| + u (|o*| + |o~ - o*|) (+ 2^-149 where
//   the result may be subnormal: products and quotients); a product p = a b of inexact factors
//   carries |a~ - a*| |b*| + |a*| |b~ - b*| + |a~ - a*| |b~ - b*| before its rounding.
// - mean: dmu = E1 / C + u (|mu| + E1 / C), E1 = gamma_k sum |x|. d_c = x_c - mean:
//   dd_c = dmu + u (|d*_c| + dmu). V: the twin sums squares of x - mean~ (the rounded mean), and
//   sum (x - mean~)^2 = sum (x - mu)^2 + C (mean~ - mu)^2 exactly (sum (x - mu) = 0), so the
//   mean's error enters only as C dmu^2; each square carries (1 + delta)^3 (the subtraction's
//   rounding, squared, and the square's) and the sum gamma_k: |S~ - sum d*^2| <= C dmu^2 +
//   theta (sum d*^2 + C dmu^2) with theta = (1 + u)^3 (1 + gamma_k) - 1; then the division by C.
// - rstd = 1 / sqrt(V~ + eps): |t~ - T| <= dt with T = V + eps; |sqrt(t~) - sqrt(T)| <=
//   dt / sqrt(T), then the rounding; 1 / s~ is off by ds / ((sqrt(T) - ds) sqrt(T)) before its
//   rounding, used where ds < sqrt(T) / 2. Rows where that fails (the bound on the mean's error
//   swamps the variance plus eps: constant rows of large values with a small eps) are
//   ill-conditioned; the test skips their gx (and gw, which sums them) and requires them to be
//   under 5% of the rows (well under 1% are).
// - xhat = d~ rstd~, g = gy w (exact without weight), a = S(g) / C, b = S(g xhat) / C,
//   gx = ((g - a) - xhat b) rstd, each step as above; a 16-bit gx adds the rounding to D:
//   2^-8 |gx| (bfloat16) or 2^-11 |gx| (float16), plus half the smallest subnormal.
// - gw_c = sum_r gy xhat, gb_c = sum_r gy: the float32 chunk sums take each term through at most
//   32 roundings (gamma_32), the float64 sums of at most 64 chunks then of the segments at most
//   64 + segments roundings (gamma with 2^-53), then one rounding to float32.
// The test asserts |twin - exact| <= 2 * bound: the propagation above keeps the second-order
// products it meets, and the factor 2 is a safety margin for the long-double evaluation of the
// bound and the 166-bit exact side, not a fudge on first-order terms. It prints the largest
// |twin - exact| / bound met: about 0.4 for a float32 gx and 0.2 for gw and gb (the bound is
// not vacuous), 1 for a 16-bit gx, whose last rounding dominates. rows = 0: gw = gb = +0.
//
// The activations' backward from codes (actquant_activation_backward), whose per-element math is
// kernels/actquant/activation_ops.hpp's float32 functions:
// - their accuracy against the exact functions (long double references, themselves checked
//   against 166-bit ones on part of the sample), over every 4099th float bit pattern and the
//   functions' thresholds with their neighbours, in ulps of the exact value where it is a normal
//   float. Swept once over every float: exp_f 1.221 ulps (x in [-104, 88.72]; +0 below, +Inf
//   above, as rounding the exact value gives), normal_cdf 1.887 (x >= 0) and 5.608 (x < 0, where
//   Phi(x) >= 2^-126), normal_pdf 3.316, tanh_f 1.343, sigmoid 2.481; the test asserts 2, 3, 8,
//   4, 2, 3 and prints its sample's maxima. As relative errors, |f~ - f| <= r u |f| where f is
//   normal, and <= a 2^-149 below (r, a: the acc_* constants below; sigmoid's a is 2^21: its
//   exp(-x) overflows below x = -88.72, where the exact result is up to 2^-128).
// - the CPU twin's gx and value against dy f'(x) and f(x) evaluated exactly (long double, whose
//   2^-64 is far below these bounds) at the same x, the dequantized value as stored in dy's
//   dtype D (what actquant_dequantize writes), and dy. A first-order running error analysis of
//   the formulas as activation_ops.hpp writes them (every float operation o rounds to o (1 + d),
//   |d| <= u; the constants sqrt(2/pi) and 0.044715 carry one rounding each) gives
//     |gx~ - gx| <= K u |dy| (m1 + m2) + F 2^-149
//   where m1 + m2 is |term1| + |term2| of the formula with each difference inside a term taken
//   as the sum of its operands' magnitudes (1 - s as s + (1 - s) = 1): the condition of the
//   formula as written, since the error of 1 - s or 1 - t^2 is that of s or t, not small with
//   the difference (1 - t^2 where t rounds to +-1, 1 - s where s rounds to 1: as in torch):
//   gelu       dy (Phi + x phi): m1 = Phi, m2 = |x| phi. Phi~ within r_Phi u Phi, phi~ within
//              r_phi u phi, then the product x phi~, the sum and dy's product round once each:
//              K = max(r_Phi + 2, r_phi + 3) = 8.75 (6.9 for x >= 0, where r_Phi is smaller).
//   gelu_tanh  dy (0.5 (1 + t) + 0.5 x (1 - t^2) D) with t = tanh w, w = sqrt(2/pi) (x +
//              0.044715 x^3), D = sqrt(2/pi) (1 + 3 0.044715 x^2): m1 = 0.5 (1 + |t|),
//              m2 = 0.5 |x| D. w~ is within 7u |w| (x^2, x^3, the constant and its product, the
//              sum of two terms of one sign, sqrt(2/pi) and its product) and D~ within 7u D, so
//              t~ = t + r_t u |t| + 7u |w| sech^2 w. With |w| sech^2 w <= 0.4478 and m1 >= 1/2,
//              0.5 (1 + t~) is within (r_t + 1 + 7 0.4478) u m1; 1 - t~^2 within (2 r_t + 1) u t^2
//              + u sech^2 w (1 + 14 |w t|), and with D~, the products by D~ and by 0.5 x, term
//              2 within (max(2 r_t + 1, 10) + 14 0.3199) u m2 (|w t| sech^2 w <= 0.3199, t^2 +
//              sech^2 w = 1); the sum and dy's product: K = max(r_t + 4.14, max(2 r_t + 1, 10)
//              + 4.48) + 2 = 16.5.
//   silu       dy s (1 + x (1 - s)) with s = sigmoid(x): m1 = s, m2 = s |x|. s~ within r_s u s;
//              1 - s~, x (1 - s~), 1 + that, s~ times it and dy's product round once each:
//              (r_s + 3) u m1 + (r_s + 5) u m2, K = r_s + 5 = 7.6.
//   relu       exact: +0 where x <= 0, else dy (checked bit for bit).
//   The values: gelu x Phi~ (K = r_Phi + 1 over |x| Phi); gelu_tanh 0.5 x (1 + t~) (K = r_t + 2
//   + 7 0.4478 = 7.6 over 0.5 |x| (1 + |t|)); silu x / (1 + exp(-x)) (K = r_exp + 2 = 3.75 over
//   |x s|); relu max(x, 0) exactly. F covers results below float's normal range: the functions'
//   floors a times |dy| and |x| where they enter, and 2^-149 per product that may underflow
//   (gelu |dy| (a_Phi + |x| a_phi + 1) + 1; gelu_tanh |dy| (4 + |x|) + 1; silu |dy| (1 + |x|)
//   (a_s + 2) + 1, which holds its gradient's underflow to 0 below x = -88.72 where the exact
//   one is up to 2.6e-37, torch's formula in float32 doing the same).
//   The test asserts |twin - exact| <= 2 (K u m + F 2^-149) + the rounding to a 16-bit D
//   (2^-8 for bfloat16, 2^-11 for float16, of |exact| + that, plus half D's smallest
//   subnormal): the factor 2 is a safety margin for the second-order terms the analysis drops
//   (below K^2 u^2), not a fudge on first-order ones. It prints the largest |twin - exact| / (the
//   bound without the factor 2): up to about 0.7 (gelu), 0.3 (gelu_tanh, whose m2 is loose where
//   t = +-1) and 0.95 (silu) for float32 gx and value, 1 for 16-bit ones, whose last rounding
//   dominates. NaN in dy gives the canonical NaN. x spans |x| up to 2^15 (gelu_tanh's x^2
//   overflows at 1.8e19: NaN from 0 Inf, as in torch's formula).
// - the twin with 1, 3 or all threads gives the same bits, and gx is the same without the value.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/kernels/actquant.hpp>
#include <lowbit/reference/actquant.hpp>

#include "../../kernels/actquant/activation_ops.hpp"
#include "../../kernels/actquant/actquant_ops.hpp"
#include "support.hpp"

namespace {

using namespace lowbit;
using lowbit::proptest::test::check_property;
using lowbit::proptest::test::describe;
using lowbit::proptest::test::describe_input;
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

// ---- LayerNorm's backward from codes (actquant_layer_norm_backward) ---------------------------

using hp = boost::multiprecision::cpp_bin_float_50; // 166 bits
using ld = long double;

const ld ld_u = std::ldexp(1.0L, -24);
const ld ld_ud = std::ldexp(1.0L, -53);
const ld ld_tiny = std::ldexp(1.0L, -149);

ld gamma_of(ld k, ld unit) {
  return k * unit / (1 - k * unit);
}
ld to_ld(const hp& h) {
  return h.convert_to<ld>();
}
ld ld_abs(const hp& h) {
  return std::fabs(to_ld(h));
}

emu::format format_of(dtype t) {
  return t == dtype::bfloat16 ? emu::bfloat16 : emu::float16;
}
// Element i of a float32 / bfloat16 / float16 buffer: its bits, and its value as a float.
std::uint32_t elem_bits(dtype t, const unsigned char* p, std::size_t i) {
  if (t == dtype::float32) {
    std::uint32_t b;
    std::memcpy(&b, p + 4 * i, 4);
    return b;
  }
  std::uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return h;
}
float elem_value(dtype t, const unsigned char* p, std::size_t i) {
  const std::uint32_t b = elem_bits(t, p, i);
  if (t == dtype::float32) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  return emu::decode<float>(format_of(t), b);
}
// Stores v there, rounded to nearest-even.
void store_elem(dtype t, unsigned char* p, std::size_t i, float v) {
  if (t == dtype::float32) {
    std::memcpy(p + 4 * i, &v, 4);
    return;
  }
  const auto h = static_cast<std::uint16_t>(emu::encode(format_of(t), v, emu::rne));
  std::memcpy(p + 2 * i, &h, 2);
}
std::uint32_t float_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The bits of the canonical quiet NaN in a gx of dtype t: ops::canonical's 0x7FC00000, and for
// the 16-bit dtypes what ops::to_bf16 / to_f16 make of it (emu's NaN code of the format).
std::uint32_t canonical_nan_bits(dtype t) {
  namespace ops = kernels::actquant_ops;
  const float q = ops::canonical(std::numeric_limits<float>::quiet_NaN());
  if (t == dtype::float32)
    return float_bits(q);
  return t == dtype::bfloat16 ? ops::to_bf16(q) : ops::to_f16(q);
}

// A call's inputs: codes [rows, cols] (shape: with any leading dimensions), the estimates of
// cols / group_size groups, gy of dtype `type`, the weight (empty: absent) and eps.
struct ln_inputs {
  std::int64_t rows = 0, cols = 1, group_size = 1;
  std::vector<std::int64_t> shape;
  dtype type = dtype::float32;
  std::vector<std::uint8_t> codes;
  std::vector<float> alpha, beta, weight;
  std::vector<unsigned char> gy;
  float eps = 1e-5f;
  std::int64_t groups() const { return cols / group_size; }
};

// How ln_inputs are drawn: x = shift + scale (group offset + spread_r N(0, 1)) with a spread per
// row (some rows constant), quantized with fresh estimates; gy = 2^g_exp f_r N(0, 1) with a
// factor per row and some exact zeros; the weight 2^w_exp N(0, 1).
struct ln_recipe {
  int x_exp = 0, g_exp = 0, w_exp = 0;
  float shift = 0.0f;
  bool weight = true;
};

ln_inputs make_ln(std::int64_t rows, std::int64_t cols, std::int64_t group_size, dtype t, float eps,
                  const ln_recipe& k, std::uint64_t seed, std::vector<std::int64_t> shape = {}) {
  ln_inputs in;
  in.rows = rows;
  in.cols = cols;
  in.group_size = group_size;
  in.type = t;
  in.eps = eps;
  in.shape = shape.empty() ? std::vector<std::int64_t>{rows, cols} : shape;
  const std::int64_t n = rows * cols, G = in.groups();
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 19);
  const float scale = std::ldexp(1.0f, k.x_exp);
  std::vector<float> x0(static_cast<std::size_t>(n));
  const float spreads[5] = {1.0f, 1.0f, 1.0f / 64, 8.0f, 0.0f};
  for (std::int64_t r = 0; r < rows; ++r) {
    const float spread = spreads[pick(gen) % 5];
    for (std::int64_t c = 0; c < cols; ++c)
      x0[static_cast<std::size_t>(r * cols + c)] =
          k.shift + scale * (static_cast<float>(c / group_size % 3) + spread * n01(gen));
  }
  in.codes.assign(static_cast<std::size_t>(n), 0);
  in.alpha.assign(static_cast<std::size_t>(G), -1.0f);
  in.beta.assign(static_cast<std::size_t>(G), 0.0f);
  if (n > 0) {
    kernels::actquant_quantize(view_of(x0.data(), dtype::float32, in.shape),
                               view_of(in.codes.data(), dtype::uint8, in.shape),
                               view_of(in.alpha.data(), dtype::float32, {G}),
                               view_of(in.beta.data(), dtype::float32, {G}), {-1, group_size},
                               emu::rne, {}, true, 0.9f);
  } else {
    std::fill(in.alpha.begin(), in.alpha.end(), 0.01f);
    std::fill(in.beta.begin(), in.beta.end(), -1.0f);
  }
  in.gy.assign(static_cast<std::size_t>(n) * kernels::dtype_size(t), 0);
  const float gscale = std::ldexp(1.0f, k.g_exp);
  const float factors[3] = {1.0f, 1.0f / 32, t == dtype::float16 ? 1.0f : 32.0f};
  for (std::int64_t r = 0; r < rows; ++r) {
    const float f = factors[pick(gen) % 3];
    for (std::int64_t c = 0; c < cols; ++c)
      store_elem(t, in.gy.data(), static_cast<std::size_t>(r * cols + c),
                 pick(gen) == 0 ? 0.0f : gscale * f * n01(gen));
  }
  if (k.weight) {
    in.weight.resize(static_cast<std::size_t>(cols));
    for (auto& w : in.weight)
      w = std::ldexp(n01(gen), k.w_exp);
  }
  return in;
}

struct ln_outputs {
  std::vector<unsigned char> gx;
  std::vector<float> gw, gb;
};

// Runs actquant_layer_norm_backward on the CPU; outputs not wanted are passed absent and keep
// their poison (gx bytes 0xA5, gw and gb NaN).
ln_outputs run_ln(const ln_inputs& in, const kernels::exec& ex = {}, bool want_gx = true,
                  bool want_gw = true, bool want_gb = true) {
  const std::int64_t n = in.rows * in.cols, G = in.groups();
  ln_outputs o;
  o.gx.assign(static_cast<std::size_t>(n) * kernels::dtype_size(in.type), 0xA5);
  o.gw.assign(static_cast<std::size_t>(in.cols), std::numeric_limits<float>::quiet_NaN());
  o.gb = o.gw;
  const tensor_view wv =
      in.weight.empty() ? tensor_view{}
                        : view_of(const_cast<float*>(in.weight.data()), dtype::float32, {in.cols});
  kernels::actquant_layer_norm_backward(
      view_of(const_cast<std::uint8_t*>(in.codes.data()), dtype::uint8, in.shape),
      view_of(const_cast<float*>(in.alpha.data()), dtype::float32, {G}),
      view_of(const_cast<float*>(in.beta.data()), dtype::float32, {G}), in.group_size,
      view_of(const_cast<unsigned char*>(in.gy.data()), in.type, in.shape), wv, in.eps,
      want_gx ? view_of(o.gx.data(), in.type, in.shape) : tensor_view{},
      want_gw ? view_of(o.gw.data(), dtype::float32, {in.cols}) : tensor_view{},
      want_gb ? view_of(o.gb.data(), dtype::float32, {in.cols}) : tensor_view{}, ex);
  return o;
}

// The inputs x as the backward reads them: actquant_dequantize's output in gy's dtype.
std::vector<float> dequantized_inputs(const ln_inputs& in) {
  const std::int64_t n = in.rows * in.cols, G = in.groups();
  std::vector<unsigned char> buf(static_cast<std::size_t>(n) * kernels::dtype_size(in.type));
  kernels::actquant_dequantize(
      view_of(const_cast<std::uint8_t*>(in.codes.data()), dtype::uint8, in.shape),
      view_of(const_cast<float*>(in.alpha.data()), dtype::float32, {G}),
      view_of(const_cast<float*>(in.beta.data()), dtype::float32, {G}),
      view_of(buf.data(), in.type, in.shape), {-1, in.group_size});
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = elem_value(in.type, buf.data(), i);
  return x;
}

// A column's exact parameter gradients and the bounds' sums over the rows (see the header).
struct ln_column {
  hp gw = 0, gb = 0;
  ld gw_err = 0, gw_abs = 0, gb_abs = 0;
};

// The largest |twin - exact| / bound met, per output: gx of float32, gx of 16 bits, gw, gb.
enum ln_output { ln_gx32, ln_gx16, ln_gw, ln_gb };
struct ln_tally {
  std::int64_t checked = 0, skipped = 0;
  ld worst[4] = {0, 0, 0, 0};
};

void check_within(const hp& exact, float twin, ld bound, ld& worst, const char* what,
                  std::int64_t r, std::int64_t c) {
  const ld diff = ld_abs(hp(twin) - exact);
  worst = std::max(worst, diff / bound);
  if (!(diff <= 2 * bound))
    RC_FAIL(std::string(what) + " at row " + std::to_string(r) + ", column " + std::to_string(c) +
            ": twin " + describe_input(twin) + ", exact " + exact.str(20) + ", |difference| " +
            std::to_string(static_cast<double>(diff)) + " > 2 * bound " +
            std::to_string(static_cast<double>(bound)));
}

// One row (x, gy, weight w or null, the twin's gx): asserts gx within its bound and adds the
// row's terms of gw to the columns' exact sums and bounds. false: an ill-conditioned row, not
// checked.
bool check_ln_row(const float* x, const float* gy, const float* w, std::int64_t C, float eps,
                  dtype t, const float* gx_twin, std::vector<ln_column>& cols, std::int64_t r,
                  ln_tally& tally) {
  const auto n = static_cast<std::size_t>(C);
  const hp hn(C);
  const ld nl = static_cast<ld>(C);
  const ld gk = gamma_of(static_cast<ld>(4 * ((C + 127) / 128) + 5), ld_u);
  // mean and variance
  hp sx = 0;
  ld sabs = 0;
  for (std::size_t c = 0; c < n; ++c) {
    sx += hp(x[c]);
    sabs += std::fabs(static_cast<ld>(x[c]));
  }
  const hp mu = sx / hn;
  std::vector<hp> d(n);
  hp sv = 0;
  for (std::size_t c = 0; c < n; ++c) {
    d[c] = hp(x[c]) - mu;
    sv += d[c] * d[c];
  }
  const hp V = sv / hn, T = V + hp(eps), rho = hp(1) / boost::multiprecision::sqrt(T);
  const ld E1 = gk * sabs;
  const ld dmu = E1 / nl + ld_u * (ld_abs(mu) + E1 / nl) + ld_tiny;
  std::vector<ld> dd(n);
  for (std::size_t c = 0; c < n; ++c)
    dd[c] = dmu + ld_u * (ld_abs(d[c]) + dmu);
  // The twin's squares are of x - mean~ (times 1 + delta for the subtraction), and
  // sum (x - mean~)^2 = sum (x - mu)^2 + C (mean~ - mu)^2 exactly: the rounded mean adds
  // C dmu^2, then three roundings per term and the sum's gamma_k act on that total.
  const ld theta = (1 + ld_u) * (1 + ld_u) * (1 + ld_u) * (1 + gk) - 1;
  const ld Vl = to_ld(V), Tl = to_ld(T), rT = std::sqrt(Tl), rho_l = to_ld(rho);
  const ld shifted = to_ld(sv) + nl * dmu * dmu;
  const ld E2 = nl * dmu * dmu + theta * shifted + nl * ld_tiny * (1 + gk);
  const ld dV = E2 / nl + ld_u * (Vl + E2 / nl) + ld_tiny;
  const ld dt = dV + ld_u * (Tl + dV);
  const ld ds = dt / rT + ld_u * (rT + dt / rT);
  if (!(ds < rT / 2))
    return false;
  const ld er = ds / ((rT - ds) * rT);
  const ld drho = er + ld_u * (rho_l + er) + ld_tiny;
  // xhat, g, and the sums a and b
  std::vector<hp> xh(n), g(n);
  std::vector<ld> dxh(n), dg(n);
  hp sg = 0, sgx = 0;
  ld g_err = 0, g_abs = 0, p_err = 0, p_abs = 0;
  for (std::size_t c = 0; c < n; ++c) {
    xh[c] = d[c] * rho;
    const ld a = ld_abs(d[c]), xa = ld_abs(xh[c]);
    const ld e = dd[c] * rho_l + a * drho + dd[c] * drho;
    dxh[c] = e + ld_u * (xa + e) + ld_tiny;
    g[c] = w != nullptr ? hp(gy[c]) * hp(w[c]) : hp(gy[c]);
    const ld ga = ld_abs(g[c]);
    dg[c] = w != nullptr ? ld_u * ga + ld_tiny : 0;
    sg += g[c];
    g_err += dg[c];
    g_abs += ga + dg[c];
    const hp p = g[c] * xh[c];
    sgx += p;
    const ld pa = ld_abs(p);
    ld pe = dg[c] * xa + ga * dxh[c] + dg[c] * dxh[c];
    pe += ld_u * (pa + pe) + ld_tiny;
    p_err += pe;
    p_abs += pa + pe;
  }
  const hp A = sg / hn, B = sgx / hn;
  const ld E3 = g_err + gk * g_abs, E4 = p_err + gk * p_abs;
  const ld dA = E3 / nl + ld_u * (ld_abs(A) + E3 / nl) + ld_tiny;
  const ld dB = E4 / nl + ld_u * (ld_abs(B) + E4 / nl) + ld_tiny;
  const ld Bl = ld_abs(B);
  const ld u_out = t == dtype::bfloat16  ? std::ldexp(1.0L, -8)
                   : t == dtype::float16 ? std::ldexp(1.0L, -11)
                                         : 0;
  const ld tiny_out = t == dtype::bfloat16  ? std::ldexp(1.0L, -134)
                      : t == dtype::float16 ? std::ldexp(1.0L, -25)
                                            : 0;
  const ld out_max = t == dtype::float16 ? 65504.0L : 3.38e38L;
  for (std::size_t c = 0; c < n; ++c) {
    const hp e1 = g[c] - A;
    ld de1 = dg[c] + dA;
    de1 += ld_u * (ld_abs(e1) + de1);
    const hp e2 = xh[c] * B;
    const ld xa = ld_abs(xh[c]);
    ld de2 = dxh[c] * Bl + xa * dB + dxh[c] * dB;
    de2 += ld_u * (ld_abs(e2) + de2) + ld_tiny;
    const hp e3 = e1 - e2;
    ld de3 = de1 + de2;
    de3 += ld_u * (ld_abs(e3) + de3);
    const hp gx = e3 * rho;
    const ld ga = ld_abs(gx);
    ld dgx = de3 * rho_l + ld_abs(e3) * drho + de3 * drho;
    dgx += ld_u * (ga + dgx) + ld_tiny;
    dgx += u_out * (ga + dgx) + tiny_out;
    if (ga + 2 * dgx < out_max) { // (a float16 gx near its overflow is not judged)
      RC_ASSERT(std::isfinite(gx_twin[c]));
      check_within(gx, gx_twin[c], dgx, tally.worst[t == dtype::float32 ? ln_gx32 : ln_gx16], "gx",
                   r, static_cast<std::int64_t>(c));
    }
    ln_column& col = cols[c];
    const hp term = hp(gy[c]) * xh[c];
    col.gw += term;
    ld te = std::fabs(static_cast<ld>(gy[c])) * dxh[c];
    te += ld_u * (ld_abs(term) + te) + ld_tiny;
    col.gw_err += te;
    col.gw_abs += ld_abs(term) + te;
  }
  return true;
}

ln_inputs gen_ln_inputs() {
  const std::vector<std::int64_t> special_rows = {0, 1, 31, 32, 33, 64, 70};
  const std::int64_t rows = *rc::gen::arbitrary<bool>() ? *rc::gen::elementOf(special_rows)
                                                        : *rc::gen::inRange<std::int64_t>(0, 71);
  const std::vector<std::int64_t> listed = {1, 3, 4, 5, 37, 128, 129, 256, 768, 1030};
  const std::int64_t cols = *rc::gen::arbitrary<bool>() ? *rc::gen::elementOf(listed)
                                                        : *rc::gen::inRange<std::int64_t>(1, 1101);
  std::vector<std::int64_t> divisors;
  for (std::int64_t s = 1; s <= cols; ++s)
    if (cols % s == 0)
      divisors.push_back(s);
  const std::int64_t gs = *rc::gen::elementOf(divisors);
  const dtype t =
      *rc::gen::elementOf(std::vector<dtype>{dtype::float32, dtype::bfloat16, dtype::float16});
  const float eps = *rc::gen::elementOf(std::vector<float>{1e-5f, 1e-6f, 0.1f});
  const bool f16 = t == dtype::float16;
  ln_recipe k;
  k.x_exp = *rc::gen::inRange(f16 ? -8 : -12, f16 ? 5 : 12);
  k.shift = std::ldexp(static_cast<float>(*rc::gen::inRange(-8, 9)),
                       k.x_exp + (*rc::gen::arbitrary<bool>() ? 0 : 4));
  k.g_exp = *rc::gen::inRange(-10, f16 ? -3 : 8);
  k.w_exp = *rc::gen::inRange(-2, f16 ? 1 : 3);
  k.weight = *rc::gen::arbitrary<bool>();
  // Leading dimensions: none (one row), one, or two.
  std::vector<std::int64_t> shape = {rows, cols};
  const int form = *rc::gen::inRange(0, 3);
  if (form == 1 && rows == 1)
    shape = {cols};
  else if (form == 2 && rows % 2 == 0)
    shape = {2, rows / 2, cols};
  return make_ln(rows, cols, gs, t, eps, k, *rc::gen::arbitrary<std::uint64_t>(), shape);
}

TEST(actquant, layer_norm_backward_within_derived_bound) {
  ln_tally tally;
  check_property("actquant_layer_norm_backward_vs_exact", 150, [&] {
    const ln_inputs in = gen_ln_inputs();
    const std::vector<float> x = dequantized_inputs(in);
    const ln_outputs o = run_ln(in);
    const std::int64_t R = in.rows, C = in.cols;
    if (R == 0) { // no rows: the parameter gradients are +0
      for (std::int64_t c = 0; c < C; ++c) {
        RC_ASSERT(float_bits(o.gw[static_cast<std::size_t>(c)]) == 0u);
        RC_ASSERT(float_bits(o.gb[static_cast<std::size_t>(c)]) == 0u);
      }
      return;
    }
    std::vector<float> gy(static_cast<std::size_t>(C)), gx(gy.size());
    std::vector<ln_column> cols(gy.size());
    bool all_rows = true;
    for (std::int64_t r = 0; r < R; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        const auto i = static_cast<std::size_t>(r * C + c);
        gy[static_cast<std::size_t>(c)] = elem_value(in.type, in.gy.data(), i);
        gx[static_cast<std::size_t>(c)] = elem_value(in.type, o.gx.data(), i);
        ln_column& col = cols[static_cast<std::size_t>(c)];
        col.gb += hp(gy[static_cast<std::size_t>(c)]);
        col.gb_abs += std::fabs(static_cast<ld>(gy[static_cast<std::size_t>(c)]));
      }
      const bool ok =
          check_ln_row(x.data() + r * C, gy.data(), in.weight.empty() ? nullptr : in.weight.data(),
                       C, in.eps, in.type, gx.data(), cols, r, tally);
      ++(ok ? tally.checked : tally.skipped);
      all_rows = all_rows && ok;
    }
    const std::int64_t K = (R + 31) / 32, S = (K + 63) / 64;
    const ld g32 = gamma_of(32, ld_u), gd = gamma_of(static_cast<ld>(64 + S), ld_ud);
    for (std::int64_t c = 0; c < C; ++c) {
      const ln_column& col = cols[static_cast<std::size_t>(c)];
      ld eb = g32 * col.gb_abs + gd * (1 + g32) * col.gb_abs;
      eb += ld_u * (ld_abs(col.gb) + eb) + ld_tiny;
      check_within(col.gb, o.gb[static_cast<std::size_t>(c)], eb, tally.worst[ln_gb], "gb", -1, c);
      if (!all_rows) // an ill-conditioned row's xhat is not bounded
        continue;
      ld ew = col.gw_err + g32 * col.gw_abs + gd * (1 + g32) * col.gw_abs;
      ew += ld_u * (ld_abs(col.gw) + ew) + ld_tiny;
      check_within(col.gw, o.gw[static_cast<std::size_t>(c)], ew, tally.worst[ln_gw], "gw", -1, c);
    }
  });
  // The bound is checked on nearly every row, and it is not vacuous: some error comes close.
  EXPECT_LE(tally.skipped * 20, tally.checked + tally.skipped)
      << tally.skipped << " ill-conditioned rows of " << tally.checked + tally.skipped;
  std::printf("layer_norm_backward: %lld rows checked, %lld ill-conditioned skipped; largest "
              "|twin - exact| / bound: gx float32 %.3g, gx 16-bit %.3g, gw %.3g, gb %.3g\n",
              static_cast<long long>(tally.checked), static_cast<long long>(tally.skipped),
              static_cast<double>(tally.worst[ln_gx32]), static_cast<double>(tally.worst[ln_gx16]),
              static_cast<double>(tally.worst[ln_gw]), static_cast<double>(tally.worst[ln_gb]));
}

TEST(actquant, layer_norm_backward_threads_and_absent_outputs_do_not_change_bits) {
  ln_recipe k;
  k.x_exp = -2;
  k.shift = 0.5f;
  k.g_exp = -6;
  std::uint64_t seed = 1;
  for (const dtype t : {dtype::float32, dtype::bfloat16, dtype::float16}) {
    for (const auto& [rows, cols, gs] : std::vector<std::array<std::int64_t, 3>>{
             {301, 257, 1}, {70, 768, 64}, {2049, 5, 5}, {33, 1030, 103}}) {
      k.weight = seed % 2 == 0;
      const ln_inputs in = make_ln(rows, cols, gs, t, 1e-5f, k, seed++);
      const ln_outputs one = run_ln(in, {1, nullptr});
      for (const int threads : {0, 3}) {
        const ln_outputs o = run_ln(in, {threads, nullptr});
        ASSERT_EQ(one.gx, o.gx) << "threads " << threads << ", cols " << cols;
        ASSERT_EQ(0, std::memcmp(one.gw.data(), o.gw.data(), 4 * one.gw.size()));
        ASSERT_EQ(0, std::memcmp(one.gb.data(), o.gb.data(), 4 * one.gb.size()));
      }
      // Each output alone: the same bits, and the absent ones untouched.
      const ln_outputs only_gx = run_ln(in, {}, true, false, false);
      const ln_outputs only_gw = run_ln(in, {}, false, true, false);
      const ln_outputs only_gb = run_ln(in, {}, false, false, true);
      const ln_outputs none = run_ln(in, {}, false, false, false);
      ASSERT_EQ(one.gx, only_gx.gx);
      ASSERT_EQ(0, std::memcmp(one.gw.data(), only_gw.gw.data(), 4 * one.gw.size()));
      ASSERT_EQ(0, std::memcmp(one.gb.data(), only_gb.gb.data(), 4 * one.gb.size()));
      ASSERT_EQ(none.gx, only_gw.gx);
      ASSERT_EQ(none.gx, only_gb.gx);
      ASSERT_EQ(0, std::memcmp(none.gw.data(), only_gx.gw.data(), 4 * none.gw.size()));
      ASSERT_EQ(0, std::memcmp(none.gb.data(), only_gw.gb.data(), 4 * none.gb.size()));
      ASSERT_EQ(0, std::memcmp(none.gw.data(), only_gb.gw.data(), 4 * none.gw.size()));
    }
    // No rows: gw = gb = +0 (over NaN poison), with any thread count.
    for (const int threads : {0, 1, 3}) {
      const ln_outputs o = run_ln(make_ln(0, 768, 64, t, 1e-5f, k, seed++), {threads, nullptr});
      for (std::size_t c = 0; c < o.gw.size(); ++c) {
        ASSERT_EQ(float_bits(o.gw[c]), 0u);
        ASSERT_EQ(float_bits(o.gb[c]), 0u);
      }
    }
  }
}

TEST(actquant, layer_norm_backward_nan_rows_are_canonical_nan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::uint64_t seed = 11;
  for (const dtype t : {dtype::float32, dtype::bfloat16, dtype::float16}) {
    const std::uint32_t qnan = canonical_nan_bits(t);
    if (t == dtype::float32)
      EXPECT_EQ(qnan, 0x7FC00000u);
    else // emu's NaN code of bfloat16 and float16 (a positive quiet NaN)
      EXPECT_EQ(qnan, 0x7FFFu);
    ln_recipe k;
    k.x_exp = -1;
    k.g_exp = -5;
    const std::int64_t R = 70, C = 37;
    const ln_inputs in = make_ln(R, C, 1, t, 1e-5f, k, seed++);
    const ln_outputs base = run_ln(in);
    const std::size_t esz = kernels::dtype_size(t);
    const auto row_bytes = [&](const ln_outputs& o, std::int64_t r) {
      return std::vector<unsigned char>(o.gx.begin() + r * C * static_cast<std::int64_t>(esz),
                                        o.gx.begin() +
                                            (r + 1) * C * static_cast<std::int64_t>(esz));
    };
    // NaN in gy: a positive NaN in row 3 column 5, a negative one with a payload in row 40
    // column 0 (rows 3 and 40 lie in different chunks of 32 rows).
    ln_inputs bad = in;
    store_elem(t, bad.gy.data(), 3 * C + 5, nan);
    if (t == dtype::float32) {
      const std::uint32_t b = 0xFFC01234u;
      std::memcpy(bad.gy.data() + 4 * (40 * C), &b, 4);
    } else {
      const std::uint16_t b = t == dtype::bfloat16 ? 0xFFC3u : 0xFE03u;
      std::memcpy(bad.gy.data() + 2 * (40 * C), &b, 2);
    }
    const ln_outputs o = run_ln(bad);
    for (std::int64_t r = 0; r < R; ++r) {
      if (r == 3 || r == 40) {
        for (std::int64_t c = 0; c < C; ++c)
          ASSERT_EQ(elem_bits(t, o.gx.data(), static_cast<std::size_t>(r * C + c)), qnan)
              << "row " << r << ", column " << c;
      } else {
        ASSERT_EQ(row_bytes(base, r), row_bytes(o, r)) << "row " << r;
      }
    }
    for (std::int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (c == 0 || c == 5) {
        EXPECT_EQ(float_bits(o.gw[i]), 0x7FC00000u) << "gw column " << c;
        EXPECT_EQ(float_bits(o.gb[i]), 0x7FC00000u) << "gb column " << c;
      } else {
        EXPECT_EQ(float_bits(o.gw[i]), float_bits(base.gw[i])) << "gw column " << c;
        EXPECT_EQ(float_bits(o.gb[i]), float_bits(base.gb[i])) << "gb column " << c;
      }
    }
    // A NaN estimate (alpha, or beta) makes a column of x NaN in every row: every row's mean,
    // so every gx and gw; gb reads gy only and keeps its bits. The same for an x that overflows
    // to Inf (then Inf - Inf in x - mean): beyond float16's range, or float32's.
    for (const int kind : {0, 1, 2}) {
      ln_inputs est = in;
      if (kind == 0)
        est.alpha[7] = nan;
      else if (kind == 1)
        est.beta[7] = -nan;
      else // code 255: 255000 (float16: Inf), or 2.55e39 (Inf in float32)
        est.alpha[7] = t == dtype::float16 ? 1000.0f : 1e37f;
      if (kind == 2)
        for (std::int64_t r = 0; r < R; ++r)
          est.codes[static_cast<std::size_t>(r * C + 7)] = 255;
      const ln_outputs e = run_ln(est);
      for (std::size_t i = 0; i < static_cast<std::size_t>(R * C); ++i)
        ASSERT_EQ(elem_bits(t, e.gx.data(), i), qnan) << "element " << i;
      for (std::size_t c = 0; c < static_cast<std::size_t>(C); ++c) {
        EXPECT_EQ(float_bits(e.gw[c]), 0x7FC00000u) << "gw column " << c;
        EXPECT_EQ(float_bits(e.gb[c]), float_bits(base.gb[c])) << "gb column " << c;
      }
    }
  }
}

TEST(actquant, layer_norm_backward_bad_arguments_are_refused) {
  std::vector<std::uint8_t> c(12);
  std::vector<float> a(2, 1.0f), b(2, 0.0f), w(4, 1.0f), gw(4), gb(4), f32(12), big(16);
  std::vector<std::uint16_t> h16(12);
  std::vector<double> f64(12);
  std::vector<std::int8_t> i8(12);
  const auto cv = view_of(c.data(), dtype::uint8, {3, 4});
  const auto av = view_of(a.data(), dtype::float32, {2}),
             bv = view_of(b.data(), dtype::float32, {2});
  const auto gyv = view_of(f32.data(), dtype::float32, {3, 4});
  const auto wv = view_of(w.data(), dtype::float32, {4});
  const auto gwv = view_of(gw.data(), dtype::float32, {4}),
             gbv = view_of(gb.data(), dtype::float32, {4});
  std::vector<float> gx(12);
  const auto gxv = view_of(gx.data(), dtype::float32, {3, 4});
  const auto call = [&](const tensor_view& codes, const tensor_view& alpha, const tensor_view& beta,
                        std::int64_t group_size, const tensor_view& gy, const tensor_view& weight,
                        float eps, const tensor_view& gxo, const tensor_view& gwo,
                        const tensor_view& gbo) {
    kernels::actquant_layer_norm_backward(codes, alpha, beta, group_size, gy, weight, eps, gxo, gwo,
                                          gbo);
  };
  EXPECT_NO_THROW(call(cv, av, bv, 2, gyv, wv, 1e-5f, gxv, gwv, gbv));
  EXPECT_NO_THROW(call(cv, av, bv, 2, gyv, tensor_view{}, 0.0f, gxv, gwv, gbv));
  // gy: dtype, shape
  EXPECT_THROW(
      call(cv, av, bv, 2, view_of(c.data(), dtype::uint8, {3, 4}), wv, 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(call(cv, av, bv, 2, view_of(f64.data(), dtype::float64, {3, 4}), wv, 1e-5f,
                    view_of(f64.data(), dtype::float64, {3, 4}), gwv, gbv),
               lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, view_of(f32.data(), dtype::float32, {4, 3}), wv, 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, view_of(f32.data(), dtype::float32, {12}), wv, 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  // gx: dtype other than gy's, shape
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, wv, 1e-5f, view_of(h16.data(), dtype::bfloat16, {3, 4}), gwv, gbv),
      lowbit::error);
  EXPECT_THROW(call(cv, av, bv, 2, view_of(h16.data(), dtype::float16, {3, 4}), wv, 1e-5f,
                    view_of(h16.data(), dtype::bfloat16, {3, 4}), gwv, gbv),
               lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, wv, 1e-5f, view_of(gx.data(), dtype::float32, {4, 3}), gwv, gbv),
      lowbit::error);
  // weight, gw, gb: element count, dtype
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, view_of(w.data(), dtype::float32, {3}), 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, view_of(big.data(), dtype::float32, {16}), 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, view_of(h16.data(), dtype::bfloat16, {4}), 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, wv, 1e-5f, gxv, view_of(gw.data(), dtype::float32, {3}), gbv),
      lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, wv, 1e-5f, gxv, gwv, view_of(big.data(), dtype::float32, {5})),
      lowbit::error);
  EXPECT_THROW(
      call(cv, av, bv, 2, gyv, wv, 1e-5f, gxv, view_of(h16.data(), dtype::float16, {4}), gbv),
      lowbit::error);
  // eps: NaN, negative, infinite
  for (const float eps :
       {std::numeric_limits<float>::quiet_NaN(), -1e-5f, std::numeric_limits<float>::infinity()})
    EXPECT_THROW(call(cv, av, bv, 2, gyv, wv, eps, gxv, gwv, gbv), lowbit::error) << eps;
  // group_size not dividing C, or < 1
  EXPECT_THROW(call(cv, av, bv, 3, gyv, wv, 1e-5f, gxv, gwv, gbv), lowbit::error);
  EXPECT_THROW(call(cv, av, bv, 0, gyv, wv, 1e-5f, gxv, gwv, gbv), lowbit::error);
  // codes not uint8; alpha, beta not one per group (2 here)
  EXPECT_THROW(
      call(view_of(i8.data(), dtype::int8, {3, 4}), av, bv, 2, gyv, wv, 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(
      call(cv, view_of(a.data(), dtype::float32, {1}), bv, 2, gyv, wv, 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(
      call(cv, av, view_of(big.data(), dtype::float32, {4}), 2, gyv, wv, 1e-5f, gxv, gwv, gbv),
      lowbit::error);
  EXPECT_THROW(call(cv, av, bv, 1, gyv, wv, 1e-5f, gxv, gwv, gbv), lowbit::error); // 4 groups
  // codes of no dimension, or with an empty last dimension
  tensor_view scalar = cv;
  scalar.ndim = 0;
  tensor_view gy_scalar = gyv;
  gy_scalar.ndim = 0;
  EXPECT_THROW(call(scalar, view_of(a.data(), dtype::float32, {1}),
                    view_of(b.data(), dtype::float32, {1}), 1, gy_scalar, tensor_view{}, 1e-5f,
                    tensor_view{}, tensor_view{}, tensor_view{}),
               lowbit::error);
  EXPECT_THROW(call(view_of(c.data(), dtype::uint8, {3, 0}), view_of(a.data(), dtype::float32, {0}),
                    view_of(b.data(), dtype::float32, {0}), 1,
                    view_of(f32.data(), dtype::float32, {3, 0}), tensor_view{}, 1e-5f,
                    tensor_view{}, tensor_view{}, tensor_view{}),
               lowbit::error);
}

// ---- The activations' backward from codes (actquant_activation_backward) --------------------

namespace act = kernels::activation_ops;
using kernels::actquant_activation;

constexpr actquant_activation all_activations[] = {
    actquant_activation::gelu, actquant_activation::gelu_tanh, actquant_activation::silu,
    actquant_activation::relu};
const char* activation_name(actquant_activation f) {
  switch (f) {
  case actquant_activation::gelu: return "gelu";
  case actquant_activation::gelu_tanh: return "gelu_tanh";
  case actquant_activation::silu: return "silu";
  default: return "relu";
  }
}

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The exact functions in long double (64-bit significand: the roundings of the arguments, such as
// that of x / sqrt 2 in the tails of erfc, and the C library's own errors cost at most about
// 2^-56 relative where a float result is not 0, 2^-32 of a float ulp); the accuracy test checks
// them against 166-bit ones on a part of its sample (within 2^-50).
const ld ld_rsqrt2 = 0.707106781186547524400844362104849039L;
const ld ld_rsqrt2pi = 0.398942280401432677939946059934381868L; // 1 / sqrt(2 pi)
const ld ld_sqrt2_pi = 0.797884560802865355879892119868763737L; // sqrt(2 / pi)
const ld ld_kappa = 0.044715L;
ld ref_exp(ld x) {
  return std::exp(x);
}
ld ref_cdf(ld x) {
  return x >= 0 ? 1 - std::erfc(x * ld_rsqrt2) / 2 : std::erfc(-x * ld_rsqrt2) / 2;
}
ld ref_pdf(ld x) {
  return std::exp(-(x * x) / 2) * ld_rsqrt2pi; // x * x is exact for a float x
}
ld ref_tanh(ld x) {
  return std::tanh(x);
}
ld ref_sigmoid(ld x) {
  return 1 / (1 + std::exp(-x));
}

// The stated accuracy of activation_ops' functions: |f~(x) - f(x)| <= rel u |f(x)| where f(x) is
// a normal float (>= 2^-126), and <= sub 2^-149 where it is below (subnormal or zero results).
// An exhaustive sweep over every float (long double references), run once when these tests were
// written, found the maxima in the comments (and, in ulps of f(x) where it is normal: exp_f
// 1.221, normal_cdf 1.887 for x >= 0 and 5.608 for x < 0, normal_pdf 3.316, tanh_f 1.343,
// sigmoid 2.481); the constants round them up. The accuracy test asserts them on its sample, and
// the property test's bounds are built on them.
struct fn_accuracy {
  ld rel, sub;
};
constexpr fn_accuracy acc_exp{1.75L, 0.8L};     // rel 1.7242 (x = 59.2652), sub 0.7771
constexpr fn_accuracy acc_cdf_pos{2.1L, 1.0L};  // x >= 0: rel 2.0492 (x = 1.41231); no sub
constexpr fn_accuracy acc_cdf_neg{6.75L, 3.1L}; // x < 0: rel 6.6970 (x = -12.3758), sub 3.0097
constexpr fn_accuracy acc_pdf{3.9L, 1.7L};      // rel 3.8350 (x = 0.962045), sub 1.6742
constexpr fn_accuracy acc_tanh{2.45L, 1.0L};    // rel 2.4106 (x = -0.627869); sub 0 (tanh x = x)
// sigmoid: rel 2.5954 (x = -16.9942); sub 2097151.49 < 2^21: below x = -88.7228, exp(-x)
// overflows and the result is 0 where the exact one is up to e^-88.7228 = 2^-128.
constexpr fn_accuracy acc_sigmoid{2.6L, 2097152.0L};

// The largest errors of one function over a sample: in ulps of the exact value and relative (in
// u) where that is a normal float, absolute (in 2^-149) where it is below; NaN results counted.
struct fn_errors {
  ld ulps = 0, rel = 0, sub = 0;
  float worst = 0; // where the largest error in ulps is
  std::int64_t points = 0, nans = 0;
  void add(float x, float got, ld exact) {
    ++points;
    if (std::isnan(got)) {
      ++nans;
      return;
    }
    const ld d = std::fabs(static_cast<ld>(got) - exact), a = std::fabs(exact);
    if (a >= std::ldexp(1.0L, -126)) {
      const ld ulp = std::ldexp(1.0L, std::ilogb(a) - 23);
      if (d / ulp > ulps) {
        ulps = d / ulp;
        worst = x;
      }
      rel = std::max(rel, d / (ld_u * a));
    } else {
      sub = std::max(sub, d / ld_tiny);
    }
  }
};

// Every 4099th float bit pattern of either sign, and the functions' thresholds with their 8
// neighbours on either side: 0 and the subnormal / normal limits; tanh_f's branches at 0.625 and
// 9; normal_cdf's at z = |x| / sqrt 2 = 1/2, 1, 4 (t = 1 / z = 1/4) and 10; exp_f's limits at
// 88.7228394 and -104, and where its result turns subnormal (-87.3365); sigmoid's overflow of
// exp(-x) at -88.7228394.
std::vector<float> activation_sample() {
  std::vector<float> xs;
  for (std::uint32_t b = 0; b < 0x7F800000u; b += 4099) {
    xs.push_back(from_bits(b));
    xs.push_back(from_bits(b | 0x80000000u));
  }
  const float inv_r2 = 1.41421356f; // 1 / 0.707106781f, the factor normal_cdf applies
  for (const float p : {0.0f, from_bits(1), from_bits(0x007FFFFFu), from_bits(0x00800000u), 0.625f,
                        9.0f, 0.5f * inv_r2, inv_r2, 4.0f * inv_r2, 10.0f * inv_r2, 88.7228394f,
                        104.0f, 87.3365479f, 88.0f, 87.0f, 1.0f, 2.0f}) {
    for (const float s : {p, -p}) {
      float lo = s, hi = s;
      xs.push_back(s);
      for (int k = 0; k < 8; ++k) {
        lo = std::nextafter(lo, -INFINITY);
        hi = std::nextafter(hi, INFINITY);
        xs.push_back(lo);
        xs.push_back(hi);
      }
    }
  }
  return xs;
}

TEST(actquant, activation_functions_within_stated_accuracy) {
  const std::vector<float> xs = activation_sample();
  fn_errors e_exp, e_cdf_pos, e_cdf_neg, e_pdf, e_tanh, e_sigmoid;
  const ld exp_top = std::ldexp(2.0L - std::ldexp(1.0L, -24), 127); // rounds to +Inf from here
  std::int64_t wrong_limits = 0, cross_checked = 0;
  ld ref_gap = 0; // the largest relative difference of the long double references from 166-bit
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const ld X = x;
    if (X < -104) { // exp(x) < 2^-150: +0
      wrong_limits += float_bits(act::exp_f(x)) != 0u;
    } else if (X <= 89) {
      const ld e = ref_exp(X);
      if (e >= exp_top)
        wrong_limits += act::exp_f(x) != INFINITY;
      else
        e_exp.add(x, act::exp_f(x), e);
    } else {
      wrong_limits += act::exp_f(x) != INFINITY;
    }
    (x >= 0.0f ? e_cdf_pos : e_cdf_neg).add(x, act::normal_cdf(x), ref_cdf(X));
    e_pdf.add(x, act::normal_pdf(x), ref_pdf(X));
    e_tanh.add(x, act::tanh_f(x), ref_tanh(X));
    e_sigmoid.add(x, act::sigmoid(x), ref_sigmoid(X));
    // The long double references against 166-bit ones, on every 24th point of moderate size.
    const ld ax = std::fabs(X);
    if (i % 24 == 0 && ax >= 0x1p-20L && ax <= 100) {
      namespace bm = boost::multiprecision;
      const hp hx(x), r2(bm::sqrt(hp(2)));
      const auto gap = [&](ld approx, const hp& exact) { // where a float result is not 0
        if (bm::abs(exact) >= hp(ld_tiny) / 2)
          ref_gap = std::max(ref_gap, ld_abs((hp(approx) - exact) / exact));
      };
      if (X >= -104 && X <= 88)
        gap(ref_exp(X), bm::exp(hx));
      gap(ref_cdf(X), x >= 0.0f ? hp(1 - bm::erfc(hx / r2) / 2) : hp(bm::erfc(-hx / r2) / 2));
      gap(ref_pdf(X), hp(bm::exp(-(hx * hx) / 2) / bm::sqrt(2 * boost::math::constants::pi<hp>())));
      gap(ref_tanh(X), bm::tanh(hx));
      gap(ref_sigmoid(X), hp(1 / (1 + bm::exp(-hx))));
      ++cross_checked;
    }
  }
  EXPECT_LE(ref_gap, std::ldexp(1.0L, -50)) << "long double references off their 166-bit values";
  EXPECT_GT(cross_checked, 1000);
  std::printf("(long double references within %.3g relative of 166-bit ones at %lld points)\n",
              static_cast<double>(ref_gap), static_cast<long long>(cross_checked));
  EXPECT_EQ(wrong_limits, 0) << "exp_f: not +0 below -104 or not +Inf beyond its overflow";
  const struct {
    const char* name;
    const fn_errors& e;
    fn_accuracy acc;
    double ulps; // the asserted bound in ulps (the exhaustive maximum in the comment)
  } fns[] = {{"exp_f", e_exp, acc_exp, 2.0},                     // 1.221
             {"normal_cdf x >= 0", e_cdf_pos, acc_cdf_pos, 3.0}, // 1.887
             {"normal_cdf x < 0", e_cdf_neg, acc_cdf_neg, 8.0},  // 5.608
             {"normal_pdf", e_pdf, acc_pdf, 4.0},                // 3.316
             {"tanh_f", e_tanh, acc_tanh, 2.0},                  // 1.343
             {"sigmoid", e_sigmoid, acc_sigmoid, 3.0}};          // 2.481 (normal results)
  std::printf("activation functions over %zu floats: largest error in ulps (relative in u; "
              "subnormal results in 2^-149)\n",
              xs.size());
  for (const auto& f : fns) {
    EXPECT_EQ(f.e.nans, 0) << f.name << ": NaN for a finite x";
    EXPECT_LE(f.e.ulps, f.ulps) << f.name << " at x = " << describe_input(f.e.worst);
    EXPECT_LE(f.e.rel, f.acc.rel) << f.name;
    EXPECT_LE(f.e.sub, f.acc.sub) << f.name;
    std::printf("  %-18s %.3f ulps at x = %.9g (%.3f u; %.4g)\n", f.name,
                static_cast<double>(f.e.ulps), static_cast<double>(f.e.worst),
                static_cast<double>(f.e.rel), static_cast<double>(f.e.sub));
    std::string key = f.name;
    std::replace(key.begin(), key.end(), ' ', '_');
    RecordProperty(key + "_ulps", std::to_string(static_cast<double>(f.e.ulps)));
  }
  // Special values: NaN in, NaN out; the limits at +-Inf; the values at +-0.
  const float inf = std::numeric_limits<float>::infinity();
  for (const float q : {std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(), from_bits(0x7F800001u)}) {
    EXPECT_TRUE(std::isnan(act::exp_f(q)));
    EXPECT_TRUE(std::isnan(act::exp_neg_half_square(q)));
    EXPECT_TRUE(std::isnan(act::normal_cdf(q)));
    EXPECT_TRUE(std::isnan(act::normal_pdf(q)));
    EXPECT_TRUE(std::isnan(act::tanh_f(q)));
    EXPECT_TRUE(std::isnan(act::sigmoid(q)));
  }
  EXPECT_EQ(act::exp_f(inf), inf);
  EXPECT_EQ(float_bits(act::exp_f(-inf)), 0u);
  EXPECT_EQ(act::normal_cdf(inf), 1.0f);
  EXPECT_EQ(float_bits(act::normal_cdf(-inf)), 0u);
  EXPECT_EQ(act::tanh_f(inf), 1.0f);
  EXPECT_EQ(act::tanh_f(-inf), -1.0f);
  EXPECT_EQ(act::sigmoid(inf), 1.0f);
  EXPECT_EQ(float_bits(act::sigmoid(-inf)), 0u);
  for (const float z : {0.0f, -0.0f}) {
    EXPECT_EQ(act::exp_f(z), 1.0f);
    EXPECT_EQ(act::normal_cdf(z), 0.5f);
    EXPECT_EQ(act::sigmoid(z), 0.5f);
    EXPECT_EQ(act::normal_pdf(z), 0.398942280f);
    EXPECT_EQ(float_bits(act::tanh_f(z)), float_bits(z));
  }
}

// The exact gradient dy f'(x) and value f(x) at a float x and dy, with the parts of their bounds
// (see the header): the magnitude |dy| (m1 + m2) or m, the first-order constant K and the floor
// F (in 2^-149). ReLU is checked exactly instead.
struct act_exact {
  ld g = 0, g_mag = 0, g_k = 0, g_floor = 0;
  ld v = 0, v_mag = 0, v_k = 0, v_floor = 0;
};

// |w| sech^2 w <= 0.44775 and |w| |tanh w| sech^2 w <= 0.31990 for every w.
constexpr ld max_w_sech2 = 0.4478L, max_wt_sech2 = 0.3199L;
ld k_gelu_gradient(const fn_accuracy& cdf) {
  return std::max(cdf.rel + 2, acc_pdf.rel + 3);
}
ld k_gelu_tanh_gradient() {
  const ld rt = acc_tanh.rel;
  return std::max(rt + 1 + 7 * max_w_sech2, std::max(2 * rt + 1, 10.0L) + 14 * max_wt_sech2) + 2;
}
ld k_silu_gradient() {
  return acc_sigmoid.rel + 5;
}

act_exact exact_activation(actquant_activation f, float xf, float dyf) {
  const ld x = xf, dy = dyf, ax = std::fabs(x), ady = std::fabs(dy);
  act_exact r;
  switch (f) {
  case actquant_activation::gelu: {
    const ld P = ref_cdf(x), Q = ref_pdf(x);
    const fn_accuracy& cdf = x >= 0 ? acc_cdf_pos : acc_cdf_neg;
    r.g = dy * (P + x * Q);
    r.g_mag = ady * (P + ax * Q);
    r.g_k = k_gelu_gradient(cdf);
    r.g_floor = ady * (cdf.sub + ax * acc_pdf.sub + 1) + 1;
    r.v = x * P;
    r.v_mag = ax * P;
    r.v_k = cdf.rel + 1;
    r.v_floor = ax * cdf.sub + 1;
    break;
  }
  case actquant_activation::gelu_tanh: {
    const ld w = ld_sqrt2_pi * (x + ld_kappa * x * x * x);
    const ld t = std::tanh(w), c = std::cosh(w), sech2 = 1 / (c * c); // 1 - t^2
    const ld d = ld_sqrt2_pi * (1 + 3 * ld_kappa * x * x);
    r.g = dy * (0.5L * (1 + t) + 0.5L * x * sech2 * d);
    r.g_mag = ady * (0.5L * (1 + std::fabs(t)) + 0.5L * ax * d);
    r.g_k = k_gelu_tanh_gradient();
    r.g_floor = ady * (4 + ax) + 1;
    r.v = 0.5L * x * (1 + t);
    r.v_mag = 0.5L * ax * (1 + std::fabs(t));
    r.v_k = acc_tanh.rel + 2 + 7 * max_w_sech2;
    r.v_floor = ax + 2;
    break;
  }
  default: { // silu
    const ld s = ref_sigmoid(x), one_minus_s = 1 / (1 + std::exp(x));
    r.g = dy * s * (1 + x * one_minus_s);
    r.g_mag = ady * s * (1 + ax);
    r.g_k = k_silu_gradient();
    r.g_floor = ady * (1 + ax) * (acc_sigmoid.sub + 2) + 1;
    r.v = x * s;
    r.v_mag = ax * s;
    r.v_k = acc_exp.rel + 2;
    r.v_floor = ax * (acc_sigmoid.sub + 1) + 1;
    break;
  }
  }
  return r;
}

// A call's inputs: codes of shape c.shape grouped as c.g, the estimates, dy of dtype `type`.
struct act_case {
  shape_case c;
  dtype type = dtype::float32;
  actquant_activation f = actquant_activation::gelu;
  bool value = true; // the value output wanted
  std::vector<std::uint8_t> codes;
  std::vector<float> alpha, beta;
  std::vector<unsigned char> dy;
};

// Each group's x = code alpha + beta spans one of five kinds of ranges: around 0 (span 2^-12 to
// 4), typical ones (span 2 to 16 within [-12, 12]), the tails (span 40 within [-40, 40]: Phi
// and phi far below 1, normal_cdf's branches), the range where silu's exp(-x) overflows (span 240
// within [-150, 150]), and large |x| (span 2^8 to 2^15 around 0). An eighth of the codes are 0 or
// 255. dy = 2^(dy_exp + s) N(0, 1) with s = 0, -8 or 8 per element; a tenth +0 or -0, and with
// nan_dy a fiftieth NaN of either sign.
act_case make_act_case(const shape_case& c, dtype t, actquant_activation f, bool value,
                       std::uint64_t seed, int dy_exp, bool nan_dy) {
  act_case a;
  a.c = c;
  a.type = t;
  a.f = f;
  a.value = value;
  const auto n = static_cast<std::size_t>(numel(c.shape));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 99);
  a.alpha.resize(static_cast<std::size_t>(c.groups));
  a.beta.resize(a.alpha.size());
  for (std::size_t g = 0; g < a.alpha.size(); ++g) {
    double span = 0, center = 0;
    switch (pick(gen) % 5) {
    case 0:
      span = std::ldexp(1.0, -12 + pick(gen) % 15);
      center = span * (unit(gen) - 0.5);
      break;
    case 1:
      span = 2 + 14 * unit(gen);
      center = 8 * unit(gen) - 4;
      break;
    case 2:
      span = 40;
      center = 40 * unit(gen) - 20;
      break;
    case 3:
      span = 240;
      center = 60 * unit(gen) - 30;
      break;
    default: span = std::ldexp(1.0, 8 + pick(gen) % 8); break;
    }
    a.alpha[g] = static_cast<float>(span / 255);
    a.beta[g] = static_cast<float>(center - span / 2);
  }
  a.codes.resize(n);
  for (auto& code : a.codes) {
    const int k = pick(gen);
    code = static_cast<std::uint8_t>(k < 6 ? 0 : (k < 12 ? 255 : byte(gen)));
  }
  a.dy.assign(n * kernels::dtype_size(t), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i = 0; i < n; ++i) {
    const int k = pick(gen);
    const int shift = (pick(gen) % 3 - 1) * 8;
    const float v = k < 5                ? 0.0f
                    : k < 10             ? -0.0f
                    : (nan_dy && k < 12) ? (k == 10 ? nan : -nan)
                                         : std::ldexp(n01(gen), dy_exp + shift);
    store_elem(t, a.dy.data(), i, v);
  }
  return a;
}

act_case gen_act_case() {
  const shape_case c = gen_shape();
  const dtype t =
      *rc::gen::elementOf(std::vector<dtype>{dtype::float32, dtype::bfloat16, dtype::float16});
  const auto f = static_cast<actquant_activation>(*rc::gen::inRange(0, 4));
  const bool value = *rc::gen::arbitrary<bool>();
  // float16 dy up to 2^8 4 (its gradients stay below 65504); the others 2^-38 to 2^38.
  const int dy_exp = t == dtype::float16 ? *rc::gen::inRange(-10, 1) : *rc::gen::inRange(-30, 31);
  const bool nan_dy = *rc::gen::inRange(0, 4) == 0;
  return make_act_case(c, t, f, value, *rc::gen::arbitrary<std::uint64_t>(), dy_exp, nan_dy);
}

struct act_outputs {
  std::vector<unsigned char> gx, value; // 0xA5 where not written
};

// Runs actquant_activation_backward on the CPU, the value output wanted as a.value says.
act_outputs run_act(const act_case& a, const kernels::exec& ex = {}) {
  const std::size_t bytes = a.codes.size() * kernels::dtype_size(a.type);
  act_outputs o;
  o.gx.assign(bytes, 0xA5);
  o.value.assign(bytes, 0xA5);
  const auto& s = a.c.shape;
  kernels::actquant_activation_backward(
      view_of(const_cast<std::uint8_t*>(a.codes.data()), dtype::uint8, s),
      view_of(const_cast<float*>(a.alpha.data()), dtype::float32, {a.c.groups}),
      view_of(const_cast<float*>(a.beta.data()), dtype::float32, {a.c.groups}), a.c.g, a.f,
      view_of(const_cast<unsigned char*>(a.dy.data()), a.type, s), view_of(o.gx.data(), a.type, s),
      a.value ? view_of(o.value.data(), a.type, s) : tensor_view{}, ex);
  return o;
}

// x as the backward reads it: actquant_dequantize's output in dy's dtype.
std::vector<unsigned char> act_inputs(const act_case& a) {
  std::vector<unsigned char> x(a.codes.size() * kernels::dtype_size(a.type));
  kernels::actquant_dequantize(
      view_of(const_cast<std::uint8_t*>(a.codes.data()), dtype::uint8, a.c.shape),
      view_of(const_cast<float*>(a.alpha.data()), dtype::float32, {a.c.groups}),
      view_of(const_cast<float*>(a.beta.data()), dtype::float32, {a.c.groups}),
      view_of(x.data(), a.type, a.c.shape), a.c.g);
  return x;
}

// The largest |twin - exact| / (K u m + F 2^-149 + the rounding to D) met, per activation, output
// (gx, value) and dtype (float32, 16-bit).
struct act_tally {
  ld worst[4][2][2] = {};
  std::int64_t elements = 0, nan_dy = 0;
};

// Asserts |got - exact| <= 2 (K u m + F 2^-149) + u_D (|exact| + that) + half D's smallest
// subnormal (u_D = 0 for float32, 2^-8 for bfloat16, 2^-11 for float16).
void check_act(const act_case& a, const char* what, std::size_t i, float x, float dy, float got,
               ld exact, ld mag, ld k, ld floor, ld& worst) {
  const ld first = k * ld_u * mag + floor * ld_tiny;
  const ld u_out = a.type == dtype::bfloat16  ? std::ldexp(1.0L, -8)
                   : a.type == dtype::float16 ? std::ldexp(1.0L, -11)
                                              : 0;
  const ld tiny_out = a.type == dtype::bfloat16  ? std::ldexp(1.0L, -134)
                      : a.type == dtype::float16 ? std::ldexp(1.0L, -25)
                                                 : 0;
  const ld out = u_out * (std::fabs(exact) + 2 * first) + tiny_out;
  const ld diff = std::fabs(static_cast<ld>(got) - exact);
  worst = std::max(worst, diff / (first + out));
  if (!(diff <= 2 * first + out))
    RC_FAIL(std::string(activation_name(a.f)) + " " + what + ", dtype " +
            kernels::dtype_name(a.type) + ", element " + std::to_string(i) + ": x " +
            describe_input(x) + ", dy " + describe_input(dy) + ": twin " + describe_input(got) +
            ", exact " + std::to_string(static_cast<double>(exact)) + ", |difference| " +
            std::to_string(static_cast<double>(diff)) + " > bound " +
            std::to_string(static_cast<double>(2 * first + out)));
}

TEST(actquant, activation_backward_within_derived_bound) {
  act_tally tally;
  check_property("actquant_activation_backward_vs_exact", 1500, [&] {
    const act_case a = gen_act_case();
    const std::vector<unsigned char> xs = act_inputs(a);
    const act_outputs o = run_act(a);
    const dtype t = a.type;
    const std::uint32_t qnan = canonical_nan_bits(t);
    const int fi = static_cast<int>(a.f), ti = t == dtype::float32 ? 0 : 1;
    tally.elements += static_cast<std::int64_t>(a.codes.size());
    for (std::size_t i = 0; i < a.codes.size(); ++i) {
      const float x = elem_value(t, xs.data(), i), dy = elem_value(t, a.dy.data(), i);
      const std::uint32_t gx_bits = elem_bits(t, o.gx.data(), i);
      if (a.f == actquant_activation::relu) { // exact: +0 where x <= 0, else dy; max(x, 0)
        const std::uint32_t want =
            !(x <= 0.0f) ? (std::isnan(dy) ? qnan : elem_bits(t, a.dy.data(), i)) : 0u;
        RC_ASSERT(gx_bits == want);
        if (a.value)
          RC_ASSERT(elem_bits(t, o.value.data(), i) ==
                    (x > 0.0f ? elem_bits(t, xs.data(), i) : 0u));
        continue;
      }
      const act_exact e = exact_activation(a.f, x, dy);
      tally.nan_dy += std::isnan(dy) ? 1 : 0;
      if (std::isnan(dy)) // NaN times a finite derivative
        RC_ASSERT(gx_bits == qnan);
      else
        check_act(a, "gx", i, x, dy, elem_value(t, o.gx.data(), i), e.g, e.g_mag, e.g_k, e.g_floor,
                  tally.worst[fi][0][ti]);
      if (a.value)
        check_act(a, "value", i, x, dy, elem_value(t, o.value.data(), i), e.v, e.v_mag, e.v_k,
                  e.v_floor, tally.worst[fi][1][ti]);
    }
    if (!a.value) // not written
      RC_ASSERT(o.value == std::vector<unsigned char>(o.value.size(), 0xA5));
  });
  std::printf("activation_backward: %lld elements (%lld NaN dy); K (gx) gelu %.3g (x >= 0: "
              "%.3g), gelu_tanh %.3g, silu %.3g; largest |twin - exact| / bound without the "
              "factor 2:\n",
              static_cast<long long>(tally.elements), static_cast<long long>(tally.nan_dy),
              static_cast<double>(k_gelu_gradient(acc_cdf_neg)),
              static_cast<double>(k_gelu_gradient(acc_cdf_pos)),
              static_cast<double>(k_gelu_tanh_gradient()), static_cast<double>(k_silu_gradient()));
  for (int f = 0; f < 3; ++f)
    std::printf(
        "  %-9s gx float32 %.3g, 16-bit %.3g; value float32 %.3g, 16-bit %.3g\n",
        activation_name(static_cast<actquant_activation>(f)),
        static_cast<double>(tally.worst[f][0][0]), static_cast<double>(tally.worst[f][0][1]),
        static_cast<double>(tally.worst[f][1][0]), static_cast<double>(tally.worst[f][1][1]));
}

// Runs of a group longer and shorter than a thread's chunk (65536 elements and more), one group.
TEST(actquant, activation_backward_threads_and_absent_value_do_not_change_bits) {
  std::uint64_t seed = 21;
  for (const auto& [shape, g] :
       std::vector<std::pair<std::vector<std::int64_t>, kernels::actquant_groups>>{
           {{3, 5, 14001}, {1, 1}}, {{17001, 12}, {-1, 4}}, {{1 << 18}, {0, 1 << 18}}}) {
    shape_case c;
    c.shape = shape;
    c.g = g;
    const int nd = static_cast<int>(shape.size());
    c.groups = shape[static_cast<std::size_t>(g.dim < 0 ? g.dim + nd : g.dim)] / g.group_size;
    for (const dtype t : {dtype::float32, dtype::bfloat16, dtype::float16})
      for (const actquant_activation f : all_activations) {
        act_case a = make_act_case(c, t, f, true, seed++, t == dtype::float16 ? -4 : 0, true);
        const act_outputs one = run_act(a, {1, nullptr});
        for (const int threads : {3, 0}) {
          const act_outputs o = run_act(a, {threads, nullptr});
          ASSERT_EQ(one.gx, o.gx) << activation_name(f) << ", threads " << threads;
          ASSERT_EQ(one.value, o.value) << activation_name(f) << ", threads " << threads;
        }
        a.value = false; // gx alone: the same bits
        const act_outputs alone = run_act(a, {3, nullptr});
        ASSERT_EQ(one.gx, alone.gx) << activation_name(f);
        ASSERT_EQ(alone.value, std::vector<unsigned char>(alone.value.size(), 0xA5));
      }
  }
}

// NaN and infinite x (NaN or huge estimates): the smooth activations give NaN (torch's formulas
// give NaN at +-Inf too: Inf times phi's 0, or 1 - t^2 = 0 times Inf); ReLU's gradient is +0
// where x <= 0 and dy elsewhere, a NaN x included (torch's threshold backward), and its value
// keeps the NaN.
TEST(actquant, activation_backward_nan_and_infinite_inputs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const dtype t : {dtype::float32, dtype::bfloat16, dtype::float16}) {
    const std::uint32_t qnan = canonical_nan_bits(t);
    shape_case c;
    c.shape = {4, 3};
    c.g = {0, 1};
    c.groups = 4;
    for (const actquant_activation f : all_activations) {
      act_case a = make_act_case(c, t, f, true, 5, -2, false);
      a.alpha = {nan, 1.0f, 1e37f, 1e37f};
      a.beta = {0.0f, -nan, 0.0f, -3e38f};
      // Rows 2 and 3: code 255 gives +Inf (1e37 * 255), code 0 of row 3 -Inf in float16
      // (-3e38 is beyond its range) and -3e38 in the others.
      for (std::size_t i = 6; i < 12; ++i)
        a.codes[i] = i % 3 == 0 ? 0 : 255;
      for (std::size_t i = 0; i < 12; ++i)
        store_elem(t, a.dy.data(), i, 1.5f);
      const std::vector<unsigned char> xs = act_inputs(a);
      const act_outputs o = run_act(a);
      for (std::size_t i = 0; i < 12; ++i) {
        const float x = elem_value(t, xs.data(), i);
        const std::uint32_t gx = elem_bits(t, o.gx.data(), i), v = elem_bits(t, o.value.data(), i);
        const std::string where = std::string(activation_name(f)) + ", dtype " +
                                  kernels::dtype_name(t) + ", element " + std::to_string(i) +
                                  ", x " + describe_input(x);
        if (i < 6) {
          ASSERT_TRUE(std::isnan(x)) << where;
        }
        if (!std::isnan(x) && !std::isinf(x))
          continue;
        if (f == actquant_activation::relu) {
          ASSERT_EQ(gx, x <= 0.0f ? 0u : elem_bits(t, a.dy.data(), i)) << where;
          ASSERT_EQ(v, std::isnan(x) ? qnan : (x > 0.0f ? elem_bits(t, xs.data(), i) : 0u))
              << where;
        } else {
          ASSERT_EQ(gx, qnan) << where;
          if (std::isnan(x)) {
            ASSERT_EQ(v, qnan) << where;
          }
        }
      }
    }
  }
}

TEST(actquant, activation_backward_bad_arguments_are_refused) {
  std::vector<std::uint8_t> c(12);
  std::vector<float> a(2, 0.1f), b(2, -1.0f), a3(3, 0.1f), dy(12, 1.0f), gx(12), val(12);
  std::vector<std::uint16_t> h1(12), h2(12), h3(12);
  std::vector<double> f64(12), g64(12);
  std::vector<std::int8_t> i8(12);
  const auto cv = view_of(c.data(), dtype::uint8, {3, 4});
  const auto av = view_of(a.data(), dtype::float32, {2}),
             bv = view_of(b.data(), dtype::float32, {2});
  const auto dyv = view_of(dy.data(), dtype::float32, {3, 4});
  const auto gxv = view_of(gx.data(), dtype::float32, {3, 4});
  const auto vv = view_of(val.data(), dtype::float32, {3, 4});
  const kernels::actquant_groups g{1, 2}; // 2 groups of 2 along dimension 1
  const auto gelu = actquant_activation::gelu;
  const auto call = [&](const tensor_view& codes, const tensor_view& alpha, const tensor_view& beta,
                        const kernels::actquant_groups& gr, actquant_activation f,
                        const tensor_view& dyo, const tensor_view& gxo, const tensor_view& vo) {
    kernels::actquant_activation_backward(codes, alpha, beta, gr, f, dyo, gxo, vo);
  };
  EXPECT_NO_THROW(call(cv, av, bv, g, gelu, dyv, gxv, vv));
  EXPECT_NO_THROW(call(cv, av, bv, g, actquant_activation::relu, dyv, gxv, tensor_view{}));
  EXPECT_NO_THROW(call(cv, av, bv, {-1, 2}, actquant_activation::silu, dyv, gxv, vv));
  EXPECT_NO_THROW(call(
      cv, av, bv, g, actquant_activation::gelu_tanh, view_of(h1.data(), dtype::bfloat16, {3, 4}),
      view_of(h2.data(), dtype::bfloat16, {3, 4}), view_of(h3.data(), dtype::bfloat16, {3, 4})));
  // dy: dtype (uint8, float64), shape
  EXPECT_THROW(call(cv, av, bv, g, gelu, cv, gxv, vv), lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, view_of(f64.data(), dtype::float64, {3, 4}),
                    view_of(g64.data(), dtype::float64, {3, 4}), tensor_view{}),
               lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, view_of(dy.data(), dtype::float32, {4, 3}), gxv, vv),
               lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, view_of(dy.data(), dtype::float32, {12}), gxv, vv),
               lowbit::error);
  // gx: dtype other than dy's, shape, absent
  EXPECT_THROW(call(cv, av, bv, g, gelu, dyv, view_of(h2.data(), dtype::bfloat16, {3, 4}), vv),
               lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, view_of(h1.data(), dtype::float16, {3, 4}),
                    view_of(h2.data(), dtype::bfloat16, {3, 4}), tensor_view{}),
               lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, dyv, view_of(gx.data(), dtype::float32, {4, 3}), vv),
               lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, dyv, tensor_view{}, vv), lowbit::error);
  // value: dtype other than dy's, shape
  EXPECT_THROW(call(cv, av, bv, g, gelu, dyv, gxv, view_of(h3.data(), dtype::float16, {3, 4})),
               lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, dyv, gxv, view_of(val.data(), dtype::float32, {4, 3})),
               lowbit::error);
  EXPECT_THROW(call(cv, av, bv, g, gelu, dyv, gxv, view_of(val.data(), dtype::float32, {12})),
               lowbit::error);
  // codes not uint8
  EXPECT_THROW(call(view_of(i8.data(), dtype::int8, {3, 4}), av, bv, g, gelu, dyv, gxv, vv),
               lowbit::error);
  EXPECT_THROW(call(view_of(dy.data(), dtype::float32, {3, 4}), av, bv, g, gelu, dyv, gxv, vv),
               lowbit::error);
  // alpha, beta: not one per group (2 here), not float32
  EXPECT_THROW(call(cv, view_of(a.data(), dtype::float32, {1}), bv, g, gelu, dyv, gxv, vv),
               lowbit::error);
  EXPECT_THROW(call(cv, av, view_of(a3.data(), dtype::float32, {3}), g, gelu, dyv, gxv, vv),
               lowbit::error);
  EXPECT_THROW(call(cv, view_of(h1.data(), dtype::bfloat16, {2}), bv, g, gelu, dyv, gxv, vv),
               lowbit::error);
  // not an activation
  for (const int bad : {4, 7, 255})
    EXPECT_THROW(call(cv, av, bv, g, static_cast<actquant_activation>(bad), dyv, gxv, vv),
                 lowbit::error)
        << bad;
  // the grouping: group_size not dividing the dimension, 0, a dimension out of range
  EXPECT_THROW(call(cv, av, bv, {1, 3}, gelu, dyv, gxv, vv), lowbit::error);
  EXPECT_THROW(call(cv, av, bv, {1, 0}, gelu, dyv, gxv, vv), lowbit::error);
  EXPECT_THROW(call(cv, av, bv, {2, 1}, gelu, dyv, gxv, vv), lowbit::error);
  EXPECT_THROW(call(cv, av, bv, {-3, 1}, gelu, dyv, gxv, vv), lowbit::error);
}

} // namespace
