// The CUTLASS backend of builds without it (no CUTLASS headers, or sm_90 not among the CUDA
// architectures: cmake/cutlass.cmake): never available, so `automatic` picks another backend and
// an explicit request for cutlass is refused.
#include <lowbit/emu/error.hpp>

#include "gemm_internal.hpp"

namespace lowbit::kernels::cuda {

bool cutlass_sm90_available(const gemm_problem&) {
  return false;
}

void cutlass_sm90_matmul(const gemm_problem&, const exec&) {
  throw error(errc::unsupported,
              "scaled_matmul: this build has no CUTLASS sm_90 kernels (configure with CUTLASS's "
              "headers, e.g. pip install nvidia-cutlass, and 90 in CMAKE_CUDA_ARCHITECTURES)");
}

} // namespace lowbit::kernels::cuda
