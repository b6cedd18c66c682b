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
//   block_rows, block_k: block scales (both 0: none, the readings above). Blocks of block_rows
//           rows by block_k elements along K share one scale; scales is then the contiguous
//           row-major [ceil(rows / block_rows), ceil(K / block_k)] matrix (any shape with that
//           many elements), exactly kernels/quantize's layouts: per-row blocks along K
//           (grouping::blocks(128): block_rows 1, block_k 128), tiles (grouping::tiles(128,
//           128): block_rows 128, block_k 128), OCP MX blocks (quantize_mx, block 32:
//           block_rows 1, block_k 32). Scales are float32 dequantization factors, or, for fp8
//           operands, uint8 E8M0 codes (quantize_mx's scales: code e is 2^(e - 127), 0xFF NaN).
struct gemm_operand {
  tensor_view codes;
  target fmt = emu::target(emu::e4m3fn);
  tensor_view scales;
  std::int64_t block_rows = 0;
  std::int64_t block_k = 0;
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
  // cuBLASLt's fp8 fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): the tensor cores' partial
  // sum is never promoted into float32 (on the H200: emu::hopper_fp8_accumulation(true)'s sum,
  // fp8-training.md). fp8 operands on CUDA views, backend cublaslt or automatic (which then
  // runs cuBLASLt) only: other operands are refused with errc::invalid_argument, other backends,
  // CPU views and a device without fp8 with errc::unsupported, and so is it with accumulation
  // set. Off: cuBLASLt's slow accumulation (emu::hopper_fp8_accumulation(false) on the H200).
  bool fast_accumulation = false;
};

// out[m, n] = round((float(acc[m, n]) * (sa * sb)) + bias[n]) where neither operand has per-row
// scales (each one scale or none), else round(((float(acc[m, n]) * sb[n]) * sa[m]) + bias[n]) (the
// order of cuBLASLt's fp8 epilogue on the H200), each step one float32
// operation rounded to nearest-even, no fused multiply-add; the last rounding to out's dtype is
// nearest-even, and every NaN result is written as the positive quiet NaN (NaN signs and payloads
// differ between CPUs and GPUs). acc is the exact int32 sum for int8 operands (K may not exceed the
// count that keeps it exact for any codes: 131071) and a float32 sum of the exact
// products for fp8 and 16-bit operands (the order depends on the backend: gemm.md), or the sum
// of opt.accumulation's model over k = 0, 1, ..., K-1.
//   out:  float32, bfloat16 or float16 (M x N), N contiguous, rows may be strided.
//   bias: float32, bfloat16 or float16 [N], or no elements for none.
//
// Block scales along K (either operand with block_k > 0; where both have one, the same block_k
// = kb): the K axis is cut into blocks j = 0, 1, ... of kb elements (the last may be shorter).
// Each block's partial sum acc_j is computed alone (the exact int32 sum for int8; for fp8 and
// 16-bit operands the float32 sum of the block's products in k order, or opt.accumulation's
// model started afresh on each block), scaled by its own two scales, and the terms are summed in
// float32 in block order, the first term as the start:
//   t_j = (float(acc_j) * sa[m, j]) * sb[n, j],  T = t_0,  T = T + t_j (j = 1, 2, ...),
//   out[m, n] = round(T + bias[n]),
// each step one float32 operation rounded to nearest-even. sa[m, j] is the operand's block scale
// of row m and K block j, or its tensor or row scale for an operand without K blocks. With a
// single block this is the rule above. The DeepSeek-V3 style recipes (activations in 1 x 128
// blocks, weights in 128 x 128 blocks, fp32 promotion of every 128-element partial sum) and MX
// matmuls are this rule. Block scales run on the CPU twin and simt (bit-identical); the
// tensor-core backends refuse them (errc::unsupported); `automatic` picks simt for them.
// A, B, their scales, bias and out live on one device. Empty problems (M, N or K of 0) write
// round(bias) (or zeros) into out and launch no GEMM.
void scaled_matmul(const gemm_operand& a, const gemm_operand& b, const tensor_view& bias,
                   const tensor_view& out, const gemm_options& opt = {}, const exec& ex = {});

// The backend `automatic` picks for these operands on the current device (CUDA views), or simt
// for CPU views; throws where no backend takes them.
gemm_backend gemm_backend_for(const gemm_operand& a, const gemm_operand& b, const tensor_view& out);

} // namespace lowbit::kernels
