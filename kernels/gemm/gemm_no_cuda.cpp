// The scaled matmul's CUDA entry points in builds without CUDA (the host API reaches them only
// with device views, which such a build refuses before).
#include "../common/no_cuda.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels::cuda {

int compute_capability() {
  throw_no_cuda();
}
void simt_matmul(const gemm_problem&, const exec&) {
  throw_no_cuda();
}
void widened_matmul(const gemm_problem&, const exec&) {
  throw_no_cuda();
}
void cublaslt_matmul(const gemm_problem&, const exec&) {
  throw_no_cuda();
}
bool cutlass_sm90_available(const gemm_problem&) {
  return false;
}
void cutlass_sm90_matmul(const gemm_problem&, const exec&) {
  throw_no_cuda();
}
void finish_matmul(const gemm_problem&, const void*, bool, std::int64_t, const exec&) {
  throw_no_cuda();
}
std::string cublaslt_refusal(const gemm_problem&) {
  throw_no_cuda();
}

} // namespace lowbit::kernels::cuda
