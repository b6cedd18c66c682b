// The fused optimizer steps' CPU twin against the reference of one step (reference/optim.hpp),
// within a bound derived for the twin's own float32 operation sequence, plus the step's
// invariants: the non-finite rule (blocks left untouched and counted), multi-tensor calls equal
// one call per tensor, thread counts and parameter dtypes change nothing but the final rounding,
// and the argument checks.
//
// The bound (running error analysis): every float32 operation of optim_ops.hpp is replayed on
// pairs (value, error bound); an operation on x~ = x + dx, y~ = y + dy adds the propagated
// errors (|x| dy + |y| dx + dx dy for a product; (|x| dy + |y| dx) / (|y| (|y| - dy)) for a
// quotient; dx / (sqrt(x) + sqrt(x - dx)) for a square root) and its own rounding,
// u (|result| + propagated) + 2^-149 with u = 2^-24. Coefficients enter with their actual
// rounding error |fl(c) - c| (plus 2^-50 |c| for the host's double arithmetic). The twin's
// results may then differ from the reference's by at most the bound: parameters and 32-bit states
// directly; an 8-bit state's absmax by the block's largest state bound E; its code must be the
// nearest entry of some t within delta = (e_i + E) / (A - E) + u of the exact normalized value y
// (A the exact absmax; blocks with A <= E are judged by absmax only), that is between
// nearest(y - delta) and nearest(y + delta), the nearest entry being monotone. The per-tensor
// quantities of the pre-pass (StableAdamW's RMS, LAMB's and LARS' norms and trust ratios) enter
// as bound pairs too: each term's bound plus the float32 summation tree's additions (sum_bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/blockwise.hpp>
#include <lowbit/kernels/optim.hpp>
#include <lowbit/kernels/residual.hpp>
#include <lowbit/reference/optim.hpp>
#include <lowbit/reference/residual.hpp>

#include "support.hpp"

namespace {

using namespace lowbit;
namespace test = lowbit::proptest::test;
using kernels::dtype;
using kernels::optimizer;
using kernels::tensor_view;

constexpr double u32 = 0x1p-24;

// ---- the running error bound -------------------------------------------------------------------

struct rb {
  double v = 0.0, e = 0.0;
};
double own(double r, double prop) {
  return u32 * (std::fabs(r) + prop) + 0x1p-149;
}
rb exact_in(double x) {
  return {x, 0.0};
}
rb coef(double c) {
  const double f = static_cast<float>(c);
  return {c, std::fabs(f - c) + 0x1p-50 * std::fabs(c)};
}
rb operator+(rb a, rb b) {
  const double r = a.v + b.v, p = a.e + b.e;
  return {r, p + own(r, p)};
}
rb operator-(rb a) {
  return {-a.v, a.e};
}
rb operator-(rb a, rb b) {
  return a + (-b);
}
rb operator*(rb a, rb b) {
  const double r = a.v * b.v, p = std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e;
  return {r, p + own(r, p)};
}
rb operator/(rb a, rb b) {
  const double den = std::fabs(b.v) - b.e;
  if (!(den > 0.0))
    return {a.v / b.v, std::numeric_limits<double>::infinity()};
  const double r = a.v / b.v;
  const double p = (std::fabs(a.v) * b.e + std::fabs(b.v) * a.e) / (std::fabs(b.v) * den);
  return {r, p + own(r, p)};
}
rb sqrt_rb(rb a) {
  const double r = std::sqrt(a.v);
  double p = a.e / (r + std::sqrt(std::max(a.v - a.e, 0.0)));
  if (!std::isfinite(p)) // x = 0 within its bound: |sqrt(x~)| <= sqrt(dx)
    p = std::sqrt(a.e);
  return {r, p + own(r, p)};
}
rb max_rb(rb a, rb b) { // exact operation
  return {std::max(a.v, b.v), std::max(a.e, b.e)};
}
rb sign_rb(rb a) {
  const double s = a.v > 0 ? 1.0 : (a.v < 0 ? -1.0 : 0.0);
  return {s, std::fabs(a.v) <= a.e ? 2.0 : 0.0};
}

struct rb_result {
  rb p, s1, s2, s3;
};

// LAMB's direction u and new moments (optim_ops::lamb_direction), on bounds.
rb_result lamb_u(const kernels::optim_hparams& h, double p0, double g0, double a0, double c0) {
  const double t = static_cast<double>(h.step);
  const rb p = exact_in(p0), g = exact_in(h.maximize ? -g0 : g0), a = exact_in(a0),
           c = exact_in(c0);
  const rb m = coef(h.beta1) * a + coef(1.0 - h.beta1) * g;
  const rb v = coef(h.beta2) * c + coef(1.0 - h.beta2) * g * g;
  const double c2 = h.bias_correction ? std::sqrt(1.0 - std::pow(h.beta2, t)) : 1.0;
  const rb bc = h.bias_correction ? coef(c2 / (1.0 - std::pow(h.beta1, t))) : exact_in(1.0);
  const rb u = m * bc / (sqrt_rb(v) + coef(h.eps * c2)) + coef(h.weight_decay) * p;
  return {u, m, v};
}

// The twin's operation sequence (optim_ops.hpp) for one element, on bounds (a0, c0, x0: the
// states' values).
rb_result replay(optimizer o, const kernels::optim_hparams& h, rb eta, rb decay_st, double p0,
                 double g0, double a0, double c0, double x0) {
  const double t = static_cast<double>(h.step);
  rb p = exact_in(p0), g = exact_in(h.maximize ? -g0 : g0), a = exact_in(a0), c = exact_in(c0),
     x = exact_in(x0);
  switch (o) {
  case optimizer::adam:
  case optimizer::adamw: {
    if (o == optimizer::adamw)
      p = p * coef(1.0 - h.lr * h.weight_decay);
    else
      g = g + coef(h.weight_decay) * p;
    const rb m = a + coef(1.0 - h.beta1) * (g - a);
    const rb v = c * coef(h.beta2) + coef(1.0 - h.beta2) * g * g;
    const rb vmax = h.amsgrad ? max_rb(v, x) : v;
    const double c2 = std::sqrt(1.0 - std::pow(h.beta2, t));
    p = p +
        -coef(h.lr * c2 / (1.0 - std::pow(h.beta1, t))) * m / (sqrt_rb(vmax) + coef(h.eps * c2));
    return {p, m, v, vmax};
  }
  case optimizer::stable_adamw: {
    const auto hat = [&](double b) {
      return b * (1.0 - std::pow(b, t - 1.0)) / (1.0 - std::pow(b, t));
    };
    const double b1 = hat(h.beta1), b2 = hat(h.beta2);
    const rb m = coef(b1) * a + coef(1.0 - b1) * g;
    const rb v = coef(b2) * c + coef(1.0 - b2) * g * g;
    p = p * decay_st;
    p = p - eta * m / (sqrt_rb(v) + coef(h.eps));
    return {p, m, v};
  }
  case optimizer::sgd: {
    g = g + coef(h.weight_decay) * p;
    rb buf = a;
    if (h.momentum != 0.0) {
      buf = h.step == 1 ? g : buf * coef(h.momentum) + coef(1.0 - h.dampening) * g;
      g = h.nesterov ? g + coef(h.momentum) * buf : buf;
    }
    p = p + -coef(h.lr) * g;
    return {p, buf, {}};
  }
  case optimizer::lion: {
    p = p * coef(1.0 - h.lr * h.weight_decay);
    const rb uu = coef(h.beta1) * a + coef(1.0 - h.beta1) * g;
    p = p + -coef(h.lr) * sign_rb(uu);
    const rb m = coef(h.beta2) * a + coef(1.0 - h.beta2) * g;
    return {p, m, {}};
  }
  case optimizer::rmsprop: {
    g = g + coef(h.weight_decay) * p;
    const rb v = a * coef(h.beta2) + coef(1.0 - h.beta2) * g * g;
    if (h.momentum == 0.0 && !h.centered) {
      p = p + -coef(h.lr) * g / (sqrt_rb(v) + coef(h.eps));
      return {p, v, {}};
    }
    // Both: c the momentum buffer, x the gradient's average; one of them: c either.
    const bool both = h.momentum != 0.0 && h.centered;
    rb var = v, avg = both ? x : c;
    if (h.centered) {
      avg = avg + coef(1.0 - h.beta2) * (g - avg);
      var = max_rb(v - avg * avg, exact_in(0.0));
    }
    const rb d = sqrt_rb(var) + coef(h.eps);
    if (!both && h.centered) {
      p = p + -coef(h.lr) * g / d;
      return {p, v, avg};
    }
    const rb buf = c * coef(h.momentum) + g / d;
    p = p + -coef(h.lr) * buf;
    return {p, v, buf, avg};
  }
  case optimizer::adagrad: {
    g = g + coef(h.weight_decay) * p;
    const rb s = a + coef(1.0) * g * g;
    p = p + -coef(h.lr / (1.0 + (t - 1.0) * h.lr_decay)) * g / (sqrt_rb(s) + coef(h.eps));
    return {p, s, {}};
  }
  case optimizer::lamb: { // eta: lr times the trust ratio
    const rb_result d = lamb_u(h, p0, g0, a0, c0);
    p = p + -eta * d.p;
    return {p, d.s1, d.s2};
  }
  case optimizer::lars: { // eta: the trust ratio
    g = (g + coef(h.weight_decay) * p) * eta;
    rb buf = a;
    if (h.momentum != 0.0) {
      buf = h.step == 1 ? g : buf * coef(h.momentum) + coef(1.0 - h.dampening) * g;
      g = h.nesterov ? g + coef(h.momentum) * buf : buf;
    }
    p = p + -coef(h.lr) * g;
    return {p, buf, {}};
  }
  }
  return {};
}

// ---- test cases ---------------------------------------------------------------------------------

reference::optim_rule rule_of(optimizer o) {
  return static_cast<reference::optim_rule>(static_cast<int>(o));
}

reference::optim_settings settings_of(const kernels::optim_hparams& h) {
  reference::optim_settings s;
  s.lr = h.lr;
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.eps = h.eps;
  s.weight_decay = h.weight_decay;
  s.momentum = h.momentum;
  s.dampening = h.dampening;
  s.nesterov = h.nesterov;
  s.centered = h.centered;
  s.amsgrad = h.amsgrad;
  s.lr_decay = h.lr_decay;
  s.maximize = h.maximize;
  s.step = h.step;
  s.max_trust_ratio = h.max_trust_ratio;
  s.trust_coefficient = h.trust_coefficient;
  s.adapt = h.adapt;
  s.bias_correction = h.bias_correction;
  return s;
}

// One tensor on the host: fp32 parameter and gradient, states of either kind.
struct host_tensor {
  std::int64_t n = 0;
  bool eight = false;
  std::vector<float> p, g, s[3];
  std::vector<std::uint8_t> code[3];
  std::vector<float> absmax[3];
  std::vector<std::uint16_t> p16, g16; // bf16/fp16 storage when used
};

tensor_view flat(const void* data, dtype t, std::int64_t n) {
  return tensor_view::contiguous(data, t, {n});
}

kernels::optim_tensor views_of(host_tensor& x, int states, dtype pt = dtype::float32) {
  kernels::optim_tensor t;
  if (pt == dtype::float32) {
    t.param = flat(x.p.data(), pt, x.n);
    t.grad = flat(x.g.data(), pt, x.n);
  } else {
    t.param = flat(x.p16.data(), pt, x.n);
    t.grad = flat(x.g16.data(), pt, x.n);
  }
  tensor_view* st[3] = {&t.state1, &t.state2, &t.state3};
  tensor_view* am[3] = {&t.absmax1, &t.absmax2, &t.absmax3};
  for (int k = 0; k < states; ++k) {
    if (x.eight) {
      *st[k] = flat(x.code[k].data(), dtype::uint8, x.n);
      *am[k] =
          flat(x.absmax[k].data(), dtype::float32, static_cast<std::int64_t>(x.absmax[k].size()));
    } else {
      *st[k] = flat(x.s[k].data(), dtype::float32, x.n);
    }
  }
  return t;
}

// Values with scales spread over 2^-30 .. 2^10 per run of 64, zeros now and then.
float draw(std::mt19937_64& r, int run_exp) {
  std::normal_distribution<float> nd;
  if (r() % 50 == 0)
    return 0.0f;
  return nd(r) * std::ldexp(1.0f, run_exp);
}

host_tensor make_tensor(std::mt19937_64& r, std::int64_t n, bool eight, int states,
                        std::int64_t block, bool positive2, bool positive1, bool positive3 = true) {
  host_tensor x;
  x.n = n;
  x.eight = eight;
  x.p.resize(n);
  x.g.resize(n);
  int pe = 0, ge = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 64 == 0) {
      pe = static_cast<int>(r() % 20) - 12;
      ge = static_cast<int>(r() % 30) - 22;
    }
    x.p[i] = draw(r, pe);
    x.g[i] = draw(r, ge);
  }
  const std::int64_t blocks = kernels::blockwise_blocks(n, block);
  for (int k = 0; k < states; ++k) {
    const bool pos = k == 0 ? positive1 : (k == 1 ? positive2 : positive3);
    if (eight) {
      x.code[k].resize(n);
      x.absmax[k].resize(blocks);
      for (auto& c : x.code[k])
        c = static_cast<std::uint8_t>(r() % 256);
      for (auto& a : x.absmax[k])
        a = r() % 10 == 0 ? 0.0f
                          : std::ldexp(1.0f + static_cast<float>(r() % 1000) / 1000.0f,
                                       static_cast<int>(r() % 30) - (pos ? 40 : 20));
    } else {
      x.s[k].resize(n);
      for (std::int64_t i = 0; i < n; ++i) {
        const float v = draw(r, pos ? -40 + static_cast<int>(r() % 20) : ge);
        x.s[k][i] = pos ? std::fabs(v) : v;
      }
    }
  }
  return x;
}

// The states' values as the twin reads them (dequantized for 8-bit states).
std::vector<double> state_values(const host_tensor& x, int k, std::int64_t block, bool is_signed) {
  std::vector<double> v(x.n);
  const kernels::codebook cb = kernels::codebook::dynamic_tree(is_signed);
  for (std::int64_t i = 0; i < x.n; ++i)
    v[i] = x.eight ? static_cast<double>(cb[x.code[k][i]] * x.absmax[k][i / block]) : x.s[k][i];
  return v;
}

// three: the form of three states where the optimizer has one (adam and adamw with amsgrad,
// rmsprop with momentum and centered); otherwise drawn like the others.
kernels::optim_hparams random_hparams(optimizer o, std::mt19937_64& r, bool three = false) {
  kernels::optim_hparams h;
  const auto pick = [&](std::initializer_list<double> v) {
    return *(v.begin() + static_cast<std::ptrdiff_t>(r() % v.size()));
  };
  h.lr = pick({1e-3, 3e-4, 0.1, 1.0});
  h.beta1 = pick({0.9, 0.0, 0.5, 0.95});
  h.beta2 = pick({0.999, 0.99, 0.95, 0.5});
  h.eps = pick({1e-8, 1e-6, 1e-3});
  h.weight_decay = pick({0.0, 0.01, 0.1});
  h.step = static_cast<std::int64_t>(pick({1, 2, 3, 10, 1000}));
  h.maximize = r() % 8 == 0;
  if (o == optimizer::sgd) {
    h.momentum = pick({0.0, 0.9, 0.5});
    h.dampening = h.momentum > 0 && r() % 2 ? 0.1 : 0.0;
    h.nesterov = h.momentum > 0 && h.dampening == 0.0 && r() % 2;
  }
  if (o == optimizer::adagrad)
    h.lr_decay = pick({0.0, 0.01});
  if (o == optimizer::rmsprop) { // plain, with momentum, centered, or both
    const int mode = three ? 3 : static_cast<int>(r() % 4);
    h.momentum = mode == 1 || mode == 3 ? pick({0.9, 0.5}) : 0.0;
    h.centered = mode >= 2;
  }
  if (o == optimizer::adam || o == optimizer::adamw)
    h.amsgrad = three || r() % 3 == 0;
  if (o == optimizer::lars) {
    h.momentum = pick({0.0, 0.9, 0.5});
    h.dampening = h.momentum > 0 && r() % 2 ? 0.1 : 0.0;
    h.nesterov = h.momentum > 0 && h.dampening == 0.0 && r() % 2;
    h.trust_coefficient = pick({1e-3, 0.02, 1.0});
  }
  if (o == optimizer::lamb || o == optimizer::lars) {
    h.max_trust_ratio = pick({std::numeric_limits<double>::infinity(), 10.0, 0.5, 1e-3});
    h.adapt = r() % 6 != 0;
    h.bias_correction = r() % 3 != 0;
  }
  return h;
}

const optimizer all_optimizers[] = {optimizer::adam,    optimizer::adamw, optimizer::stable_adamw,
                                    optimizer::sgd,     optimizer::lion,  optimizer::rmsprop,
                                    optimizer::adagrad, optimizer::lamb,  optimizer::lars};

// The optimizers whose per-tensor pre-pass leaves blocks with non-finite values out of the whole
// tensor's RMS or norms (so the other blocks' results depend on which were left out).
bool has_prepass(optimizer o) {
  return o == optimizer::stable_adamw || o == optimizer::lamb || o == optimizer::lars;
}

std::string describe_case(optimizer o, const kernels::optim_hparams& h, std::int64_t n,
                          std::int64_t block, bool eight) {
  return std::string(kernels::optimizer_name(o)) + " n=" + std::to_string(n) +
         " block=" + std::to_string(block) + (eight ? " 8-bit" : " 32-bit") +
         " lr=" + std::to_string(h.lr) + " b1=" + std::to_string(h.beta1) +
         " b2=" + std::to_string(h.beta2) + " eps=" + std::to_string(h.eps) +
         " wd=" + std::to_string(h.weight_decay) + " step=" + std::to_string(h.step) +
         " mom=" + std::to_string(h.momentum) + (h.centered ? " centered" : "") +
         (h.amsgrad ? " amsgrad" : "") + " max_tr=" + std::to_string(h.max_trust_ratio) +
         " tc=" + std::to_string(h.trust_coefficient) + (h.adapt ? "" : " no-adapt") +
         (h.bias_correction ? "" : " no-bias-correction") + (h.maximize ? " maximize" : "");
}

// The nearest entry of a codebook to a double y under the reference's tie rule (a tie goes to the
// entry of smaller magnitude, at a zero midpoint to the upper one), the midpoints exact in double
// (sums of two floats of the map). Exact like reference::nearest_entry, and fast enough for every
// element of every case.
int nearest_double(const reference::codebook_values& cb, double y) {
  int idx = 0;
  for (int j = 0; j < 255; ++j) {
    const double m = (static_cast<double>(cb[j]) + static_cast<double>(cb[j + 1])) / 2.0;
    idx += (y > m || (y == m && m <= 0.0)) ? 1 : 0;
  }
  return idx;
}

// The pre-pass's sum of terms over a tensor, as a bound pair: each term's own bound plus the
// float32 additions a term passes through (optim_per_lane in its lane, in order, then
// log2(block / 8) halvings of the lanes: 13 for blocks of 256, 16 for 2048), each adding at most
// u of the partial sums' magnitudes (1.01 covers the gamma_k = k u / (1 - k u) of the sum of k
// roundings), then the double sums (1e-12 relative covers them).
rb sum_bound(const std::vector<rb>& terms, std::int64_t block) {
  const double depth = 8.0 + std::log2(static_cast<double>(block / 8));
  double sum = 0.0, err = 0.0, mag = 0.0;
  for (const rb& t : terms) {
    sum += t.v;
    err += t.e;
    mag += std::fabs(t.v) + t.e;
  }
  return {sum, err + depth * u32 * mag * 1.01 + 1e-12 * mag};
}

// StableAdamW's eta as a bound pair, from the exact RMS and the twin's summation tree.
rb stable_eta_bound(const kernels::optim_hparams& h, const reference::optim_values& x,
                    std::int64_t block, double rms, rb& decay) {
  const double t = static_cast<double>(h.step);
  const double b2 = h.beta2 * (1.0 - std::pow(h.beta2, t - 1.0)) / (1.0 - std::pow(h.beta2, t));
  std::vector<rb> terms;
  for (std::size_t i = 0; i < x.p.size(); ++i) {
    const rb g = exact_in(h.maximize ? -x.g[i] : x.g[i]);
    const rb v = coef(b2) * exact_in(x.s2[i]) + coef(1.0 - b2) * g * g;
    terms.push_back(g * g / max_rb(v, coef(h.eps * h.eps)));
  }
  const rb total = sum_bound(terms, block);
  const double sum = total.v, err = total.e;
  const double rel_rms = sum > 0 ? 0.5 * err / sum + 1e-15 : 0.0;
  const double eta = h.lr / std::max(1.0, rms);
  const double rel = rms * (1.0 + rel_rms) > 1.0 ? rel_rms : 0.0;
  const rb e{eta, eta * rel + u32 * eta + 0x1p-149};
  const double dv = 1.0 - eta * h.weight_decay;
  decay = {dv, e.e * h.weight_decay + u32 * std::fabs(dv) + 1e-16};
  return e;
}

// LAMB's eta = lr min(r, max_trust_ratio) or LARS' min(r, max_trust_ratio), r the trust ratio,
// as a bound pair: the squared norms' sums as sum_bound gives them, then the host's double
// operations bounded as float32 ones (looser). determined = false where a sum's bound reaches
// down to 0 although the exact norm is not 0 (whether the twin took the ratio or 1 is then open).
rb trust_eta_bound(optimizer o, const kernels::optim_hparams& h, const reference::optim_values& x,
                   std::int64_t block, const reference::optim_exact& ex, bool& determined) {
  determined = true;
  const rb one_ratio = o == optimizer::lamb ? coef(h.lr) : exact_in(1.0);
  if (!h.adapt || ex.norm_p == 0.0 || ex.norm_q == 0.0)
    return one_ratio;
  std::vector<rb> tp, tq;
  for (std::size_t i = 0; i < x.p.size(); ++i) {
    const rb p = exact_in(x.p[i]);
    tp.push_back(p * p);
    const rb q =
        o == optimizer::lamb ? lamb_u(h, x.p[i], x.g[i], x.s1[i], x.s2[i]).p : exact_in(x.g[i]);
    tq.push_back(q * q);
  }
  const rb sp = sum_bound(tp, block), sq = sum_bound(tq, block);
  if (!(sp.v - sp.e > 0.0) || !(sq.v - sq.e > 0.0)) {
    determined = false;
    return {};
  }
  const rb pn = sqrt_rb(sp), qn = sqrt_rb(sq);
  rb r = o == optimizer::lamb
             ? pn / qn
             : coef(h.trust_coefficient) * pn / (qn + coef(h.weight_decay) * pn + coef(h.eps));
  r.v = std::min(r.v, h.max_trust_ratio); // min(., M) moves no two values further apart
  if (o == optimizer::lamb)
    return exact_in(h.lr) * r;
  return {r.v, r.e + own(r.v, r.e)};
}

// residual: the parameter as a bfloat16 weight plus a 16-bit residual (docs/techniques/
// residual.md), whose join is the float32 value exactly; the gradient then in bfloat16. After the
// step the join is compared as the float32 parameter is, and the stored pair must be the exact
// reference's split of that join.
void check_against_reference(optimizer o, std::uint64_t seed, bool residual = false,
                             bool three = false) {
  std::mt19937_64 r(seed);
  const kernels::optim_hparams h = random_hparams(o, r, three);
  const std::int64_t block = r() % 4 == 0 ? 2048 : 256;
  const bool eight = r() % 3 != 0;
  const std::int64_t sizes[] = {0, 1, 3, 255, 256, 257, 1000, 2048, 2049, 5000};
  const std::int64_t n = sizes[r() % std::size(sizes)];
  const int ns = kernels::optimizer_states(o, h);
  const bool two_unsigned = !kernels::optimizer_state_signed(o, 1),
             one_unsigned = !kernels::optimizer_state_signed(o, 0),
             three_unsigned = !kernels::optimizer_state_signed(o, 2);
  host_tensor x = make_tensor(r, n, eight, ns, block, two_unsigned, one_unsigned, three_unsigned);
  std::vector<std::int16_t> r16;
  if (residual) {
    x.p16.resize(n);
    x.g16.resize(n);
    r16.resize(n);
    kernels::residual_split(flat(x.p.data(), dtype::float32, n),
                            flat(x.p16.data(), dtype::bfloat16, n),
                            flat(r16.data(), dtype::int16, n), 16);
    for (std::int64_t i = 0; i < n; ++i) {
      x.g16[i] = static_cast<std::uint16_t>(emu::encode(emu::bfloat16, x.g[i], emu::policy{}));
      x.g[i] = emu::decode<float>(emu::bfloat16, x.g16[i]);
    }
  }
  reference::optim_values in;
  in.p.assign(x.p.begin(), x.p.end());
  in.g.assign(x.g.begin(), x.g.end());
  if (ns > 0)
    in.s1 = state_values(x, 0, block, kernels::optimizer_state_signed(o, 0));
  if (ns > 1)
    in.s2 = state_values(x, 1, block, kernels::optimizer_state_signed(o, 1));
  if (ns > 2)
    in.s3 = state_values(x, 2, block, kernels::optimizer_state_signed(o, 2));
  const reference::optim_exact ex = reference::optimizer_step_exact(rule_of(o), settings_of(h), in);

  std::vector<std::int64_t> skipped(1, 0);
  kernels::optim_config cfg;
  cfg.block = block;
  kernels::optim_tensor t = views_of(x, ns, residual ? dtype::bfloat16 : dtype::float32);
  if (residual)
    t.residual = flat(r16.data(), dtype::int16, n);
  kernels::optimizer_step(o, h, &t, 1, flat(skipped.data(), dtype::int64, 1), cfg);
  const std::string what = describe_case(o, h, n, block, eight) + (residual ? " residual16" : "");
  RC_ASSERT(skipped[0] == 0);
  if (residual) {
    kernels::residual_join(flat(x.p16.data(), dtype::bfloat16, n),
                           flat(r16.data(), dtype::int16, n), 16,
                           flat(x.p.data(), dtype::float32, n));
    for (std::int64_t i = 0; i < n; ++i) {
      const reference::residual_parts e =
          reference::residual_split_exact(reference::residual_weight::bf16, 16, x.p[i]);
      if (e.w != x.p16[i] || e.r != r16[i])
        RC_FAIL(what + ": element " + std::to_string(i) +
                " stored pair differs from the exact "
                "split of its float32 value");
    }
  }

  rb eta{h.lr, 0.0}, decay{1.0, 0.0};
  if (o == optimizer::stable_adamw)
    eta = stable_eta_bound(h, in, block, ex.rms, decay);
  bool determined = true;
  if (o == optimizer::lamb || o == optimizer::lars)
    eta = trust_eta_bound(o, h, in, block, ex, determined);
  if (!determined) // rare: a tensor of tiny values whose squares underflow
    return;
  std::vector<rb_result> b(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    b[i] = replay(o, h, eta, decay, in.p[i], in.g[i], ns > 0 ? in.s1[i] : 0.0,
                  ns > 1 ? in.s2[i] : 0.0, ns > 2 ? in.s3[i] : 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(x.p[i]) - ex.p[i]);
    if (!(d <= b[i].p.e * 1.000001 + 1e-300))
      RC_FAIL(what + ": parameter " + std::to_string(i) + " twin " + test::describe_input(x.p[i]) +
              " reference " + test::describe_input(ex.p[i]) + " bound " + std::to_string(b[i].p.e));
  }
  for (int k = 0; k < ns; ++k) {
    const std::vector<double>& es = k == 0 ? ex.s1 : (k == 1 ? ex.s2 : ex.s3);
    const auto bound = [&](std::int64_t i) {
      return k == 0 ? b[i].s1.e : (k == 1 ? b[i].s2.e : b[i].s3.e);
    };
    if (!eight) {
      for (std::int64_t i = 0; i < n; ++i)
        if (!(std::fabs(static_cast<double>(x.s[k][i]) - es[i]) <= bound(i) * 1.000001))
          RC_FAIL(what + ": state" + std::to_string(k + 1) + " " + std::to_string(i) + " twin " +
                  test::describe_input(x.s[k][i]) + " reference " + test::describe_input(es[i]));
      continue;
    }
    const bool sg = kernels::optimizer_state_signed(o, k);
    const kernels::codebook cb = kernels::codebook::dynamic_tree(sg);
    reference::codebook_values cv{};
    std::copy(cb.values().begin(), cb.values().end(), cv.begin());
    const reference::quantized_state q = reference::quantize_state(es, block, cv, false);
    const auto nearest = [&](double y) { return nearest_double(cv, y); };
    for (std::int64_t bl = 0; bl * block < n; ++bl) {
      const std::int64_t i0 = bl * block, i1 = std::min(n, i0 + block);
      double E = 0.0;
      for (std::int64_t i = i0; i < i1; ++i)
        E = std::max(E, bound(i));
      const double A = q.absmax[bl];
      if (!(std::fabs(static_cast<double>(x.absmax[k][bl]) - A) <= E * 1.000001))
        RC_FAIL(what + ": absmax" + std::to_string(k + 1) + " of block " + std::to_string(bl) +
                " twin " + test::describe_input(x.absmax[k][bl]) + " reference " +
                test::describe_input(A));
      if (!(A > E))
        continue;
      for (std::int64_t i = i0; i < i1; ++i) {
        const int got = x.code[k][i], want = nearest(q.y[i]);
        if (got == want)
          continue;
        const double delta = (bound(i) + E) / (A - E) + u32;
        const int lo = nearest(q.y[i] - delta), hi = nearest(q.y[i] + delta);
        if (got < lo || got > hi)
          RC_FAIL(what + ": code of state" + std::to_string(k + 1) + " element " +
                  std::to_string(i) + " twin " + std::to_string(got) + " reference " +
                  std::to_string(want) + " allowed [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
      }
    }
  }
}

TEST(optim_twin, matches_the_reference_within_the_derived_bound) {
  for (optimizer o : all_optimizers)
    test::check_property(std::string("optim_twin.reference.") + kernels::optimizer_name(o), 60,
                         [o] {
                           const auto seed = *rc::gen::arbitrary<std::uint64_t>();
                           check_against_reference(o, seed);
                         });
}

// The forms of three states (adam and adamw with amsgrad, rmsprop with momentum and centered),
// each case in that form, 32- and 8-bit states, plain and with a residual master weight.
TEST(optim_twin, three_state_forms_match_the_reference_within_the_derived_bound) {
  for (optimizer o : {optimizer::adam, optimizer::adamw, optimizer::rmsprop})
    for (bool residual : {false, true})
      test::check_property(std::string("optim_twin.three_states.") + kernels::optimizer_name(o) +
                               (residual ? ".residual" : ""),
                           residual ? 20 : 60, [o, residual] {
                             const auto seed = *rc::gen::arbitrary<std::uint64_t>();
                             check_against_reference(o, seed, residual, true);
                           });
}

// The step on a bfloat16 weight plus 16-bit residual: the rebuilt float32 value within the same
// bound of the reference, the stored pair its exact split.
TEST(optim_twin, residual_master_weights_match_the_reference_within_the_derived_bound) {
  for (optimizer o : all_optimizers)
    test::check_property(std::string("optim_twin.residual.") + kernels::optimizer_name(o), 20, [o] {
      const auto seed = *rc::gen::arbitrary<std::uint64_t>();
      check_against_reference(o, seed, true);
    });
}

// ---- invariants ---------------------------------------------------------------------------------

struct bytes_of {
  std::vector<float> p, s[3], absmax[3];
  std::vector<std::uint8_t> code[3];
  friend bool operator==(const bytes_of& a, const bytes_of& b) {
    const auto same = [](const auto& x, const auto& y) {
      // memcmp may not be given the null data() of an empty vector, even for 0 bytes.
      return x.size() == y.size() &&
             (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
    };
    bool eq = same(a.p, b.p);
    for (int k = 0; k < 3; ++k)
      eq = eq && same(a.s[k], b.s[k]) && same(a.absmax[k], b.absmax[k]) &&
           same(a.code[k], b.code[k]);
    return eq;
  }
};
bytes_of snapshot(const host_tensor& x) {
  bytes_of b;
  b.p = x.p;
  for (int k = 0; k < 3; ++k) {
    b.s[k] = x.s[k];
    b.absmax[k] = x.absmax[k];
    b.code[k] = x.code[k];
  }
  return b;
}

TEST(optim_twin, multi_tensor_call_equals_one_call_per_tensor_and_threads_change_nothing) {
  test::check_property("optim_twin.multi_tensor", 40, [] {
    std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
    const optimizer o = all_optimizers[r() % std::size(all_optimizers)];
    const kernels::optim_hparams h = random_hparams(o, r);
    const int ns = kernels::optimizer_states(o, h);
    kernels::optim_config cfg;
    cfg.block = r() % 2 ? 256 : 2048;
    std::vector<host_tensor> a;
    const int count = 1 + static_cast<int>(r() % 6);
    for (int j = 0; j < count; ++j)
      a.push_back(make_tensor(r, static_cast<std::int64_t>(r() % 6000), r() % 2 == 0, ns, cfg.block,
                              true, !kernels::optimizer_state_signed(o, 0)));
    std::vector<host_tensor> b = a, c = a;
    std::vector<kernels::optim_tensor> ta;
    for (auto& x : a)
      ta.push_back(views_of(x, ns));
    kernels::optimizer_step(o, h, ta.data(), count, {}, cfg, {.threads = 2});
    for (auto& x : b) {
      const kernels::optim_tensor t = views_of(x, ns);
      kernels::optimizer_step(o, h, &t, 1, {}, cfg, {.threads = 1});
    }
    for (int j = 0; j < count; ++j)
      RC_ASSERT(snapshot(a[static_cast<std::size_t>(j)]) ==
                snapshot(b[static_cast<std::size_t>(j)]));
    (void)c;
  });
}

// NaN or Inf in a gradient: those blocks keep their parameters and states bit for bit and are
// counted; every other block is updated as without them (StableAdamW: its RMS leaves them out, so
// only the untouched blocks are compared).
TEST(optim_twin, non_finite_gradients_leave_their_blocks_untouched_and_are_counted) {
  test::check_property("optim_twin.non_finite", 40, [] {
    std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
    const optimizer o = all_optimizers[r() % std::size(all_optimizers)];
    const kernels::optim_hparams h = random_hparams(o, r);
    const int ns = kernels::optimizer_states(o, h);
    kernels::optim_config cfg;
    cfg.block = 256;
    const std::int64_t n = 1 + static_cast<std::int64_t>(r() % 3000);
    host_tensor x = make_tensor(r, n, r() % 2 == 0, ns, cfg.block, true,
                                !kernels::optimizer_state_signed(o, 0));
    host_tensor clean = x;
    const bytes_of before = snapshot(x);
    const std::int64_t blocks = kernels::blockwise_blocks(n, cfg.block);
    std::vector<bool> bad(static_cast<std::size_t>(blocks), false);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    std::int64_t nbad = 0;
    for (std::int64_t b = 0; b < blocks; ++b)
      if (r() % 3 == 0) {
        const std::int64_t i = b * cfg.block + static_cast<std::int64_t>(r() % 256);
        if (i < n) {
          x.g[i] = specials[r() % 3];
          bad[b] = true;
          ++nbad;
        }
      }
    // The clean run: the same gradients, the poisoned blocks' zeroed (their result is not used).
    for (std::int64_t b = 0; b < blocks; ++b)
      if (bad[b])
        for (std::int64_t i = b * cfg.block; i < std::min(n, (b + 1) * cfg.block); ++i)
          clean.g[i] = 0.0f;
    std::vector<std::int64_t> skipped(1, 0), skipped_clean(1, 0);
    const kernels::optim_tensor t = views_of(x, ns), tc = views_of(clean, ns);
    kernels::optimizer_step(o, h, &t, 1, flat(skipped.data(), dtype::int64, 1), cfg);
    kernels::optimizer_step(o, h, &tc, 1, flat(skipped_clean.data(), dtype::int64, 1), cfg);
    RC_ASSERT(skipped[0] >= nbad);
    const std::int64_t clean_skips = skipped_clean[0];
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t i0 = b * cfg.block, i1 = std::min(n, i0 + cfg.block);
      for (std::int64_t i = i0; i < i1; ++i) {
        const auto same = [](float p, float q) { return std::memcmp(&p, &q, 4) == 0; };
        if (bad[b]) {
          RC_ASSERT(same(x.p[i], before.p[i]));
          for (int k = 0; k < ns; ++k)
            RC_ASSERT(
                (x.eight ? x.code[k][i] == before.code[k][i] : same(x.s[k][i], before.s[k][i])));
        } else if (!has_prepass(o)) {
          RC_ASSERT(same(x.p[i], clean.p[i]));
          for (int k = 0; k < ns; ++k)
            RC_ASSERT(
                (x.eight ? x.code[k][i] == clean.code[k][i] : same(x.s[k][i], clean.s[k][i])));
        }
      }
      if (bad[b])
        for (int k = 0; k < ns && x.eight; ++k)
          RC_ASSERT(std::memcmp(&x.absmax[k][b], &before.absmax[k][b], 4) == 0);
    }
    if (!has_prepass(o))
      RC_ASSERT(skipped[0] == nbad + clean_skips);
  });
}

// bfloat16 and float16 parameters: the float32 step on their values, rounded once to the dtype
// (nearest even); the states exactly those of the float32 step.
TEST(optim_twin, half_precision_parameters_round_the_float32_step_once) {
  test::check_property("optim_twin.half_params", 40, [] {
    std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
    const optimizer o = all_optimizers[r() % std::size(all_optimizers)];
    const kernels::optim_hparams h = random_hparams(o, r);
    const int ns = kernels::optimizer_states(o, h);
    const dtype pt = r() % 2 ? dtype::bfloat16 : dtype::float16;
    const emu::format f = pt == dtype::bfloat16 ? emu::bfloat16 : emu::float16;
    kernels::optim_config cfg;
    const std::int64_t n = static_cast<std::int64_t>(r() % 2000);
    host_tensor x = make_tensor(r, n, r() % 2 == 0, ns, cfg.block, true,
                                !kernels::optimizer_state_signed(o, 0));
    x.p16.resize(n);
    x.g16.resize(n);
    for (std::int64_t i = 0; i < n; ++i) {
      x.p16[i] = static_cast<std::uint16_t>(emu::encode(f, x.p[i], emu::policy{}));
      x.g16[i] = static_cast<std::uint16_t>(emu::encode(f, x.g[i], emu::policy{}));
      x.p[i] = emu::decode<float>(f, x.p16[i]);
      x.g[i] = emu::decode<float>(f, x.g16[i]);
    }
    host_tensor y = x;
    std::vector<std::int64_t> s16(1, 0), s32(1, 0);
    const kernels::optim_tensor t16 = views_of(x, ns, pt), t32 = views_of(y, ns);
    kernels::optimizer_step(o, h, &t16, 1, flat(s16.data(), dtype::int64, 1), cfg);
    kernels::optimizer_step(o, h, &t32, 1, flat(s32.data(), dtype::int64, 1), cfg);
    // A block may be skipped in half precision alone (a parameter overflowing float16).
    RC_PRE(s16[0] == s32[0]);
    for (std::int64_t i = 0; i < n; ++i)
      RC_ASSERT(x.p16[i] == static_cast<std::uint16_t>(emu::encode(f, y.p[i], emu::policy{})));
    x.p = y.p;
    RC_ASSERT(snapshot(x) == snapshot(y));
  });
}

TEST(optim_twin, stochastic_rounding_is_deterministic_and_stays_beside_the_nearest_entry) {
  std::mt19937_64 r(7);
  const kernels::optim_hparams h;
  host_tensor x = make_tensor(r, 5000, true, 2, 256, true, false);
  host_tensor y = x, z = x, w = x;
  kernels::optim_config cfg;
  cfg.rounding = kernels::codebook_rounding::stochastic;
  cfg.seed = 42;
  const kernels::optim_tensor tx = views_of(x, 2), ty = views_of(y, 2), tz = views_of(z, 2),
                              tw = views_of(w, 2);
  kernels::optimizer_step(optimizer::adamw, h, &tx, 1, {}, cfg);
  kernels::optimizer_step(optimizer::adamw, h, &ty, 1, {}, cfg);
  EXPECT_TRUE(snapshot(x) == snapshot(y));
  cfg.offset = 2;
  kernels::optimizer_step(optimizer::adamw, h, &tz, 1, {}, cfg);
  EXPECT_FALSE(snapshot(x) == snapshot(z));
  EXPECT_EQ(x.p, z.p); // the parameters do not depend on the states' rounding
  kernels::optim_config nearest;
  kernels::optimizer_step(optimizer::adamw, h, &tw, 1, {}, nearest);
  int differ = 0;
  for (int k = 0; k < 2; ++k)
    for (std::int64_t i = 0; i < x.n; ++i) {
      EXPECT_LE(std::abs(int(x.code[k][i]) - int(w.code[k][i])), 1) << "element " << i;
      differ += x.code[k][i] != w.code[k][i];
    }
  EXPECT_GT(differ, 0);
}

// Stochastic rounding draws element i of state k of tensor j from stream offset + S j + k, S = 2
// streams per tensor, 3 in calls of three states (so that a tensor's third state and the next
// tensor's first do not share their bits): a multi-tensor call equals one call per tensor at
// offset + S j.
TEST(optim_twin, stochastic_rounding_gives_every_state_of_a_call_its_own_stream) {
  for (const bool three : {false, true}) {
    std::mt19937_64 r(17);
    kernels::optim_hparams h;
    h.amsgrad = three;
    const int ns = kernels::optimizer_states(optimizer::adam, h);
    ASSERT_EQ(ns, three ? 3 : 2);
    std::vector<host_tensor> a;
    for (int j = 0; j < 3; ++j)
      a.push_back(make_tensor(r, 1000, true, ns, 256, true, false));
    std::vector<host_tensor> b = a;
    kernels::optim_config cfg;
    cfg.rounding = kernels::codebook_rounding::stochastic;
    cfg.seed = 5;
    cfg.offset = 12;
    std::vector<kernels::optim_tensor> ta;
    for (auto& x : a)
      ta.push_back(views_of(x, ns));
    kernels::optimizer_step(optimizer::adam, h, ta.data(), 3, {}, cfg);
    for (int j = 0; j < 3; ++j) {
      kernels::optim_config one = cfg;
      one.offset = cfg.offset + static_cast<std::uint64_t>(ns * j);
      const kernels::optim_tensor t = views_of(b[static_cast<std::size_t>(j)], ns);
      kernels::optimizer_step(optimizer::adam, h, &t, 1, {}, one);
      EXPECT_TRUE(snapshot(a[static_cast<std::size_t>(j)]) ==
                  snapshot(b[static_cast<std::size_t>(j)]))
          << (three ? "three" : "two") << " states, tensor " << j;
    }
  }
}

TEST(optim_twin, many_steps_in_a_row_stay_finite_and_descend_a_quadratic) {
  // f(p) = sum (p - c)^2 / 2, gradient p - c: every optimizer's 8-bit run gets closer to c, in
  // each of its state forms (three: adam's and adamw's amsgrad, rmsprop centered with momentum).
  std::vector<std::pair<optimizer, bool>> forms;
  for (optimizer o : all_optimizers)
    forms.emplace_back(o, false);
  for (optimizer o : {optimizer::adam, optimizer::adamw, optimizer::rmsprop})
    forms.emplace_back(o, true);
  for (const auto& [o, three] : forms) {
    std::mt19937_64 r(11);
    kernels::optim_hparams h;
    h.amsgrad = three && o != optimizer::rmsprop;
    h.centered = three && o == optimizer::rmsprop;
    h.lr = o == optimizer::sgd ? 0.1 : (o == optimizer::adagrad ? 0.5 : 0.01);
    if (o == optimizer::lars) { // steps of lr tc ||p|| in the gradient's direction
      h.lr = 1.0;
      h.trust_coefficient = 0.01;
    }
    h.momentum = 0.9;
    h.beta2 = o == optimizer::lion || o == optimizer::rmsprop ? 0.99 : 0.999;
    const int ns = kernels::optimizer_states(o, h);
    host_tensor x =
        make_tensor(r, 3000, true, ns, 256, true, !kernels::optimizer_state_signed(o, 0));
    std::vector<float> c(x.n);
    for (auto& v : c)
      v = std::normal_distribution<float>()(r);
    for (auto& v : x.p)
      v = 2.0f * std::normal_distribution<float>()(r);
    for (int k = 0; k < ns; ++k) {
      std::fill(x.code[k].begin(), x.code[k].end(),
                kernels::optimizer_state_signed(o, k) ? 127 : 0);
      std::fill(x.absmax[k].begin(), x.absmax[k].end(), 0.0f);
    }
    const kernels::codebook cb = kernels::codebook::dynamic_tree(true);
    for (int k = 0; k < ns; ++k)
      if (kernels::optimizer_state_signed(o, k))
        for (auto& code : x.code[k])
          code = static_cast<std::uint8_t>(std::find(cb.values().begin(), cb.values().end(), 0.0f) -
                                           cb.values().begin());
    const auto loss = [&] {
      double s = 0;
      for (std::int64_t i = 0; i < x.n; ++i)
        s += 0.5 * (double(x.p[i]) - c[i]) * (double(x.p[i]) - c[i]);
      return s;
    };
    const double l0 = loss();
    std::vector<std::int64_t> skipped(1, 0);
    for (std::int64_t step = 1; step <= 200; ++step) {
      for (std::int64_t i = 0; i < x.n; ++i)
        x.g[i] = x.p[i] - c[i];
      h.step = step;
      const kernels::optim_tensor t = views_of(x, ns);
      kernels::optimizer_step(o, h, &t, 1, flat(skipped.data(), dtype::int64, 1), {});
    }
    if (three)
      EXPECT_EQ(ns, 3);
    EXPECT_EQ(skipped[0], 0) << kernels::optimizer_name(o) << (three ? " three states" : "");
    EXPECT_LT(loss(), 0.5 * l0) << kernels::optimizer_name(o) << (three ? " three states" : "");
  }
}

// LARS with the trust ratio off is torch's SGD (the same operations, the gradient times 1), bit
// for bit; LAMB's update of each tensor is lr min(r, max_trust_ratio) u, so its norm is the
// parameter's norm times lr where the clamp does not bite (the trust ratio's purpose).
TEST(optim_twin, lars_without_adaptation_is_sgd_and_lamb_steps_scale_with_the_parameter_norm) {
  test::check_property("optim_twin.lars_is_sgd", 30, [] {
    std::mt19937_64 r(*rc::gen::arbitrary<std::uint64_t>());
    kernels::optim_hparams h = random_hparams(optimizer::lars, r);
    h.adapt = false;
    const int ns = kernels::optimizer_states(optimizer::lars, h);
    kernels::optim_config cfg;
    host_tensor x = make_tensor(r, static_cast<std::int64_t>(r() % 3000), r() % 2 == 0, ns,
                                cfg.block, true, false);
    host_tensor y = x;
    const kernels::optim_tensor tx = views_of(x, ns), ty = views_of(y, ns);
    kernels::optimizer_step(optimizer::lars, h, &tx, 1, {}, cfg);
    kernels::optimizer_step(optimizer::sgd, h, &ty, 1, {}, cfg);
    RC_ASSERT(snapshot(x) == snapshot(y));
  });
  std::mt19937_64 r(21);
  for (const double scale : {1e-3, 1.0, 1e3}) {
    host_tensor x = make_tensor(r, 5000, false, 2, 256, true, false);
    for (auto& v : x.p)
      v = static_cast<float>(v * scale);
    std::vector<float> p0 = x.p;
    kernels::optim_hparams h;
    h.lr = 1e-2;
    h.weight_decay = 0.01;
    const kernels::optim_tensor t = views_of(x, 2);
    kernels::optimizer_step(optimizer::lamb, h, &t, 1, {});
    double dn = 0.0, pn = 0.0;
    for (std::int64_t i = 0; i < x.n; ++i) {
      dn += (double(x.p[i]) - p0[i]) * (double(x.p[i]) - p0[i]);
      pn += double(p0[i]) * p0[i];
    }
    // ||delta p|| = lr ||p|| within the rounding of the step (each element's update to a few u,
    // the parameter's rounding below 2^-24 of |p| against the update's lr |p|-sized norm).
    EXPECT_NEAR(std::sqrt(dn) / std::sqrt(pn), h.lr, 1e-3 * h.lr) << "scale " << scale;
  }
}

// ---- argument checks ----------------------------------------------------------------------------

template <class Fn> std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(optim_api, refuses_bad_arguments_naming_them) {
  std::mt19937_64 r(3);
  host_tensor x = make_tensor(r, 300, true, 2, 256, true, false);
  const kernels::optim_hparams h;
  const auto run = [&](kernels::optim_tensor t, kernels::optim_hparams hh = {},
                       kernels::optim_config cfg = {}, optimizer o = optimizer::adamw) {
    return message_of([&] { kernels::optimizer_step(o, hh, &t, 1, {}, cfg); });
  };
  const bytes_of before = snapshot(x);
  kernels::optim_tensor t = views_of(x, 2);
  auto bad = t;
  bad.grad.type = dtype::float16;
  EXPECT_NE(run(bad).find("tensors[0].grad"), std::string::npos) << run(bad);
  bad = t;
  bad.param.type = dtype::int8;
  EXPECT_NE(run(bad).find("tensors[0].param"), std::string::npos);
  bad = t;
  bad.absmax1.shape[0] = 1;
  EXPECT_NE(run(bad).find("tensors[0].absmax1"), std::string::npos) << run(bad);
  bad = t;
  bad.state2 = {};
  bad.absmax2 = {};
  EXPECT_NE(run(bad).find("tensors[0].state2"), std::string::npos) << run(bad);
  bad = t;
  bad.grad.shape[0] = 299;
  EXPECT_NE(run(bad).find("grad"), std::string::npos);
  bad = t;
  bad.state1.strides[0] = 2;
  EXPECT_NE(run(bad).find("tensors[0].state1"), std::string::npos);
  kernels::optim_hparams hh;
  hh.lr = std::nan("");
  EXPECT_NE(run(t, hh).find("lr"), std::string::npos);
  hh = {};
  hh.beta1 = 1.0;
  EXPECT_NE(run(t, hh).find("beta1"), std::string::npos);
  hh = {};
  hh.step = 0;
  EXPECT_NE(run(t, hh).find("step"), std::string::npos);
  kernels::optim_config cfg;
  cfg.block = 512;
  EXPECT_NE(run(t, {}, cfg).find("block = 512"), std::string::npos);
  // Plain SGD keeps no state: states handed in are refused.
  EXPECT_NE(run(t, {}, {}, optimizer::sgd).find("state1"), std::string::npos);
  hh = {};
  hh.momentum = 0.9;
  hh.nesterov = true;
  hh.dampening = 0.5;
  EXPECT_NE(run(views_of(x, 1), hh, {}, optimizer::sgd).find("nesterov"), std::string::npos);
  hh = {};
  hh.max_trust_ratio = 0.0;
  EXPECT_NE(run(t, hh, {}, optimizer::lamb).find("max_trust_ratio"), std::string::npos);
  hh.max_trust_ratio = std::nan("");
  EXPECT_NE(run(t, hh, {}, optimizer::lamb).find("max_trust_ratio"), std::string::npos);
  hh = {};
  hh.trust_coefficient = -1.0;
  EXPECT_NE(run(views_of(x, 0), hh, {}, optimizer::lars).find("trust_coefficient"),
            std::string::npos);
  hh = {};
  hh.beta2 = 1.5;
  EXPECT_NE(run(t, hh, {}, optimizer::lamb).find("beta2"), std::string::npos);
  hh = {};
  hh.momentum = 1.0;
  EXPECT_NE(run(views_of(x, 1), hh, {}, optimizer::lars).find("momentum"), std::string::npos);
  // The third state: amsgrad only for adam and adamw; state3 and absmax3 checked like the others,
  // and refused where the optimizer keeps two.
  hh = {};
  hh.amsgrad = true;
  EXPECT_NE(run(t, hh, {}, optimizer::lamb).find("amsgrad"), std::string::npos);
  EXPECT_NE(run(t, hh, {}, optimizer::stable_adamw).find("amsgrad"), std::string::npos);
  EXPECT_NE(run(t, hh, {}, optimizer::adam).find("tensors[0].state3"), std::string::npos)
      << run(t, hh, {}, optimizer::adam);
  host_tensor x3 = make_tensor(r, 300, true, 3, 256, true, false);
  const bytes_of before3 = snapshot(x3);
  const kernels::optim_tensor t3 = views_of(x3, 3);
  EXPECT_NE(run(t3).find("tensors[0].state3"), std::string::npos) << run(t3); // adamw, 2 states
  bad = t3;
  bad.absmax3.shape[0] = 1;
  EXPECT_NE(run(bad, hh).find("tensors[0].absmax3"), std::string::npos) << run(bad, hh);
  bad = t3;
  bad.state3 = flat(x.p.data(), dtype::float32, 300);
  bad.absmax3 = {};
  EXPECT_NE(run(bad, hh).find("tensors[0].state3"), std::string::npos) << run(bad, hh);
  EXPECT_TRUE(snapshot(x3) == before3);
  EXPECT_EQ(run(t3, hh), "(no error)");
  EXPECT_TRUE(snapshot(x) == before); // nothing written by a refused call
  std::vector<std::int64_t> sk(2, 0);
  EXPECT_NE(message_of([&] {
              kernels::optimizer_step(optimizer::adamw, h, &t, 1, flat(sk.data(), dtype::int64, 2));
            }).find("skipped"),
            std::string::npos);
}

TEST(optim_api, empty_tensors_and_empty_calls_are_fine) {
  host_tensor x;
  const kernels::optim_tensor t = views_of(x, 0);
  EXPECT_NO_THROW(kernels::optimizer_step(optimizer::sgd, {}, &t, 1, {}));
  EXPECT_NO_THROW(kernels::optimizer_step(optimizer::adamw, {}, nullptr, 0, {}));
}

} // namespace
