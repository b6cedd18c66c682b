// Per-group 8-bit activation quantization with running estimates (Mesa, Pan et al.): the forward
// pass of a layer stays exact, and what its backward pass needs is kept as 8-bit codes, each group
// of channels (an attention head, a block of channels) with its own step alpha and offset beta.
// The estimates are exponential moving averages of each group's range and minimum, updated in the
// same call that quantizes. CPU twin and CUDA kernel agree bit for bit; docs/techniques/mesa.md
// has the equations.
#pragma once

#include <cstdint>

#include <lowbit/emu/philox.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

// Which elements of x share one (alpha, beta): x is read as [outer, C, inner] around dimension
// `dim` (C = x.shape[dim]; negative dims count from the end), and the indices c of one group are
// the group_size consecutive ones [g * group_size, (g + 1) * group_size). group_size divides C,
// so there are G = C / group_size groups. [batch, heads, tokens, dim] with dim = 1 and
// group_size = 1: one group per head; [tokens, channels] with dim = -1: blocks of channels.
struct actquant_groups {
  int dim = 0;
  std::int64_t group_size = 1;
};

// The number of groups G for a tensor of that shape (throws lowbit::error when the grouping does
// not fit it).
std::int64_t actquant_group_count(const tensor_view& x, const actquant_groups& g);

// codes[i] = clamp(round((x[i] - beta[g]) / alpha[g]), 0, 255) (uint8; float32 arithmetic, one
// rounding per operation; the rounding of the policy: nearest-even, stochastic with
// pol.random_bits bits of rng's stream for element i, or any other rounding; NaN -> 0;
// out-of-range values saturate at 0 or 255: the published implementation wraps around instead).
//
// With `update`, the estimates are updated first, from this call's exact per-group minimum lo
// and maximum hi over the finite elements, and the updated estimates quantize this call:
//   a = (hi - lo) / 255
//   alpha = a, beta = lo                                   where alpha < 0 or NaN (no estimate)
//   alpha = m * alpha + (1 - m) * a, beta = m * beta + (1 - m) * lo      otherwise
// (float32, one rounding per operation, m = momentum in [0, 1]); a group without a finite element
// keeps its estimate. Without `update`, alpha and beta are read only.
//
// x: float32, bfloat16 or float16, contiguous; codes: uint8, contiguous, x's shape; alpha, beta:
// float32, contiguous, G elements each, on x's device.
void actquant_quantize(const tensor_view& x, const tensor_view& codes, const tensor_view& alpha,
                       const tensor_view& beta, const actquant_groups& g, const emu::policy& pol,
                       const emu::random_stream& rng = {}, bool update = false,
                       float momentum = 0.9f, const exec& ex = {});

// One read of x: the codes from the estimates as they are (the previous calls'), then the update
// of the estimates from this call's min/max (as above), which the next call will quantize with.
// Every group needs an estimate already (alpha > 0): a group without one gets meaningless codes
// (deterministic ones: those of its alpha and beta as they are). lowbit.nn.mesa uses it with
// `lagged=True`, after a first call of actquant_quantize with update has set the estimates.
void actquant_quantize_lagged(const tensor_view& x, const tensor_view& codes,
                              const tensor_view& alpha, const tensor_view& beta,
                              const actquant_groups& g, const emu::policy& pol,
                              const emu::random_stream& rng = {}, float momentum = 0.9f,
                              const exec& ex = {});

// Only the update of the estimates (as actquant_quantize with update), no codes.
void actquant_update(const tensor_view& x, const tensor_view& alpha, const tensor_view& beta,
                     const actquant_groups& g, float momentum = 0.9f, const exec& ex = {});

// out[i] = float(codes[i]) * alpha[g] + beta[g] (float32, the product and the sum rounded once
// each), stored as out's dtype: float32, or bfloat16 / float16 rounded to nearest-even.
void actquant_dequantize(const tensor_view& codes, const tensor_view& alpha,
                         const tensor_view& beta, const tensor_view& out, const actquant_groups& g,
                         const exec& ex = {});

// The element-wise activations of actquant_activation_backward.
enum class actquant_activation : std::uint8_t {
  gelu,      // x Phi(x) (torch's approximate="none")
  gelu_tanh, // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (approximate="tanh")
  silu,      // x / (1 + exp(-x))
  relu       // max(x, 0)
};

// The backward pass of an element-wise activation from its input's 8-bit codes (Mesa's GELU,
// SiLU, ReLU and the hidden layer of its MLP), one read of the codes and the gradient:
//   x     = dequantize(codes[i]) rounded to D         (what actquant_dequantize writes as D)
//   gx[i] = dy[i] f'(x)                                rounded to D
//   value[i] = f(x)                                    rounded to D (optional: data null)
// in float32 operations, one rounding each, by torch's formulas for f' (kernels/actquant/
// activation_ops.hpp; exp, erf and tanh there are lowbit's own, within a few float32 ulps of the
// exact functions: docs/techniques/mesa.md), identical on the CPU and the GPU. The value is the
// MLP's input to its second layer, recomputed in backward for that layer's weight gradient.
// dy (D: float32, bfloat16 or float16), gx and value (D) have codes' shape, all contiguous;
// grouping as actquant_dequantize's.
void actquant_activation_backward(const tensor_view& codes, const tensor_view& alpha,
                                  const tensor_view& beta, const actquant_groups& g,
                                  actquant_activation f, const tensor_view& dy,
                                  const tensor_view& gx, const tensor_view& value = {},
                                  const exec& ex = {});

// LayerNorm's backward pass over the last dimension from its input's 8-bit codes, in one read of
// the codes and the output gradient (Mesa's LayerNorm: lowbit.nn.mesa.MesaLayerNorm). codes is
// [R, C] (any leading dimensions, C = codes.shape[-1] >= 1, rows R = numel / C) with groups of
// group_size consecutive channels along the last dimension (actquant_groups{-1, group_size});
// gy has codes' shape and dtype D (float32, bfloat16 or float16); weight is float32 [C] or
// absent (data null: 1). Per row, in float32 with one rounding per operation:
//   x_c  = dequantize(codes[c]) rounded to D          (what actquant_dequantize writes as D)
//   mean = S(x) / C,  var = S((x - mean)^2) / C,  rstd = 1 / sqrt(var + eps)
//   xhat = (x - mean) rstd,  g = gy w,  a = S(g) / C,  b = S(g xhat) / C
//   gx_c = ((g_c - a) - xhat_c b) rstd                 rounded to D
// where S is the row sum in the order of docs/techniques/mesa.md ("The backward passes that read
// the codes"): element c into partial (c / 4) mod 32 in increasing c, then the 32 partials
// pairwise (p_l + p_(l xor h) for h = 16, 8, 4, 2, 1). The parameter gradients over the rows:
//   gw_c = sum_r gy_rc xhat_rc,  gb_c = sum_r gy_rc       (float32 [C])
// each summed in float32 over chunks of 32 consecutive rows, the chunks' sums added in float64
// in chunk order (per 64 chunks, then those sums in order), then rounded once. The result does
// not depend on the device, the stream or the thread count. gx (D, codes' shape), gw and gb
// (float32 [C]) are outputs; any of them may be absent (data null). R = 0: gw = gb = 0. A NaN
// (a NaN estimate or gradient) gives NaN in the rows and columns it reaches, written as the
// canonical quiet NaN of the output's dtype. C up to 2^24 (beyond it the float32 count C is not
// exact).
void actquant_layer_norm_backward(const tensor_view& codes, const tensor_view& alpha,
                                  const tensor_view& beta, std::int64_t group_size,
                                  const tensor_view& gy, const tensor_view& weight, float eps,
                                  const tensor_view& gx, const tensor_view& gw,
                                  const tensor_view& gb, const exec& ex = {});

} // namespace lowbit::kernels
