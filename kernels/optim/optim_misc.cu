// The CUDA steps of sgd, lion, rmsprop, adagrad (optim_step.cuh).
#include "optim_step.cuh"

namespace lowbit::kernels::cuda {

template void launch_step<optimizer::sgd>(const optim_problem&, const exec&);
template void launch_step<optimizer::lion>(const optim_problem&, const exec&);
template void launch_step<optimizer::rmsprop>(const optim_problem&, const exec&);
template void launch_step<optimizer::adagrad>(const optim_problem&, const exec&);

} // namespace lowbit::kernels::cuda
