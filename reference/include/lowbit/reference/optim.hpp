// Reference of one optimizer step (docs/techniques/optimizers.md): the update equations of each
// optimizer evaluated in 50 significant digits on the given parameter, gradient and (dequantized)
// states, and the block-wise quantization of the exact new states (absmax per block, the nearest
// entry of a codebook by exact comparison). Plain C++ over Boost.Multiprecision; shares nothing
// with the kernels it checks.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include <lowbit/reference/blockwise.hpp>

namespace lowbit::reference {

enum class optim_rule { adam, adamw, stable_adamw, sgd, lion, rmsprop, adagrad, lamb, lars };

// The hyper-parameters as the caller gave them (doubles, used exactly).
struct optim_settings {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  bool centered = false; // rmsprop
  bool amsgrad = false;  // adam, adamw
  double lr_decay = 0.0;
  bool maximize = false;
  std::int64_t step = 1;
  double max_trust_ratio = std::numeric_limits<double>::infinity(); // lamb, lars
  double trust_coefficient = 1e-3;                                  // lars
  bool adapt = true;                                                // lamb, lars
  bool bias_correction = true;                                      // lamb
};

// One tensor's values before the step (finite): s1, s2, s3 the states' values (dequantized for
// 8-bit states), empty where the optimizer keeps fewer.
struct optim_values {
  std::vector<double> p, g, s1, s2, s3;
};

// The step's results, each the 50-digit value rounded once to double. rms: StableAdamW's
// sqrt(mean(g^2 / max(v_t, eps^2))) over the whole tensor. LAMB: norm_p = ||p||, norm_q = ||u||;
// LARS: norm_p = ||p||, norm_q = ||g||; ratio: their trust ratio after the clamp (1 when off).
struct optim_exact {
  std::vector<double> p, s1, s2, s3;
  double rms = 0.0;
  double norm_p = 0.0, norm_q = 0.0, ratio = 1.0;
};

// Equations (t = step, every optimizer's g negated first under maximize):
//   adam:  g += wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//          p -= lr/(1-b1^t) m / (sqrt(v)/sqrt(1-b2^t) + eps); amsgrad (s3 the running maximum
//          vmax of v): vmax = max(vmax, v), and vmax in v's place in the step
//   adamw: p *= 1 - lr wd, then adam without the L2 term
//   stable_adamw: bh_i = b_i (1 - b_i^(t-1)) / (1 - b_i^t); u = bh1 u + (1-bh1) g;
//          v = bh2 v + (1-bh2) g^2; eta = lr / max(1, rms); p = p (1 - eta wd) - eta
//          u/(sqrt(v)+eps)
//   sgd:   g += wd p; buf = g (t = 1) or mom buf + (1-damp) g; g = g + mom buf (nesterov) or buf;
//          p -= lr g (no state without momentum)
//   lion:  p *= 1 - lr wd; p -= lr sign(b1 m + (1-b1) g); m = b2 m + (1-b2) g
//   rmsprop: g += wd p; v = a v + (1-a) g^2 (a = beta2, s1 v); d = sqrt(v) + eps, or centered
//          (the gradient's average s = a s + (1-a) g: s2, or s3 with momentum too)
//          d = sqrt(max(v - s^2, 0)) + eps; with momentum (s2 the buffer) buf = mom buf + g / d,
//          p -= lr buf, else p -= lr g / d
//   adagrad: g += wd p; s += g^2; p -= lr/(1 + (t-1) lr_decay) g / (sqrt(s) + eps)
//   lamb:  m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = (m/c1) / (sqrt(v/c2) + eps) + wd p
//          (c1 = 1-b1^t, c2 = 1-b2^t with bias correction, else 1); r = ||p|| / ||u|| (1 where
//          either is 0 or adapt is off), r = min(r, max_trust_ratio); p -= lr r u
//   lars:  r = tc ||p|| / (||g|| + wd ||p|| + eps) (1 where either norm is 0 or adapt is off),
//          r = min(r, max_trust_ratio); d = (g + wd p) r; buf = d (t = 1) or mom buf
//          + (1-damp) d; d = d + mom buf (nesterov) or buf; p -= lr d (no state without momentum)
optim_exact optimizer_step_exact(optim_rule rule, const optim_settings& h, const optim_values& x);

// Block-wise quantization of exact state values s: absmax[b] = max |s| over block b, y[i] =
// s[i] / absmax (s[i] itself in an all-zero block), codes[i] = nearest_entry(cb, y[i]) (y taken
// as the double nearest to it); with_codes = false leaves codes empty (the exact search compares
// with all 256 entries as rationals, which dominates the cost).
struct quantized_state {
  std::vector<int> codes;
  std::vector<double> absmax, y;
};
quantized_state quantize_state(const std::vector<double>& s, std::int64_t block,
                               const codebook_values& cb, bool with_codes = true);

} // namespace lowbit::reference
