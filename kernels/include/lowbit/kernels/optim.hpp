// Fused optimizer steps with 32-bit or 8-bit block-wise states (Dettmers et al., "8-bit
// Optimizers via Block-wise Quantization", ICLR 2022; StableAdamW from Wortsman et al., NeurIPS
// 2023; LAMB from You et al., ICLR 2020; LARS from You, Gitman, Ginsburg, 2017). One call updates
// many parameter tensors of mixed sizes: each reads its parameter, gradient and states (8-bit
// states dequantized from their codes and block absmax), updates in float32, requantizes the states
// (nearest entry of the dynamic map: signed for first moments, unsigned for second moments;
// optionally stochastic) and writes the parameter, in one pass over memory (StableAdamW, LAMB and
// LARS read what their per-tensor RMS or norms need once more first). CPU twin and CUDA kernel
// agree bit for bit. Equations, state layout and the non-finite rule:
// docs/techniques/optimizers.md.
#pragma once

#include <cstdint>
#include <limits>

#include <lowbit/kernels/blockwise.hpp>
#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

enum class optimizer : std::uint8_t {
  adam,
  adamw,
  stable_adamw,
  sgd,
  lion,
  rmsprop,
  adagrad,
  lamb,
  lars
};

const char* optimizer_name(optimizer o);

// Hyper-parameters of one step (a torch param group's). `step` is the step being taken, from 1.
struct optim_hparams {
  double lr = 1e-3;
  double beta1 = 0.9;   // adam family, lion, lamb
  double beta2 = 0.999; // adam family, lion, lamb; rmsprop's alpha
  double eps = 1e-8;
  double weight_decay = 0.0; // decoupled for adamw, stable_adamw, lion; in lamb's update and
                             // lars' gradient (scaled by the trust ratio); L2 for the others
  double momentum = 0.0;     // sgd, lars, rmsprop
  double dampening = 0.0;    // sgd, lars
  bool nesterov = false;     // sgd, lars
  bool centered = false;     // rmsprop (with or without momentum)
  bool amsgrad = false;      // adam, adamw: the denominator from the running maximum of v
  double lr_decay = 0.0;     // adagrad
  // lamb, lars: the trust ratio's upper clamp (infinity: none), lars' trust coefficient, whether
  // the trust ratio is applied at all (false: 1, a plain AdamW-like / SGD step) and lamb's bias
  // correction of the moments.
  double max_trust_ratio = std::numeric_limits<double>::infinity();
  double trust_coefficient = 1e-3;
  bool adapt = true;
  bool bias_correction = true;
  bool maximize = false;
  std::int64_t step = 1;
};

// The number of state tensors an optimizer keeps: 3 for adam and adamw with amsgrad (m, v and the
// running maximum of v) and rmsprop with momentum and centered (the square average, the momentum
// buffer, the gradient's average); 2 for the other adam family members, lamb and rmsprop with
// momentum or centered; 1 for lion, plain rmsprop, adagrad and sgd or lars with momentum; 0 for
// plain sgd or lars.
int optimizer_states(optimizer o, const optim_hparams& h);
// Whether state k (0, 1 or 2) is quantized with the signed dynamic map (first moments, momentum,
// rmsprop's states 1 and 2) or the unsigned one (second moments and their maximum, sums of
// squares: rmsprop's state 0).
bool optimizer_state_signed(optimizer o, int k);

// One parameter tensor of a step. param: float32, bfloat16 or float16, contiguous; grad: the
// same dtype and shape. States: float32 with param's element count (32-bit states), or uint8
// codes with param's element count plus float32 absmax with blockwise_blocks(n, block) elements
// (8-bit states); all states of a tensor of one kind; unused ones left empty. The third state
// (state3, absmax3) only where optimizer_states is 3.
// residual (optional, present when its data is not null; bfloat16 and float16 parameters only): the
// residual master weight of residual.hpp, int16 (16 bits) or int8 (8 bits) with param's element
// count. The step then updates the float32 value rebuilt from param and residual and writes both
// back (param rounded to nearest, ties away from zero); no float32 copy exists anywhere.
struct optim_tensor {
  tensor_view param, grad;
  tensor_view state1, state2;
  tensor_view absmax1, absmax2;
  tensor_view residual;
  tensor_view state3, absmax3;
};

struct optim_config {
  std::int64_t block = 256; // 8-bit states' block length: 256 or 2048
  codebook_rounding rounding = codebook_rounding::nearest;
  // Stochastic rounding: element i of state k of tensor j draws
  // random_stream{seed, offset + S j + k}.bits(i), S = 2 streams per tensor (3 where the optimizer
  // keeps three states); callers advance offset by S * count per step.
  std::uint64_t seed = 0, offset = 0;
  // false: the caller vouches that CUDA views point to memory of the current device (the torch
  // layer, whose tensors say so), which saves a runtime query per tensor and call.
  bool check_device_memory = true;
};

// Updates count tensors in place. A block (the block elements of one tensor that share an
// absmax, for 32-bit states too) whose gradient holds a NaN or Inf, or whose new parameter or
// state values would not all be finite, is left untouched (parameter and states); skipped, unless
// its data is null, is int64 [count] on the tensors' device and skipped[j] grows by the number of
// blocks of tensor j so left. All tensors on one device; CUDA work runs on ex.stream.
void optimizer_step(optimizer o, const optim_hparams& h, const optim_tensor* tensors,
                    std::int64_t count, const tensor_view& skipped, const optim_config& cfg = {},
                    const exec& ex = {});

} // namespace lowbit::kernels
