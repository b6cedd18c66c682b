// Exact reference for the scaled matmul of lowbit's GEMM layer and for the SwitchBack layer chain
// (docs/techniques/gemm-bounds.md): y*[m, n] = sa[m] sb[n] sum_k a[m, k] b[n, k] + bias[n] as an
// exact rational, or the IEEE special value where NaN or Inf take part, and y* rounded once to
// the output format. The chain quantizes float inputs with the exact scale q* and the exact code
// of x q*, multiplies exactly and dequantizes by the exact d* = 1/q*. Plain C++ over the
// rationals of round.hpp; shares nothing with kernels/gemm, which the property tests hold to it.
//
// The interface is plain data (vectors of codes and floats, row-major, with their shapes) so that
// a test can build any operand, including ones no kernel would produce.
#pragma once

#include <cstdint>
#include <vector>

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/reference/quantize.hpp>
#include <lowbit/reference/round.hpp>

namespace lowbit::reference {

// The element formats a matmul operand may hold.
enum class gemm_elem : std::uint8_t { int8, e4m3fn, e5m2, bfloat16, float16 };
// The formats of the matmul's output.
enum class gemm_out : std::uint8_t { float32, bfloat16, float16 };

const char* gemm_elem_name(gemm_elem e);
const char* gemm_out_name(gemm_out o);
// The emu format of a floating-point element (int8 is refused) and of an output.
emu::format elem_format(gemm_elem e);
emu::format out_format(gemm_out o);

// A value of the extended reals of IEEE arithmetic: finite (exact), +-Inf or NaN. NaN carries no
// sign here: the matmul's NaN results are compared as "a NaN".
struct extended {
  enum class kind : std::uint8_t { finite, nan, pos_inf, neg_inf };
  kind k = kind::finite;
  rational value; // meaningful for finite only

  static extended nan() { return {kind::nan, rational(0)}; }
  static extended inf(bool negative) { return {negative ? kind::neg_inf : kind::pos_inf, 0}; }
  static extended of(const rational& v) { return {kind::finite, v}; }
  // A float32 or double value exactly (NaN and Inf included).
  static extended of(double x);

  bool is_finite() const { return k == kind::finite; }
  bool is_nan() const { return k == kind::nan; }
  bool is_inf() const { return k == kind::pos_inf || k == kind::neg_inf; }
};

// IEEE operations on extended values, exact where finite: NaN in, NaN out; Inf * 0 and
// (+Inf) + (-Inf) are NaN; Inf times a nonzero or Inf gives the product's sign; Inf plus a
// finite value stays that Inf. Finite results are never rounded (no overflow).
extended mul(const extended& x, const extended& y);
extended add(const extended& x, const extended& y);

// The value of one element code: int8 codes are the value's two's complement in the low 8 bits
// (0x80 is -128); the others are codes of their format (NaN and Inf codes give NaN and +-Inf).
// Bits above the element's width are refused (lowbit::error).
extended element_value(gemm_elem e, std::uint32_t code);

// One operand: rows x cols codes, row-major. scales: no elements (every scale 1), one element
// (the tensor's scale) or `rows` elements (one per row); any float32 value, NaN and Inf included.
struct code_matrix {
  gemm_elem elem = gemm_elem::int8;
  std::int64_t rows = 0, cols = 0;
  std::vector<std::uint32_t> codes;
  std::vector<float> scales;
};

// One output element.
struct gemm_entry {
  extended sum; // S = sum_k a[m, k] b[n, k] over extended values, exact
  rational
      abs_sum;    // sum_k |a b| over the finite products (the size a float32 sum's error scales by)
  extended exact; // y* = ((S sa) sb) + bias as extended values: the value of the specification
  std::uint32_t rounded = 0; // y* rounded once to the output format: float32 bits, or the bf16 /
                             // fp16 code; nearest-even, overflow to Inf; NaN as the positive
                             // quiet NaN of kernels/gemm.hpp (float32 0x7FC00000, bf16 0x7FC0,
                             // fp16 0x7E00); an exact zero as +0
};

struct gemm_result {
  std::int64_t m = 0, n = 0;
  std::vector<gemm_entry> entries; // row-major, m x n
  const gemm_entry& at(std::int64_t i, std::int64_t j) const {
    return entries[static_cast<std::size_t>(i * n + j)];
  }
};

// The exact scaled matmul: a is M x K, b is N x K (both K-major), bias has no elements or N
// float32 values (NaN and Inf included). Refuses inconsistent shapes, scale counts and codes
// (lowbit::error naming the argument). Any pair of element formats is accepted: the exact value
// does not care, the kernels decide which pairs they take.
gemm_result exact_scaled_matmul(const code_matrix& a, const code_matrix& b,
                                const std::vector<float>& bias, gemm_out out);

// The blocked rule's specification (kernels/gemm.hpp, block scales along K): K cut into blocks
// j of `kblock` elements (the last may be shorter), S_j the exact sum over block j, and
//   y*[m, n] = sum_j (S_j sa[m, j]) sb[n, j] + bias[n]
// over extended values (block terms added in block order, which matters only for the special
// values). An operand with block_rows >= 1 holds [ceil(rows / block_rows), ceil(K / kblock)]
// scales, row-major (E8M0 scales as their float values: 2^(e - 127), NaN for 0xFF); with
// block_rows 0 its scales are read as exact_scaled_matmul reads them (none, tensor, rows).
// entry.abs_sum is sum_j |sa[m, j] sb[n, j]| sum_{k in j} |a b| (the size of the blocked sum's
// rounding errors).
gemm_result exact_block_scaled_matmul(const code_matrix& a, std::int64_t a_block_rows,
                                      const code_matrix& b, std::int64_t b_block_rows,
                                      std::int64_t kblock, const std::vector<float>& bias,
                                      gemm_out out);

// The same over exact operand values and scales (the layer chain's d* are not floats):
// a_values M x K, b_values N x K row-major; sa has M elements (or one), sb N (or one).
gemm_result exact_matmul_of_values(std::int64_t m, std::int64_t n, std::int64_t k,
                                   const std::vector<extended>& a_values,
                                   const std::vector<extended>& b_values,
                                   const std::vector<extended>& sa, const std::vector<extended>& sb,
                                   const std::vector<extended>& bias, gemm_out out);

// y* rounded once to the output format (the `rounded` rule above).
std::uint32_t round_output(gemm_out o, const extended& y);
// The value of an output code as an extended value (NaN, +-Inf, or exact).
extended output_value(gemm_out o, std::uint32_t code);

// ---- the SwitchBack layer chain ----------------------------------------------------------------

// A float32 matrix, rows x cols, row-major (finite values only: the chain refuses NaN and Inf).
struct float_matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> values;
};

// One operand quantized exactly: codes[i] = the rounding of x[i] q*_g under the policy, q*_g =
// max / amax_g (margin 0, not a power of two), d*_g = 1 / q*_g; a group with amax 0 has
// q* = d* = 1 (the kernels' rule). per_row: one group per row, else one for the tensor.
struct exact_quantized {
  code_matrix codes;               // scales left empty: the exact factors are below
  std::vector<rational> scale;     // q* per group
  std::vector<rational> dequant;   // d* per group (one element per tensor, or one per row)
  std::vector<rational> x_times_q; // x[i] q*_g exactly, per element (for code-flip bands)
};
exact_quantized quantize_exact(const float_matrix& x, const quant_target& t, bool per_row,
                               const emu::policy& pol = emu::rne);

// Which SwitchBack layer: the paper's int8 SwitchBack (X and G row-wise, W tensor-wise, int8
// symmetric codes), SwitchBackQ (W row-wise in the forward pass, column-wise for the input
// gradient), and their fp8 forms (E4M3 for X and W, E5M2 for G).
enum class switchback_variant : std::uint8_t { int8, int8_q, fp8, fp8_q };
const char* switchback_variant_name(switchback_variant v);

// The chain of one matmul: both operands quantized exactly, then the exact matmul with the d*
// factors as scales, rounded once.
struct chain_result {
  exact_quantized a, b;
  gemm_result y;
};

// Forward: Y = dequant(q_rows(X) q_W(W)^T) + bias; X is M x K, W is N x K, bias N (or empty).
chain_result switchback_forward(const float_matrix& x, const float_matrix& w,
                                const std::vector<float>& bias, switchback_variant v, gemm_out out);
// Input gradient: dX = dequant(q_rows(G) q_W'(W)); G is M x N, W is N x K, dX is M x K. The
// second operand is W^T (K x N) quantized per tensor (SwitchBack) or per row of W^T, i.e. per
// column of W (SwitchBackQ).
chain_result switchback_input_grad(const float_matrix& g, const float_matrix& w,
                                   switchback_variant v, gemm_out out);

// The targets a variant uses: of X (and W in the forward pass) and of G.
quant_target switchback_input_target(switchback_variant v);
quant_target switchback_grad_target(switchback_variant v);
bool switchback_weight_per_row(switchback_variant v); // forward W row-wise, dX W column-wise

} // namespace lowbit::reference
