// Residual master weights (Lewandowski and Kosson, "Memory Efficient Mixed-Precision
// Optimizers", 2023): a float32 value kept as a 16-bit weight (bfloat16 or float16, rounded to
// nearest with ties away from zero) plus a k-bit signed residual (1 <= k <= 16; int8 storage for
// k <= 8, int16 for k > 8) holding the bits the weight lost. bfloat16 with k = 16 reconstructs
// every non-NaN float32 exactly. The optimizer steps (optim.hpp, optim_tensor::residual) read
// and write the pair directly; these calls convert whole tensors. CPU twin and CUDA kernel agree
// bit for bit. Rule, proofs and bounds: docs/techniques/residual.md.
#pragma once

#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

// The storage dtype of a k-bit residual: int8 for k <= 8, int16 otherwise.
dtype residual_dtype(int bits);

// x: float32; weight: bfloat16 or float16; residual: residual_dtype(bits); all contiguous, of
// one element count, on one device. Writes weight and residual.
void residual_split(const tensor_view& x, const tensor_view& weight, const tensor_view& residual,
                    int bits, const exec& ex = {});

// The float32 value of each (weight, residual) pair into out (float32, contiguous).
void residual_join(const tensor_view& weight, const tensor_view& residual, int bits,
                   const tensor_view& out, const exec& ex = {});

} // namespace lowbit::kernels
