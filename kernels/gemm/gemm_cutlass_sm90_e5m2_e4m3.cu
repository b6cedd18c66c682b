// The CUTLASS sm_90 kernels for e5m2 x e4m3 operands (an E5M2 gradient times E4M3 codes: input
// gradients, and the weight gradient of tensor-wise fp8 training; gemm_cutlass_sm90.cuh), in a
// translation unit of their own so that the element types compile in parallel.
#include "gemm_cutlass_sm90.cuh"

namespace lowbit::kernels::cuda::sm90 {

void run_e5m2_e4m3(const gemm_problem& p, const float* bias, const exec& ex) {
  run_out<cutlass::float_e5m2_t, cutlass::float_e4m3_t>(p, bias, ex);
}

} // namespace lowbit::kernels::cuda::sm90
