// The CUTLASS sm_90 kernels for e4m3 x e4m3 operands (SwitchBack's fp8 forward;
// gemm_cutlass_sm90.cuh), in a translation unit of their own so that the element types compile
// in parallel.
#include "gemm_cutlass_sm90.cuh"

namespace lowbit::kernels::cuda::sm90 {

void run_e4m3_e4m3(const gemm_problem& p, const float* bias, const exec& ex) {
  run_out<cutlass::float_e4m3_t, cutlass::float_e4m3_t>(p, bias, ex);
}

} // namespace lowbit::kernels::cuda::sm90
