// The reference optimizer step: each optimizer's equations in 50 significant digits
// (Boost.Multiprecision's cpp_bin_float_50), then the nearest codebook entry of the exact states.
#include <lowbit/reference/optim.hpp>

#include <boost/multiprecision/cpp_bin_float.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace lowbit::reference {

namespace {

using hp = boost::multiprecision::cpp_bin_float_50;

hp sign_of(const hp& x) {
  return x > 0 ? hp(1) : (x < 0 ? hp(-1) : hp(0));
}

} // namespace

optim_exact optimizer_step_exact(optim_rule rule, const optim_settings& h, const optim_values& x) {
  const std::size_t n = x.p.size();
  if (x.g.size() != n)
    throw std::invalid_argument("optimizer_step_exact: g and p differ in size");
  const bool two = rule == optim_rule::adam || rule == optim_rule::adamw ||
                   rule == optim_rule::stable_adamw || rule == optim_rule::lamb ||
                   (rule == optim_rule::rmsprop && (h.momentum != 0.0 || h.centered));
  const bool one =
      !two && !((rule == optim_rule::sgd || rule == optim_rule::lars) && h.momentum == 0.0);
  const bool three = ((rule == optim_rule::adam || rule == optim_rule::adamw) && h.amsgrad) ||
                     (rule == optim_rule::rmsprop && h.momentum != 0.0 && h.centered);
  if ((one || two) && x.s1.size() != n)
    throw std::invalid_argument("optimizer_step_exact: s1 and p differ in size");
  if (two && x.s2.size() != n)
    throw std::invalid_argument("optimizer_step_exact: s2 and p differ in size");
  if (three && x.s3.size() != n)
    throw std::invalid_argument("optimizer_step_exact: s3 and p differ in size");
  const hp lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  const hp t = static_cast<double>(h.step);
  optim_exact r;
  r.p.resize(n);
  if (one || two)
    r.s1.resize(n);
  if (two)
    r.s2.resize(n);
  if (three)
    r.s3.resize(n);
  const auto g_of = [&](std::size_t i) { return h.maximize ? -hp(x.g[i]) : hp(x.g[i]); };
  // StableAdamW: the new second moments first, for the RMS.
  hp bh1 = 0, bh2 = 0, eta = lr;
  std::vector<hp> vnew;
  if (rule == optim_rule::stable_adamw) {
    bh1 = b1 * (1 - pow(b1, t - 1)) / (1 - pow(b1, t));
    bh2 = b2 * (1 - pow(b2, t - 1)) / (1 - pow(b2, t));
    hp sum = 0;
    vnew.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const hp g = g_of(i);
      vnew[i] = bh2 * hp(x.s2[i]) + (1 - bh2) * g * g;
      sum += g * g / std::max(vnew[i], hp(eps * eps));
    }
    const hp rms = n > 0 ? hp(sqrt(sum / hp(static_cast<double>(n)))) : hp(0);
    r.rms = static_cast<double>(rms);
    eta = lr / std::max(hp(1), rms);
  }
  // LAMB: the new moments and the direction u first, for ||u||; LARS: the norms.
  std::vector<hp> mnew, unew;
  hp ratio = 1;
  if (rule == optim_rule::lamb || rule == optim_rule::lars) {
    hp sp = 0, sq = 0;
    if (rule == optim_rule::lamb) {
      const hp c1 = h.bias_correction ? 1 - pow(b1, t) : hp(1);
      const hp c2 = h.bias_correction ? 1 - pow(b2, t) : hp(1);
      mnew.resize(n);
      vnew.resize(n);
      unew.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        const hp g = g_of(i), p = x.p[i];
        mnew[i] = b1 * hp(x.s1[i]) + (1 - b1) * g;
        vnew[i] = b2 * hp(x.s2[i]) + (1 - b2) * g * g;
        unew[i] = (mnew[i] / c1) / (sqrt(vnew[i] / c2) + eps) + wd * p;
        sp += p * p;
        sq += unew[i] * unew[i];
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        sp += hp(x.p[i]) * hp(x.p[i]);
        sq += hp(x.g[i]) * hp(x.g[i]);
      }
    }
    const hp pn = sqrt(sp), qn = sqrt(sq);
    r.norm_p = static_cast<double>(pn);
    r.norm_q = static_cast<double>(qn);
    if (h.adapt && pn > 0 && qn > 0) {
      ratio = rule == optim_rule::lamb ? hp(pn / qn)
                                       : hp(hp(h.trust_coefficient) * pn / (qn + wd * pn + eps));
      if (ratio > hp(h.max_trust_ratio))
        ratio = h.max_trust_ratio;
    }
    r.ratio = static_cast<double>(ratio);
  }
  for (std::size_t i = 0; i < n; ++i) {
    hp p = x.p[i], g = g_of(i);
    switch (rule) {
    case optim_rule::adam:
    case optim_rule::adamw: {
      if (rule == optim_rule::adamw)
        p = p * (1 - lr * wd);
      else
        g = g + wd * p;
      const hp m = b1 * hp(x.s1[i]) + (1 - b1) * g;
      const hp v = b2 * hp(x.s2[i]) + (1 - b2) * g * g;
      const hp vmax = h.amsgrad ? std::max(hp(x.s3[i]), v) : v;
      p = p - lr / (1 - pow(b1, t)) * m / (sqrt(vmax) / sqrt(1 - pow(b2, t)) + eps);
      r.s1[i] = static_cast<double>(m);
      r.s2[i] = static_cast<double>(v);
      if (h.amsgrad)
        r.s3[i] = static_cast<double>(vmax);
      break;
    }
    case optim_rule::stable_adamw: {
      const hp u = bh1 * hp(x.s1[i]) + (1 - bh1) * g;
      p = p * (1 - eta * wd) - eta * u / (sqrt(vnew[i]) + eps);
      r.s1[i] = static_cast<double>(u);
      r.s2[i] = static_cast<double>(vnew[i]);
      break;
    }
    case optim_rule::sgd: {
      g = g + wd * p;
      if (h.momentum != 0.0) {
        const hp mom = h.momentum;
        const hp buf = h.step == 1 ? g : mom * hp(x.s1[i]) + (1 - hp(h.dampening)) * g;
        g = h.nesterov ? g + mom * buf : buf;
        r.s1[i] = static_cast<double>(buf);
      }
      p = p - lr * g;
      break;
    }
    case optim_rule::lion: {
      p = p * (1 - lr * wd);
      const hp m = x.s1[i];
      p = p - lr * sign_of(b1 * m + (1 - b1) * g);
      r.s1[i] = static_cast<double>(b2 * m + (1 - b2) * g);
      break;
    }
    case optim_rule::rmsprop: {
      g = g + wd * p;
      const hp v = b2 * hp(x.s1[i]) + (1 - b2) * g * g;
      r.s1[i] = static_cast<double>(v);
      hp var = v;
      if (h.centered) {
        const hp s = b2 * hp((three ? x.s3 : x.s2)[i]) + (1 - b2) * g;
        var = v - s * s;
        if (var < 0)
          var = 0;
        (three ? r.s3 : r.s2)[i] = static_cast<double>(s);
      }
      const hp d = sqrt(var) + eps;
      if (h.momentum != 0.0) {
        const hp buf = hp(h.momentum) * hp(x.s2[i]) + g / d;
        r.s2[i] = static_cast<double>(buf);
        p = p - lr * buf;
      } else {
        p = p - lr * g / d;
      }
      break;
    }
    case optim_rule::adagrad: {
      g = g + wd * p;
      const hp s = hp(x.s1[i]) + g * g;
      p = p - lr / (1 + (t - 1) * hp(h.lr_decay)) * g / (sqrt(s) + eps);
      r.s1[i] = static_cast<double>(s);
      break;
    }
    case optim_rule::lamb:
      p = p - lr * ratio * unew[i];
      r.s1[i] = static_cast<double>(mnew[i]);
      r.s2[i] = static_cast<double>(vnew[i]);
      break;
    case optim_rule::lars: {
      g = (g + wd * p) * ratio;
      if (h.momentum != 0.0) {
        const hp mom = h.momentum;
        const hp buf = h.step == 1 ? g : mom * hp(x.s1[i]) + (1 - hp(h.dampening)) * g;
        g = h.nesterov ? g + mom * buf : buf;
        r.s1[i] = static_cast<double>(buf);
      }
      p = p - lr * g;
      break;
    }
    }
    r.p[i] = static_cast<double>(p);
  }
  return r;
}

quantized_state quantize_state(const std::vector<double>& s, std::int64_t block,
                               const codebook_values& cb, bool with_codes) {
  if (block < 1)
    throw std::invalid_argument("quantize_state: block must be >= 1");
  const exact_codebook ecb(cb);
  const auto n = static_cast<std::int64_t>(s.size());
  quantized_state q;
  if (with_codes)
    q.codes.resize(s.size());
  q.y.resize(s.size());
  for (std::int64_t b0 = 0; b0 < n; b0 += block) {
    const std::int64_t b1 = std::min(n, b0 + block);
    double a = 0.0;
    for (std::int64_t i = b0; i < b1; ++i)
      a = std::max(a, std::fabs(s[static_cast<std::size_t>(i)]));
    q.absmax.push_back(a);
    for (std::int64_t i = b0; i < b1; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const hp y = a == 0.0 ? hp(s[k]) : hp(s[k]) / hp(a);
      q.y[k] = static_cast<double>(y);
      if (with_codes)
        q.codes[k] = nearest_entry(ecb, exact(q.y[k]));
    }
  }
  return q;
}

} // namespace lowbit::reference
