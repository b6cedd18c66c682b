// The CUTLASS sm_90 kernels for bfloat16 x bfloat16 operands (gemm_cutlass_sm90.cuh), in a
// translation unit of their own so that the element types compile in parallel.
#include "gemm_cutlass_sm90.cuh"

namespace lowbit::kernels::cuda::sm90 {

void run_bf16(const gemm_problem& p, const float* bias, const exec& ex) {
  run_out<cutlass::bfloat16_t, cutlass::bfloat16_t>(p, bias, ex);
}

} // namespace lowbit::kernels::cuda::sm90
