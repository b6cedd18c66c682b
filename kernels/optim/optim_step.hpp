// launch_step<K>: the CUDA step of optimizer K (optim_step.cuh), instantiated in optim_adam.cu,
// optim_stable.cu, optim_lamb.cu and optim_misc.cu.
#pragma once

#include "optim_internal.hpp"

namespace lowbit::kernels::cuda {

template <optimizer K> void launch_step(const optim_problem& p, const exec& ex);

extern template void launch_step<optimizer::adam>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::adamw>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::stable_adamw>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::sgd>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::lion>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::rmsprop>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::lamb>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::lars>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::adagrad>(const optim_problem&, const exec&);

} // namespace lowbit::kernels::cuda
