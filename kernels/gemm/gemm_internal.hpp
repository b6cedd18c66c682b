// The checked form of a scaled matmul, shared by the host API (gemm.cpp, which validates), the
// CPU twin (gemm_cpu.cpp) and the CUDA backends (gemm.cu: simt, widening, the unfused epilogue;
// gemm_cublaslt.cpp; gemm_cutlass_sm90.cu). Everything here has passed validation.
#pragma once

#include <cstdint>

#include <lowbit/kernels/gemm.hpp>

#include "../common/matrix.hpp"

namespace lowbit::kernels {

// The element type of an operand, as the backends dispatch on it.
enum class gemm_elem : std::uint8_t { int8, e4m3, e5m2, bf16, f16 };

// How an operand's scales are read.
enum class scale_mode : std::uint8_t { none, tensor, rows };

struct gemm_side {
  const void* codes = nullptr;
  std::int64_t rows = 0;       // M for A, N for B
  std::int64_t row_stride = 0; // elements between rows (>= K)
  gemm_elem elem = gemm_elem::int8;
  const float* scales = nullptr; // null when mode is none
  scale_mode mode = scale_mode::none;
};

struct gemm_problem {
  gemm_side a, b;
  std::int64_t m = 0, n = 0, k = 0;
  const void* bias = nullptr; // null for none
  dtype bias_type = dtype::float32;
  void* out = nullptr;
  dtype out_type = dtype::float32;
  std::int64_t out_stride = 0; // elements between rows of out (>= N)
  device dev{};
};

// The epilogue of docs/techniques/gemm.md, one element: every backend computes exactly this
// (host and device; the build has no FMA contraction: --fmad=false, -ffp-contract=off).
LOWBIT_HD inline float gemm_epilogue(float acc, float sa, float sb, float bias) {
  float v = acc * sa;
  v = v * sb;
  return v + bias;
}

namespace cpu {
// acc: exact int32 for int8; float32 for the others, summed over k = 0, 1, ..., K-1 in order
// (acc = acc + a*b, each product exact in float32 for fp8 and each step rounded: the simt order).
void scaled_matmul(const gemm_problem& p, const exec& ex);
} // namespace cpu

namespace cuda {
// Device capability the backends need (major * 10 + minor of the current device).
int compute_capability();

void simt_matmul(const gemm_problem& p, const exec& ex);
void widened_matmul(const gemm_problem& p, const exec& ex);
void cublaslt_matmul(const gemm_problem& p, const exec& ex);
// False when this build has no CUTLASS sm_90 kernels for the problem (then another backend runs).
bool cutlass_sm90_available(const gemm_problem& p);
void cutlass_sm90_matmul(const gemm_problem& p, const exec& ex);
} // namespace cuda

} // namespace lowbit::kernels
