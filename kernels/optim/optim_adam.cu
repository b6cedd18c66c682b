// The CUDA steps of adam, adamw (optim_step.cuh).
#include "optim_step.cuh"

namespace lowbit::kernels::cuda {

template void launch_step<optimizer::adam>(const optim_problem&, const exec&);
template void launch_step<optimizer::adamw>(const optim_problem&, const exec&);

} // namespace lowbit::kernels::cuda
