// Residual split/join's CUDA entry points in builds without CUDA (host API callers reach them
// only with device views, which such a build refuses).
#include "../common/no_cuda.hpp"
#include "residual_internal.hpp"

namespace lowbit::kernels::cuda {

void residual_split(const residual_problem&, const exec&) {
  throw_no_cuda();
}
void residual_join(const residual_problem&, const exec&) {
  throw_no_cuda();
}

} // namespace lowbit::kernels::cuda
