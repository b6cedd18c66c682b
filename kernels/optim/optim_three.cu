// The CUDA steps with three states: adam and adamw with amsgrad, rmsprop with momentum and
// centered (optim_step.cuh).
#include "optim_step.cuh"

namespace lowbit::kernels::cuda {

template void launch_step3<optimizer::adam>(const optim_problem&, const exec&);
template void launch_step3<optimizer::adamw>(const optim_problem&, const exec&);
template void launch_step3<optimizer::rmsprop>(const optim_problem&, const exec&);

} // namespace lowbit::kernels::cuda
