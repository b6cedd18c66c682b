// cuBLASLt handles per device (see blas.hpp).
#include "blas.hpp"

#include <mutex>
#include <vector>

#include "cuda.hpp"

namespace lowbit::kernels::cuda::blas {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw error(errc::device, std::string("cuBLASLt error ") + cublasLtGetStatusName(status) +
                                  " (" + cublasLtGetStatusString(status) + ") in " + what);
}

cublasLtHandle_t handle() {
  static std::mutex mu;
  static std::vector<cublasLtHandle_t> handles; // per device; kept for the process's lifetime
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(handles.size()) <= dev)
    handles.resize(static_cast<std::size_t>(dev) + 1, nullptr);
  cublasLtHandle_t& h = handles[static_cast<std::size_t>(dev)];
  if (h == nullptr)
    check(cublasLtCreate(&h), "cublasLtCreate");
  return h;
}

std::size_t workspace_bytes() {
  // 32 MiB: what NVIDIA recommends for Hopper (4 MiB suffices before it); the pool keeps it
  // mapped between calls, so asking for it each call costs no allocation.
  return std::size_t{32} << 20;
}

} // namespace lowbit::kernels::cuda::blas
