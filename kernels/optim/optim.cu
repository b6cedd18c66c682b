// CUDA kernels of the fused optimizer steps: one launch over the work blocks of every tensor of
// the call (a multi-tensor step). A work block (one absmax block of one tensor) is taken by a
// group of block / 8 lanes, eight elements per lane in two runs of four (lane r: elements 4r..
// 4r + 3 and 4 lanes + 4r.. of the block, so that every vector access of a warp covers one
// contiguous stretch): one warp for blocks of 256, which then runs through its work blocks alone
// (its reductions are shuffles, no barrier), or the whole CUDA block of 256 threads for blocks of
// 2048. Each group takes a contiguous range of work blocks, one at a time, with the codebooks'
// tables and bucket tables (uploaded once per device and process, resident_tables) in shared
// memory, loaded once per CUDA block where some tensor of the call keeps 8-bit states; the
// call's tensor table in the kernels' parameters for up to four tensors, else uploaded. Per work
// block: the tensor's form (parameter dtype, residual width, 8- or 32-bit states) chosen once, then
// parameter, gradient, residual and states read once (in vectors where the buffers are aligned),
// updated in registers by optim_ops.hpp, the block's skip decision and state absmax reduced, the
// states' nearest codes found through one reciprocal of the absmax and the bucket tables (equal
// to the CPU twin's division and binary search), and everything written once. The step has no
// order-dependent sum, so the lanes' mapping changes no result. StableAdamW, and LAMB and LARS
// with the trust ratio on, run two small kernels first (the pre-pass partials of each work block,
// its tensor's form a template argument as in the step: the RMS terms, or the squared norms of p
// and u or g; then each tensor's pair) in the tree that optim_cpu.cpp mirrors: each lane sums its
// eight elements in slot order, then the lanes pairwise by halving strides.
//
// The kernels are in optim_step.cuh; this file dispatches to the optimizer's instance: the form
// of three states (optim_three.cu) where the call keeps three.
#include "optim_step.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "../common/cuda.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace bops = blockwise_ops;

// The signed dynamic map's bucket table (every bucket steps at most once: simple_buckets) and
// the pair table of the unsigned one's nonnegative buckets (two step words a bucket: it steps
// twice in 8 buckets), as the step kernel's nearest_codes reads them (blockwise_ops.hpp). `ok`:
// the maps are as the kernel takes them: the signed table simple, every pair there, the
// unsigned map's index at every t <= -0 that of +0 (the kernel reads such t as +0: its
// negative buckets all hold that one index), and both maps' buckets 0 and 1, where the
// quotients below 2^-40 go, holding the index of zero.
struct bucket_tables {
  std::uint32_t s[bops::bucket_count];
  std::uint32_t pair[bops::bucket_count]; // (e0, e1) of bucket 2j at 2j, 2j + 1
};
bool buckets_of(const optim_problem& p, bucket_tables& b) {
  const bops::tables &ts = p.tb_signed, &tu = p.tb_unsigned;
  bool ok = bops::simple_buckets(ts);
  const std::uint32_t zs = bops::nearest_index(ts.sum_hi, ts.sum_lo, 0.0f);
  const std::uint32_t zu = bops::nearest_index(tu.sum_hi, tu.sum_lo, 0.0f);
  const std::uint32_t zero_entry = bops::bucket_step_entry(zu, bops::bucket_never);
  const std::uint32_t no_step = bops::bucket_step_entry(0, bops::bucket_never);
  for (std::uint32_t u = 0; u < bops::bucket_count; ++u) {
    b.s[u] = bops::bucket_entry(ts.sum_hi, ts.sum_lo, u);
    if (u < 2)
      ok = ok && b.s[u] == bops::bucket_step_entry(zs, bops::bucket_never);
    std::uint32_t e[2] = {0, 0};
    ok = ok && bops::bucket_pair(tu.sum_hi, tu.sum_lo, u, e);
    if (u % 2 == 0) {
      b.pair[u] = e[0];
      b.pair[u + 1] = e[1];
    }
    if (u < 2 || u % 2 == 1)
      ok = ok && e[0] == zero_entry && e[1] == no_step;
  }
  return ok;
}

} // namespace

step_tables resident_tables(const optim_problem& p) {
  constexpr int max_devices = 64;
  static std::mutex mu;
  static unsigned char* at[max_devices] = {};
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  require(dev >= 0 && dev < max_devices, errc::unsupported, [&] {
    return "optimizer step: device " + std::to_string(dev) + " is beyond the " +
           std::to_string(max_devices) + " devices the step keeps tables for";
  });
  const std::lock_guard<std::mutex> lock(mu);
  if (at[dev] == nullptr) {
    static bucket_tables b; // 48 KiB, built under the lock
    require(
        buckets_of(p, b), errc::unsupported,
        "optimizer step: the dynamic maps' bucket tables are not as the CUDA kernel takes them");
    std::vector<unsigned char> host(2 * sizeof(bops::tables) + sizeof(bucket_tables));
    std::memcpy(host.data(), &p.tb_signed, sizeof(bops::tables));
    std::memcpy(host.data() + sizeof(bops::tables), &p.tb_unsigned, sizeof(bops::tables));
    std::memcpy(host.data() + 2 * sizeof(bops::tables), &b, sizeof(bucket_tables));
    void* d = nullptr;
    LOWBIT_CUDA_CHECK(cudaMalloc(&d, host.size()));
    LOWBIT_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice));
    at[dev] = static_cast<unsigned char*>(d);
  }
  return {reinterpret_cast<const bops::tables*>(at[dev]),
          reinterpret_cast<const std::uint32_t*>(at[dev] + 2 * sizeof(bops::tables))};
}

void optimizer_step(const optim_problem& p, const exec& ex) {
  using o = optimizer;
  if (p.sh.states == 3) { // adam and adamw with amsgrad, rmsprop with momentum and centered
    switch (p.sh.kind) {
    case o::adam: return launch_step3<o::adam>(p, ex);
    case o::adamw: return launch_step3<o::adamw>(p, ex);
    case o::rmsprop: return launch_step3<o::rmsprop>(p, ex);
    default:
      throw error(errc::unsupported, "optimizer step: three states for an optimizer that "
                                     "keeps at most two");
    }
  }
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
