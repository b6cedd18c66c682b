// CUDA kernels of the fused optimizer steps: one launch over the work blocks of every tensor of
// the call (a multi-tensor step). A work block (one absmax block of one tensor) is taken by a
// group of block / 8 lanes, eight elements per lane in two runs of four (lane r: elements 4r..
// 4r + 3 and 4 lanes + 4r.. of the block, so that every vector access of a warp covers one
// contiguous stretch): one warp for blocks of 256, which then runs through its work blocks alone
// (its reductions are shuffles, no barrier), or the whole CUDA block of 256 threads for blocks of
// 2048. Each group takes a contiguous range of work blocks, one at a time, with the codebooks'
// tables and bucket tables in shared memory loaded once per CUDA block. Per work block: the
// tensor's form (parameter dtype, residual width, 8- or 32-bit states) chosen once, then
// parameter, gradient, residual and states read once (in vectors where the buffers are aligned),
// updated in registers by optim_ops.hpp, the block's skip decision and state absmax reduced, the
// states' nearest codes found through one reciprocal of the absmax and the bucket tables (equal
// to the CPU twin's division and binary search), and everything written once. The step has no
// order-dependent sum, so the lanes' mapping changes no result. StableAdamW, and LAMB and LARS
// with the trust ratio on, run two small kernels first (the pre-pass partials of each work block:
// the RMS terms, or the squared norms of p and u or g; then each tensor's pair) in the tree that
// optim_cpu.cpp mirrors: there lane t of a work block holds its elements t, t + lanes, ...
//
// The kernels are in optim_step.cuh; this file dispatches to the optimizer's instance.
#include "optim_step.hpp"

namespace lowbit::kernels::cuda {

void optimizer_step(const optim_problem& p, const exec& ex) {
  using o = optimizer;
  switch (p.sh.kind) {
  case o::adam: return launch_step<o::adam>(p, ex);
  case o::adamw: return launch_step<o::adamw>(p, ex);
  case o::stable_adamw: return launch_step<o::stable_adamw>(p, ex);
  case o::sgd: return launch_step<o::sgd>(p, ex);
  case o::lion: return launch_step<o::lion>(p, ex);
  case o::rmsprop: return launch_step<o::rmsprop>(p, ex);
  case o::lamb: return launch_step<o::lamb>(p, ex);
  case o::lars: return launch_step<o::lars>(p, ex);
  default: return launch_step<o::adagrad>(p, ex);
  }
}

} // namespace lowbit::kernels::cuda
