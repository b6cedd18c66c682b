// The element-wise activations whose backward passes read Mesa's 8-bit saved inputs (GELU, its
// tanh form, SiLU, ReLU): their values and derivatives in float32 operations only, one rounding
// each, so that the CPU twin and the CUDA kernel of actquant_activation_backward give the same
// bits (the libraries' expf / erff / tanhf differ between processors). Their accuracy against
// the exact functions is measured in proptests/src/test_actquant.cpp and stated in
// docs/techniques/mesa.md; the formulas follow torch's (aten's GeluKernel, SiLU, threshold
// backward), so the results lie within those few float32 ulps of torch's on the same input.
//
// The polynomial coefficients were fitted for this file (least squares in relative error at
// Chebyshev nodes, 40-digit arithmetic), each on the interval its comment names.
#pragma once

#include <cstdint>

#include <lowbit/kernels/actquant.hpp>

#include "actquant_ops.hpp"

namespace lowbit::kernels::activation_ops {

using actquant_ops::div_rn;
using emu::detail::bit_cast;

using activation = actquant_activation;

LOWBIT_HD LOWBIT_INLINE float abs_f(float x) {
  return bit_cast<float>(bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu);
}
LOWBIT_HD LOWBIT_INLINE float copysign_f(float mag, float sign) {
  return bit_cast<float>((bit_cast<std::uint32_t>(mag) & 0x7FFFFFFFu) |
                         (bit_cast<std::uint32_t>(sign) & 0x80000000u));
}
// 2^k as a float, -126 <= k <= 127.
LOWBIT_HD LOWBIT_INLINE float pow2(int k) {
  return bit_cast<float>(static_cast<std::uint32_t>(k + 127) << 23);
}

// The polynomial with coefficients c_n, ..., c_0 (highest first) at x by Horner's rule: p = c_n,
// then p = p x + c_k for k = n - 1 down to 0, each operation rounded once.
LOWBIT_HD LOWBIT_INLINE constexpr float horner(float, float c) {
  return c;
}
template <class... C>
LOWBIT_HD LOWBIT_INLINE constexpr float horner(float x, float top, float next, C... rest) {
  return horner(x, top * x + next, rest...);
}

// exp(x): x = k ln2 + r with k = rint(x log2(e)) and |r| <= 0.35 (ln2 in two parts, the first
// with 15 significant bits, so that k times it is exact), exp(r) by its Taylor polynomial of
// degree 7 (truncation below 6e-9 relative), then the factor 2^k (in two steps below 2^-126).
LOWBIT_HD LOWBIT_INLINE float exp_f(float x) {
  if (!(x == x))
    return x;
  if (x > 88.7228394f)
    return bit_cast<float>(0x7F800000u);
  if (x < -104.0f)
    return 0.0f;
  constexpr float magic = 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
  const float k = (x * 1.44269502f + magic) - magic;
  float r = x - k * 0.693145751953125f;
  r = r - k * 1.42860677e-06f;
  // 1/7!, 1/6!, ..., 1/1!, 1/0!
  float p = horner(r, 1.98412698e-04f, 1.38888889e-03f, 8.33333333e-03f, 4.16666667e-02f,
                   1.66666667e-01f, 0.5f, 1.0f, 1.0f);
  int ki = static_cast<int>(k);
  if (ki > 127) {
    p = p * 2.0f;
    ki -= 1;
  }
  if (ki < -126) {
    p = p * 5.42101086e-20f; // 2^-64, exact
    ki += 64;
  }
  return p * pow2(ki);
}

// exp(-x^2 / 2) with x = h + l, h the leading 12 significant bits of x: h^2 is exact, so the
// exponent -h^2 / 2 - l (x + h) / 2 carries the rounding of the small second part only (exp of
// the rounded -x^2 / 2 would be off by |x^2 / 2| u relative: 80 ulps at x = 13).
LOWBIT_HD LOWBIT_INLINE float exp_neg_half_square(float x) {
  // Beyond 15, exp(-112.5) is below float's smallest subnormal (and x + h would overflow near
  // float's maximum); a NaN stays.
  if (!(abs_f(x) < 15.0f))
    return x == x ? 0.0f : x;
  const float h = bit_cast<float>(bit_cast<std::uint32_t>(x) & 0xFFFFF000u);
  const float l = x - h;
  return exp_f(-0.5f * (h * h)) * exp_f(-0.5f * (l * (x + h)));
}

// The standard normal distribution function Phi(x) = (1 + erf(x / sqrt 2)) / 2, with
// z = |x| / sqrt 2: below 1 (x >= 0) or 1/2 (x < 0, where 1 - erf(z) would cancel) from
// erf(z) = z P(z^2) (P fitted on z in [0, 1]); then up to 10 from erfc(z) = exp(-x^2 / 2) Q(1 / z)
// (Q fitted on 1 / z in [1, 2], [1/4, 1] and [1/10, 1/4]) directly; beyond, 0 or 1.
LOWBIT_HD LOWBIT_INLINE float normal_cdf(float x) {
  const float z = abs_f(x) * 0.707106781f;
  if (z < (x >= 0.0f ? 1.0f : 0.5f)) {
    const float s = z * z;
    const float p =
        horner(s, -9.634991405e-06f, 1.125464083e-04f, -8.482507750e-04f, 5.220923217e-03f,
               -2.686539212e-02f, 1.128378184e-01f, -3.761263843e-01f, 1.128379167e+00f);
    const float e = z * p;
    return 0.5f * (x >= 0.0f ? 1.0f + e : 1.0f - e);
  }
  if (z < 10.0f) {
    const float t = div_rn(1.0f, z);
    float q;
    if (t > 1.0f) {
      const float u = t - 1.5f;
      q = horner(u, 2.886982104e-04f, -3.154247554e-04f, -1.921536489e-04f, 1.948780128e-03f,
                 -7.678523397e-03f, 2.425587918e-02f, -6.866266295e-02f, 1.819259307e-01f,
                 5.392844084e-01f);
    } else if (t >= 0.25f) {
      const float u = t - 0.625f;
      q = horner(u, -3.633073836e-02f, 2.599390038e-02f, 5.667907525e-03f, -2.691475705e-02f,
                 4.309277771e-02f, -4.694360912e-02f, 2.333700048e-02f, 4.376696072e-02f,
                 -1.723948815e-01f, 3.822837715e-01f, 3.059529926e-01f);
    } else {
      const float u = t - 0.175f;
      q = horner(u, -3.969489870e-01f, 3.406765939e-02f, 2.281269456e-01f, -1.801899550e-01f,
                 -1.285126254e-01f, 5.400689220e-01f, 9.728596123e-02f);
    }
    const float half_erfc = 0.5f * (exp_neg_half_square(x) * q); // erfc(z) = exp(-z^2) Q
    return x >= 0.0f ? 1.0f - half_erfc : half_erfc;
  }
  if (z >= 10.0f)
    return x > 0.0f ? 1.0f : 0.0f;
  return x; // NaN
}

// The standard normal density exp(-x^2 / 2) / sqrt(2 pi).
LOWBIT_HD LOWBIT_INLINE float normal_pdf(float x) {
  return exp_neg_half_square(x) * 0.398942280f;
}

// tanh(x): below 0.625 x T(x^2) (T fitted on x in [0, 0.625]), below 9 1 - 2 / (exp(2 |x|) + 1)
// with x's sign, beyond +-1.
LOWBIT_HD LOWBIT_INLINE float tanh_f(float x) {
  const float a = abs_f(x);
  if (a < 0.625f) {
    const float s = x * x;
    const float p =
        horner(s, 2.125637811e-03f, -8.155733859e-03f, 2.169032683e-02f, -5.394439278e-02f,
               1.333317997e-01f, -3.333332960e-01f, 9.999999999e-01f);
    return x * p;
  }
  if (a < 9.0f)
    return copysign_f(1.0f - div_rn(2.0f, exp_f(a + a) + 1.0f), x);
  if (a >= 9.0f)
    return copysign_f(1.0f, x);
  return x; // NaN
}

// The logistic function 1 / (1 + exp(-x)).
LOWBIT_HD LOWBIT_INLINE float sigmoid(float x) {
  return div_rn(1.0f, 1.0f + exp_f(-x));
}

// GELU's tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
constexpr float gelu_beta = 0.797884561f, gelu_kappa = 0.044715f;
LOWBIT_HD LOWBIT_INLINE float gelu_tanh_inner(float x) {
  const float cube = (x * x) * x;
  return gelu_beta * (x + gelu_kappa * cube);
}

// The activation's value at x.
LOWBIT_HD LOWBIT_INLINE float value(activation f, float x) {
  switch (f) {
  case activation::gelu: return x * normal_cdf(x);
  case activation::gelu_tanh: return (0.5f * x) * (1.0f + tanh_f(gelu_tanh_inner(x)));
  case activation::silu: return div_rn(x, 1.0f + exp_f(-x));
  default: return x > 0.0f ? x : (x == x ? 0.0f : x); // relu (NaN stays)
  }
}

// The activation's derivative at x, in torch's formulas: GELU Phi(x) + x phi(x); its tanh form
// 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 0.044715 x^2) with t = tanh(inner); SiLU
// s (1 + x (1 - s)) with s = sigmoid(x); ReLU 0 where x <= 0, else 1 (a NaN x too, as torch's
// threshold backward).
LOWBIT_HD LOWBIT_INLINE float derivative(activation f, float x) {
  switch (f) {
  case activation::gelu: return normal_cdf(x) + x * normal_pdf(x);
  case activation::gelu_tanh: {
    const float t = tanh_f(gelu_tanh_inner(x));
    const float left = 0.5f * x, right = 1.0f + t;
    const float left_d = 0.5f * right;
    const float inner_d = gelu_beta * (1.0f + (3.0f * gelu_kappa) * (x * x));
    const float right_d = left * ((1.0f - t * t) * inner_d);
    return left_d + right_d;
  }
  case activation::silu: {
    const float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
  }
  default: return x <= 0.0f ? 0.0f : 1.0f; // relu
  }
}

// dy times the derivative d = derivative(f, x): one product, or for ReLU dy where d = 1 and +0
// where x <= 0 (torch's threshold backward: no -0 or NaN from dy there). A function of d and dy
// alone, so that the kernels may tabulate d per code.
LOWBIT_HD LOWBIT_INLINE float gradient_of(activation f, float d, float dy) {
  if (f == activation::relu)
    return d > 0.0f ? dy : 0.0f;
  return dy * d;
}
LOWBIT_HD LOWBIT_INLINE float gradient(activation f, float x, float dy) {
  return gradient_of(f, derivative(f, x), dy);
}

} // namespace lowbit::kernels::activation_ops
