// The scaled matmul of lowbit's GEMM layer: out = (sa * A) (sb * B)^T + bias over int8 codes,
// fp8 codes or 16-bit values, with the dequantization fused into the epilogue. Every matmul of
// the training techniques (SwitchBack, fp8 training) goes through this one entry point; the
// backend is a choice among implementations of the same rule, and the CPU twin is its witness.
// The rule, the backends and their bounds are in docs/techniques/gemm.md.
#pragma once

#include <cstdint>
#include <optional>

#include <lowbit/emu/accumulate.hpp>
#include <lowbit/emu/target.hpp>
#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

using target = emu::target; // as in quantize.hpp: this header must compile on its own

// One operand, read as a (rows x K) matrix with K contiguous (matrix.hpp's reading: leading
// dimensions collapse into rows, rows may be strided). A is (M x K), B is (N x K): both operands
// are K-major ("TN"), which every tensor-core path takes for 8-bit types.
//   codes:  int8 (fmt int8 or int8_sym), uint8 codes of e4m3fn or e5m2, or bfloat16/float16
//           values (fmt bfloat16/float16, dtype bfloat16/float16).
//   scales: float32 on the codes' device; no elements (data may be null): every scale is 1;
//           one element: one scale for the tensor; `rows` elements: one scale per row.
struct gemm_operand {
  tensor_view codes;
  target fmt = emu::target(emu::e4m3fn);
  tensor_view scales;
};

// Where a CUDA matmul runs. CPU views always run the CPU twin, whatever is asked here.
enum class gemm_backend : std::uint8_t {
  automatic, // the fastest backend that takes these operands on this device (gemm.md's table)
  simt,      // CUDA cores, the CPU twin's summation order: bit-identical to the CPU twin
  cublaslt,  // cuBLASLt on the operands' own tensor cores (int8 IMMA, fp8 on sm_89+, 16-bit)
  cutlass,   // CUTLASS on sm_90 (int8, fp8, 16-bit), the epilogue fused
  widened,   // fp8 codes widened exactly to 16-bit values, then 16-bit tensor cores
};

const char* gemm_backend_name(gemm_backend b);

struct gemm_options {
  gemm_backend backend = gemm_backend::automatic;
  // How fp8 and 16-bit products are summed (emu/accumulate.hpp, docs/techniques/fp8-training.md).
  // Unset: each backend's own sum (the twin's and simt's fp32_sequential, the tensor cores'
  // hardware sum). Set: the CPU twin and simt (which `automatic` then picks) sum with this model;
  // the tensor-core backends refuse it (errc::unsupported: they sum in hardware), `exact` is
  // refused everywhere (the reference computes it), and so is any model for int8 operands
  // (errc::invalid_argument: their sums are exact).
  std::optional<emu::accumulation> accumulation;
};

// out[m, n] = round(((float(acc[m, n]) * sa[m]) * sb[n]) + bias[n]), each step one float32
// operation rounded to nearest-even, no fused multiply-add; the last rounding to out's dtype is
// nearest-even, and every NaN result is written as the positive quiet NaN (NaN signs and payloads
// differ between CPUs and GPUs). acc is the exact int32 sum for int8 operands (K may not exceed the
// count that keeps it exact: 131071, or 133143 for int8_sym codes) and a float32 sum of the exact
// products for fp8 and 16-bit operands (the order depends on the backend: gemm.md), or the sum
// of opt.accumulation's model over k = 0, 1, ..., K-1.
//   out:  float32, bfloat16 or float16 (M x N), N contiguous, rows may be strided.
//   bias: float32, bfloat16 or float16 [N], or no elements for none.
// A, B, their scales, bias and out live on one device. Empty problems (M, N or K of 0) write
// round(bias) (or zeros) into out and launch no GEMM.
void scaled_matmul(const gemm_operand& a, const gemm_operand& b, const tensor_view& bias,
                   const tensor_view& out, const gemm_options& opt = {}, const exec& ex = {});

// The backend `automatic` picks for these operands on the current device (CUDA views), or simt
// for CPU views; throws where no backend takes them.
gemm_backend gemm_backend_for(const gemm_operand& a, const gemm_operand& b, const tensor_view& out);

} // namespace lowbit::kernels
