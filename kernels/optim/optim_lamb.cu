// The CUDA steps of lamb, lars (optim_step.cuh).
#include "optim_step.cuh"

namespace lowbit::kernels::cuda {

template void launch_step<optimizer::lamb>(const optim_problem&, const exec&);
template void launch_step<optimizer::lars>(const optim_problem&, const exec&);

} // namespace lowbit::kernels::cuda
