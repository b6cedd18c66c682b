// The CUDA steps of stable_adamw (optim_step.cuh).
#include "optim_step.cuh"

namespace lowbit::kernels::cuda {

template void launch_step<optimizer::stable_adamw>(const optim_problem&, const exec&);

} // namespace lowbit::kernels::cuda
