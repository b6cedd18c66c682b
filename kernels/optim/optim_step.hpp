// launch_step<K>: the CUDA step of optimizer K (optim_step.cuh) with at most two states,
// instantiated in optim_adam.cu, optim_stable.cu, optim_lamb.cu and optim_misc.cu; launch_step3<K>:
// the step with three states (adam and adamw with amsgrad, rmsprop with momentum and centered),
// in optim_three.cu.
#pragma once

#include "optim_internal.hpp"

namespace lowbit::kernels::cuda {

template <optimizer K> void launch_step(const optim_problem& p, const exec& ex);
template <optimizer K> void launch_step3(const optim_problem& p, const exec& ex);

// The two dynamic maps' tables (signed, unsigned; p.tb_signed and p.tb_unsigned, constants of the
// process) and their bucket tables, on the current device: uploaded by the first call on each
// device and kept until the process ends, so that a step uploads only its tensor table (a step
// per parameter, inside the backward pass, would otherwise copy 40 KB each time). Checks once
// that the bucket tables are as the step kernel takes them (nearest_codes).
struct step_tables {
  const blockwise_ops::tables* tabs; // [2]
  const std::uint32_t* buckets;      // the signed map's bucket table, then the unsigned map's
                                     // pair table, bucket_count words each (optim.cu)
};
step_tables resident_tables(const optim_problem& p);

extern template void launch_step<optimizer::adam>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::adamw>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::stable_adamw>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::sgd>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::lion>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::rmsprop>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::lamb>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::lars>(const optim_problem&, const exec&);
extern template void launch_step<optimizer::adagrad>(const optim_problem&, const exec&);
extern template void launch_step3<optimizer::adam>(const optim_problem&, const exec&);
extern template void launch_step3<optimizer::adamw>(const optim_problem&, const exec&);
extern template void launch_step3<optimizer::rmsprop>(const optim_problem&, const exec&);

} // namespace lowbit::kernels::cuda
