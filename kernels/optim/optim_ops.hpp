// Per-element updates of the optimizer steps, shared by the CPU twin and the CUDA kernel: each is
// a function of (parameter as float, gradient as float, the states as float, the step's
// coefficients) that returns the new parameter and states. How the parameter and the states are
// loaded and stored (fp32/bf16/fp16 parameters, 32-bit or 8-bit block-wise states, a residual
// master weight) is the caller's business, so another load/store can wrap the same update.
//
// Every update is a fixed sequence of float32 operations, written out one rounding at a time
// (the library is built with -ffp-contract=off and nvcc --fmad=false, so nothing is fused). The
// sequences follow torch.optim's single-tensor paths where an optimizer exists there, so the
// 32-bit variants stay within a few ulps of torch's.
//
// An update with a third state (adam's amsgrad, rmsprop with momentum and centered) is the same
// function's form for a compile-time flag, returning result3: the one- and two-state forms return
// result and compile to what they were before the third state existed (the CUDA kernel is tuned
// on them; a fourth float in their result alone moves its register allocation).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <lowbit/emu/config.hpp>

#include "../common/element_ops.hpp"

namespace lowbit::kernels::optim_ops {

// The coefficients of one step, computed once per call on the host (in double, each rounded
// once to float32; optim.cpp) and read by every element. The names say what each multiplies.
struct coeffs {
  float lr = 0.0f;       // adam, adamw: lr sqrt(1 - beta2^t) / (1 - beta1^t); sgd, lion, rmsprop,
                         // lars, stable_adamw, lamb: lr; adagrad: lr / (1 + (t - 1) lr_decay)
  float decay = 1.0f;    // decoupled weight decay factor 1 - lr wd (adamw, lion)
  float wd = 0.0f;       // L2 weight decay added to the gradient (adam, sgd, rmsprop, adagrad,
                         // lars) or to the update direction (lamb)
  float beta1 = 0.0f;    // adam, lion, lamb: beta1; stable: debiased beta1-hat; sgd, lars,
                         // rmsprop: momentum
  float one_m_b1 = 0.0f; // 1 - beta1 (adam family, lion, lamb); sgd, lars: 1 - dampening
  float beta2 = 0.0f;    // adam, rmsprop (alpha), lamb; stable: beta2-hat; lion: beta2
  float one_m_b2 = 0.0f; // 1 - beta2
  float bc = 1.0f;       // lamb: sqrt(1 - beta2^t) / (1 - beta1^t) (1 without bias correction)
  float eps = 0.0f;      // added to the denominator; adam, adamw and lamb with bias correction:
                         // eps sqrt(1 - beta2^t) (the bias corrections folded into lr, bc)
  float eps2 = 0.0f;     // stable_adamw: eps^2, the floor of v in the RMS term
  bool first = false;    // sgd, lars: the first step copies the gradient into the momentum
  bool nesterov = false; // sgd, lars
  bool centered = false; // rmsprop with two states: the second is the gradient's average, not a
                         // momentum buffer
  bool maximize = false; // every optimizer: ascend instead of descend
};

// The new values of one element: the parameter and up to two states; result3 with the third.
struct result {
  float p, s1, s2;
};
struct result3 {
  float p, s1, s2, s3;
};
template <bool S3> using result_t = std::conditional_t<S3, result3, result>;

using element_ops::sqrt_rn;

// torch.lerp(m, g, w) for w < 0.5: m + w (g - m).
LOWBIT_HD LOWBIT_INLINE float lerp(float m, float g, float w) {
  return m + w * (g - m);
}

// Adam (L2 weight decay through the gradient) and AdamW (decoupled: the parameter scaled by
// 1 - lr wd first). The moments as torch's: m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, 1 - b2).
// torch's step p -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps) with both bias
// corrections folded into the coefficients (Kingma and Ba's "more efficient" order, section 2):
// p += (-lr') m / (sqrt(v) + eps') with lr' = lr sqrt(1 - b2^t) / (1 - b1^t) and
// eps' = eps sqrt(1 - b2^t), the same value with one division less per element.
//
// Amsgrad (Reddi, Kale, Kumar 2018; torch's amsgrad=True) keeps the third state vmax: after v,
// vmax = max(vmax, v) (torch.maximum, exact), and the denominator takes vmax in v's place:
// p += (-lr') m / (sqrt(vmax) + eps'), torch's lr / (1 - b1^t) m / (sqrt(vmax) / sqrt(1 - b2^t)
// + eps) folded as above, so it stays within the plain step's few ulps of torch's. Where v is NaN
// the maximum keeps vmax (torch's would be NaN); such a block writes nothing either way.
template <bool Amsgrad>
LOWBIT_HD LOWBIT_INLINE result_t<Amsgrad> adam(const coeffs& c, bool decoupled, float p, float g,
                                               float m, float v, [[maybe_unused]] float vmax) {
  if (c.maximize)
    g = -g;
  if (decoupled)
    p = p * c.decay;
  else
    g = g + c.wd * p;
  m = lerp(m, g, c.one_m_b1);
  v = v * c.beta2 + c.one_m_b2 * g * g;
  if constexpr (Amsgrad) {
    vmax = v > vmax ? v : vmax;
    p = p + -c.lr * m / (sqrt_rn(vmax) + c.eps);
    return {p, m, v, vmax};
  } else {
    p = p + -c.lr * m / (sqrt_rn(v) + c.eps);
    return {p, m, v};
  }
}

// StableAdamW (Wortsman et al. 2023, Algorithm 2), the moments with the debiased betas
// beta-hat = beta (1 - beta^(t-1)) / (1 - beta^t): first the new second moment, which the RMS
// term needs before any parameter is written.
LOWBIT_HD LOWBIT_INLINE float stable_v(const coeffs& c, float g, float v) {
  return c.beta2 * v + c.one_m_b2 * g * g;
}
// The element's share of the update-clipping RMS: g^2 / max(v_t, eps^2).
LOWBIT_HD LOWBIT_INLINE float stable_rms_term(const coeffs& c, float g, float v_new) {
  return g * g / (v_new > c.eps2 ? v_new : c.eps2);
}
// The step with eta = lr / max(1, RMS) and decay = 1 - eta wd (per tensor, from the reduction):
// p = p decay - eta u / (sqrt(v) + eps).
LOWBIT_HD LOWBIT_INLINE result stable_adamw(const coeffs& c, float eta, float decay, float p,
                                            float g, float u, float v) {
  if (c.maximize)
    g = -g;
  u = c.beta1 * u + c.one_m_b1 * g;
  v = stable_v(c, g, v);
  p = p * decay;
  p = p - eta * u / (sqrt_rn(v) + c.eps);
  return {p, u, v};
}

// SGD with momentum (torch): g += wd p; buf = g on the first step, else buf mom + (1 - damp) g;
// Nesterov: g + mom buf, else buf; p -= lr g. Without momentum there is no state (s1 stays).
LOWBIT_HD LOWBIT_INLINE result sgd(const coeffs& c, bool has_momentum, float p, float g,
                                   float buf) {
  if (c.maximize)
    g = -g;
  g = g + c.wd * p;
  if (has_momentum) {
    buf = c.first ? g : buf * c.beta1 + c.one_m_b1 * g;
    g = c.nesterov ? g + c.beta1 * buf : buf;
  }
  p = p + -c.lr * g;
  return {p, buf, 0.0f};
}

LOWBIT_HD LOWBIT_INLINE float sign_of(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
}

// Lion (Chen et al. 2023): p = p (1 - lr wd) - lr sign(b1 m + (1 - b1) g);
// m = b2 m + (1 - b2) g.
LOWBIT_HD LOWBIT_INLINE result lion(const coeffs& c, float p, float g, float m) {
  if (c.maximize)
    g = -g;
  p = p * c.decay;
  const float u = c.beta1 * m + c.one_m_b1 * g;
  p = p + -c.lr * sign_of(u);
  m = c.beta2 * m + c.one_m_b2 * g;
  return {p, m, 0.0f};
}

// RMSprop (torch): g += wd p; v = v alpha + (1 - alpha) g g; the denominator d = sqrt(v) + eps,
// or centered (the gradient's average s.lerp_(g, 1 - alpha)) d = sqrt(max(v - s s, 0)) + eps;
// with momentum buf = buf mom + g / d and p -= lr buf, else p -= lr g / d. The clamp at 0 departs
// from torch only where torch's sqrt would see a negative variance (rounding, or two 8-bit states
// quantized apart) and return NaN. The states: v, then with `second` s2, the gradient's average
// where c.centered, else the momentum buffer. Both (the form Both, torch's full sequence; `second`
// and c.centered then say nothing): v, the momentum buffer s2 and the gradient's average s3.
template <bool Both>
LOWBIT_HD LOWBIT_INLINE result_t<Both> rmsprop(const coeffs& c, bool second, float p, float g,
                                               float v, float s2, [[maybe_unused]] float s3) {
  if (c.maximize)
    g = -g;
  g = g + c.wd * p;
  v = v * c.beta2 + c.one_m_b2 * g * g;
  if constexpr (Both) {
    s3 = lerp(s3, g, c.one_m_b2);
    float var = v - s3 * s3;
    var = var > 0.0f ? var : 0.0f;
    const float d = sqrt_rn(var) + c.eps;
    s2 = s2 * c.beta1 + g / d;
    p = p + -c.lr * s2;
    return {p, v, s2, s3};
  } else {
    if (!second) {
      p = p + -c.lr * g / (sqrt_rn(v) + c.eps);
      return {p, v, 0.0f};
    }
    float var = v;
    if (c.centered) {
      s2 = lerp(s2, g, c.one_m_b2);
      var = v - s2 * s2;
      var = var > 0.0f ? var : 0.0f;
    }
    const float d = sqrt_rn(var) + c.eps;
    if (c.centered) {
      p = p + -c.lr * g / d;
      return {p, v, s2};
    }
    s2 = s2 * c.beta1 + g / d;
    p = p + -c.lr * s2;
    return {p, v, s2};
  }
}

// Adagrad (torch): g += wd p; s += g g; p -= clr g / (sqrt(s) + eps).
LOWBIT_HD LOWBIT_INLINE result adagrad(const coeffs& c, float p, float g, float s) {
  if (c.maximize)
    g = -g;
  g = g + c.wd * p;
  s = s + 1.0f * g * g;
  p = p + -c.lr * g / (sqrt_rn(s) + c.eps);
  return {p, s, 0.0f};
}

// LAMB (You et al. 2020, Algorithm 2, with the AdamW direction): m = b1 m + (1 - b1) g;
// v = b2 v + (1 - b2) g g; u = (m / (1 - b1^t)) / (sqrt(v) / sqrt(1 - b2^t) + eps) + wd p,
// evaluated as (m bc) / (sqrt(v) + eps') + wd p with the bias corrections folded into bc and
// eps' as in adam above. The
// per-tensor pre-pass needs u of every element (for ||u||) before any parameter is written, so
// the direction is its own function, evaluated identically there and in the step; the states
// are written only by the step.
struct lamb_direction_t {
  float u, m, v;
};
LOWBIT_HD LOWBIT_INLINE lamb_direction_t lamb_direction(const coeffs& c, float p, float g, float m,
                                                        float v) {
  if (c.maximize)
    g = -g;
  m = c.beta1 * m + c.one_m_b1 * g;
  v = c.beta2 * v + c.one_m_b2 * g * g;
  const float u = m * c.bc / (sqrt_rn(v) + c.eps) + c.wd * p;
  return {u, m, v};
}
// The step with eta = lr min(||p|| / ||u||, max_trust_ratio) (per tensor, from the pre-pass; lr
// where the trust ratio is off): p = p - eta u.
LOWBIT_HD LOWBIT_INLINE result lamb(const coeffs& c, float eta, float p, float g, float m,
                                    float v) {
  const lamb_direction_t d = lamb_direction(c, p, g, m, v);
  p = p + -eta * d.u;
  return {p, d.m, d.v};
}

// LARS (You, Gitman, Ginsburg 2017) with SGD momentum as torch's SGD: the gradient with its
// weight decay scaled by the tensor's local learning rate ratio = min(tc ||p|| / (||g|| + wd ||p||
// + eps), max_trust_ratio) (from the pre-pass; 1 where the trust ratio is off):
// g = (g + wd p) ratio; buf = g on the first step, else buf mom + (1 - damp) g; Nesterov:
// g + mom buf, else buf; p -= lr g.
LOWBIT_HD LOWBIT_INLINE result lars(const coeffs& c, bool has_momentum, float ratio, float p,
                                    float g, float buf) {
  if (c.maximize)
    g = -g;
  g = (g + c.wd * p) * ratio;
  if (has_momentum) {
    buf = c.first ? g : buf * c.beta1 + c.one_m_b1 * g;
    g = c.nesterov ? g + c.beta1 * buf : buf;
  }
  p = p + -c.lr * g;
  return {p, buf, 0.0f};
}

LOWBIT_HD LOWBIT_INLINE bool finite(float x) {
  return (emu::detail::bit_cast<std::uint32_t>(x) & 0x7F800000u) != 0x7F800000u;
}

} // namespace lowbit::kernels::optim_ops
