// The CUTLASS sm_90 kernels for int8 x int8 operands (gemm_cutlass_sm90.cuh), in a translation
// unit of their own so that the element types compile in parallel.
#include "gemm_cutlass_sm90.cuh"

namespace lowbit::kernels::cuda::sm90 {

void run_int8(const gemm_problem& p, const float* bias, const exec& ex) {
  run_out<std::int8_t, std::int8_t>(p, bias, ex);
}

} // namespace lowbit::kernels::cuda::sm90
