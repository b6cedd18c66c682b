// The optimizer steps' CUDA entry point in builds without CUDA (host API callers reach it only
// with device views, which such a build refuses).
#include "../common/no_cuda.hpp"
#include "optim_internal.hpp"

namespace lowbit::kernels::cuda {

void optimizer_step(const optim_problem&, const exec&) {
  throw_no_cuda();
}

} // namespace lowbit::kernels::cuda
