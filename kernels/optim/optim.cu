// CUDA kernel of the fused optimizer steps: one launch over the work blocks of every tensor of
// the call (a multi-tensor step). A work block (one absmax block of one tensor) is taken by a
// group of block / 8 lanes, eight elements per lane: one warp for blocks of 256, which then runs
// through its work blocks alone (its reductions are shuffles, no barrier), or the whole CUDA block
// of 256 threads for blocks of 2048. Each group takes a contiguous range of work blocks, one at a
// time, with the codebooks' search and bucket tables in shared memory loaded once per CUDA block
// (the nearest entry found through the buckets of blockwise_ops.hpp, which equal the CPU twin's
// binary search for every |t| <= 1). Per work block: parameter, gradient and states read once,
// updated in registers by optim_ops.hpp, the block's skip decision and state absmax reduced, then
// everything written once. StableAdamW, and LAMB and LARS with the trust ratio on, run two small
// kernels first (the pre-pass partials of each work block: the RMS terms, or the squared norms
// of p and u or g; then each tensor's pair) in the tree that optim_cpu.cpp mirrors.
#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "../common/cuda.hpp"
#include "optim_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace d = optim_detail;
namespace bops = blockwise_ops;

constexpr int warps = optim_threads / 32;
constexpr int EPT = optim_per_lane;

__device__ std::int64_t tensor_of(const optim_item* items, std::int64_t count, std::int64_t wb) {
  std::int64_t lo = 0, hi = count; // the last item with block0 <= wb: in [lo, hi)
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (items[mid].block0 <= wb)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// The lanes of one work block: W warps (1: a warp, 8: the CUDA block), their reductions.
template <int W> struct lane_group {
  static constexpr int lanes = 32 * W;
  static constexpr int per_block = warps / W; // groups per CUDA block
  __device__ static int rank() { return static_cast<int>(threadIdx.x) % lanes; }
  __device__ static std::int64_t index() {
    return static_cast<std::int64_t>(blockIdx.x) * per_block + threadIdx.x / lanes;
  }
  __device__ static std::int64_t count() {
    return static_cast<std::int64_t>(gridDim.x) * per_block;
  }
  __device__ static bool any(bool v) {
    if constexpr (W == 1)
      return __any_sync(0xFFFFFFFFu, v) != 0;
    else
      return __syncthreads_or(v) != 0;
  }
  // The maximum of the lanes' values, in every lane (order-free).
  __device__ static std::uint32_t max_of(std::uint32_t v, std::uint32_t* red) {
    for (int off = 16; off > 0; off >>= 1)
      v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    if constexpr (W == 1) {
      return v;
    } else {
      if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = v;
      __syncthreads();
      std::uint32_t m = red[0];
      for (int k = 1; k < W; ++k)
        m = max(m, red[k]);
      __syncthreads();
      return m;
    }
  }
  // The sum of the lanes' values in optim_cpu.cpp's tree (each warp's lanes pairwise by halving
  // strides, then the warps so); the result in rank 0.
  __device__ static float sum_of(float v, float* red) {
    for (int off = 16; off > 0; off >>= 1)
      v = v + __shfl_down_sync(0xFFFFFFFFu, v, off);
    if constexpr (W == 1) {
      return v;
    } else {
      const int w = threadIdx.x / 32, l = threadIdx.x % 32;
      if (l == 0)
        red[w] = v;
      __syncthreads();
      float s = 0.0f;
      if (w == 0) {
        s = l < W ? red[l] : 0.0f;
        for (int off = W / 2; off > 0; off >>= 1)
          s = s + __shfl_down_sync(0xFFFFFFFFu, s, off);
      }
      __syncthreads();
      return s;
    }
  }
};

// The work blocks of this lane group: a contiguous range, so that the tensor of each is found by
// one search at the start and then by stepping forward (the order of work blocks changes no
// result: each is computed alone).
template <int W> struct work_range {
  std::int64_t first, last, j;
  __device__ static work_range of(const optim_item* items, std::int64_t count, std::int64_t total) {
    using grp = lane_group<W>;
    const std::int64_t per = (total + grp::count() - 1) / grp::count();
    const std::int64_t first = grp::index() * per;
    const std::int64_t last = min(total, first + per);
    return {first, last, first < last ? tensor_of(items, count, first) : 0};
  }
  __device__ std::int64_t advance(const optim_item* items, std::int64_t count, std::int64_t j,
                                  std::int64_t wb) const {
    while (j + 1 < count && items[j + 1].block0 <= wb)
      ++j;
    return j;
  }
};

__device__ void load_tables(const bops::tables* src, bops::tables* dst) {
  const auto* s = reinterpret_cast<const float*>(src);
  auto* t = reinterpret_cast<float*>(dst);
  constexpr int n = 2 * static_cast<int>(sizeof(bops::tables) / sizeof(float));
  for (int k = threadIdx.x; k < n; k += blockDim.x)
    t[k] = s[k];
  __syncthreads();
}

// The pre-pass: the two partial sums of each work block (partial[2 wb], partial[2 wb + 1]), or
// excluded_partial in the first.
template <int W>
__global__ void __launch_bounds__(optim_threads)
    prepass_kernel(optim_shared sh, const optim_item* items, std::int64_t count, std::int64_t total,
                   const bops::tables* tabs, float* partial) {
  using grp = lane_group<W>;
  __shared__ bops::tables tb[2];
  __shared__ float red[warps];
  load_tables(tabs, tb);
  const int r = grp::rank();
  const bool two = sh.kind != optimizer::stable_adamw;
  const float* v0 = tb[d::state_signed(sh.kind, 0) ? 0 : 1].value;
  const float* v1 = tb[1].value;
  const work_range<W> range = work_range<W>::of(items, count, total);
  std::int64_t j = range.j;
  for (std::int64_t wb = range.first; wb < range.last; ++wb) {
    j = range.advance(items, count, j, wb);
    const optim_item it = items[j];
    const std::int64_t b = wb - it.block0, i0 = b * sh.block;
    const std::int64_t end = min(it.n, i0 + sh.block);
    float s0 = 0.0f, s1 = 0.0f;
    bool bad = false;
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const std::int64_t i = i0 + r + k * grp::lanes;
      if (i < end) {
        const d::prepass_terms e = d::prepass_element(sh, it, v0, v1, i, b);
        bad |= !e.ok;
        s0 = s0 + e.a;
        s1 = s1 + e.b;
      }
    }
    bad = grp::any(bad);
    const float sum0 = grp::sum_of(s0, red);
    const float sum1 = two ? grp::sum_of(s1, red) : 0.0f;
    if (r == 0) {
      const bool out = bad || !optim_ops::finite(sum0) || !optim_ops::finite(sum1);
      partial[2 * wb] = out ? d::excluded_partial : sum0;
      partial[2 * wb + 1] = out ? 0.0f : sum1;
    }
  }
}

// One CUDA block per tensor: the tensor's pair (eta, decay) from its block partials.
__global__ void __launch_bounds__(optim_threads)
    tensor_pair_kernel(optim_shared sh, const optim_item* items, const float* partial,
                       float* eta_decay) {
  __shared__ double lane0[optim_threads], lane1[optim_threads];
  __shared__ unsigned long long cnt[optim_threads];
  const optim_item it = items[blockIdx.x];
  const std::int64_t blocks = (it.n + sh.block - 1) / sh.block;
  double s0 = 0.0, s1 = 0.0;
  std::int64_t c = 0;
  for (std::int64_t b = threadIdx.x; b < blocks; b += optim_threads) {
    const float* v = partial + 2 * (it.block0 + b);
    if (v[0] == d::excluded_partial)
      continue;
    s0 = s0 + static_cast<double>(v[0]);
    s1 = s1 + static_cast<double>(v[1]);
    c += min(sh.block, it.n - b * sh.block);
  }
  lane0[threadIdx.x] = s0;
  lane1[threadIdx.x] = s1;
  cnt[threadIdx.x] = static_cast<unsigned long long>(c);
  __syncthreads();
  for (int off = optim_threads / 2; off > 0; off >>= 1) {
    if (static_cast<int>(threadIdx.x) < off) {
      lane0[threadIdx.x] = lane0[threadIdx.x] + lane0[threadIdx.x + off];
      lane1[threadIdx.x] = lane1[threadIdx.x] + lane1[threadIdx.x + off];
      cnt[threadIdx.x] += cnt[threadIdx.x + off];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float e = 0.0f, dc = 0.0f;
    d::tensor_pair(sh, lane0[0], lane1[0], static_cast<std::int64_t>(cnt[0]), e, dc);
    eta_decay[2 * blockIdx.x] = e;
    eta_decay[2 * blockIdx.x + 1] = dc;
  }
}

// The stochastically rounded code of state q's value x of element i of tensor j, out of line:
// Philox's rounds, inlined for each of a lane's elements, would grow the kernel's body several
// times over for a mode that is rarely on.
__device__ __noinline__ std::uint8_t stochastic_code(const bops::tables& tq, float x,
                                                     std::uint32_t amax, const optim_shared& sh,
                                                     std::int64_t j, int q, std::int64_t i) {
  return d::encode_state(tq, x, amax, true, d::random_bits(sh, j, q, i));
}

// Writes state q of one work block: float32 values, or the block's absmax and codes. Takes the
// lane's values as an array reference, so that after inlining they stay in registers.
template <int W>
__device__ __forceinline__ void
store_state(const float (&sv)[EPT], int q, const optim_item& it, std::int64_t j, std::int64_t b,
            std::int64_t i0, std::int64_t end, const optim_shared& sh, const bops::tables& tq,
            const std::uint32_t* bq, std::uint32_t* red) {
  using grp = lane_group<W>;
  const int r = grp::rank();
  void* dst = q == 0 ? it.s1 : it.s2;
  if (!it.eight_bit) {
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const std::int64_t i = i0 + r + k * grp::lanes;
      if (i < end)
        static_cast<float*>(dst)[i] = sv[k];
    }
    return;
  }
  std::uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < EPT; ++k)
    m = max(m, bops::abs_bits(sv[k])); // out-of-range slots hold 0
  const std::uint32_t amax = grp::max_of(m, red);
  if (r == 0)
    (q == 0 ? it.a1 : it.a2)[b] = __uint_as_float(amax);
#pragma unroll
  for (int k = 0; k < EPT; ++k) {
    const std::int64_t i = i0 + r + k * grp::lanes;
    if (i < end) {
      std::uint8_t code;
      if (sh.stochastic) {
        code = stochastic_code(tq, sv[k], amax, sh, j, q, i);
      } else { // |t| <= 1, not NaN: the bucket search equals nearest_index
        const float t = bops::normalized(sv[k], amax);
        code = static_cast<std::uint8_t>(bops::nearest_by_buckets(bq, tq.sum_hi, tq.sum_lo, t));
      }
      static_cast<std::uint8_t*>(dst)[i] = code;
    }
  }
}

// One instance per optimizer K (sh.kind): the body holds one update, which keeps it small
// enough for the instruction caches (with every update inlined eight times over, stalls on
// instruction fetch dominated).
template <int W, optimizer K>
__global__ void __launch_bounds__(optim_threads)
    step_kernel(optim_shared sh, const optim_item* items, std::int64_t count, std::int64_t total,
                const bops::tables* tabs, const std::uint32_t* bks, const float* eta_decay,
                const float* partial, std::int64_t* skipped) {
  using grp = lane_group<W>;
  __shared__ bops::tables tb[2]; // signed, unsigned
  __shared__ std::uint32_t bk[2][bops::bucket_count];
  __shared__ std::uint32_t red[warps];
  for (int k = threadIdx.x; k < 2 * static_cast<int>(bops::bucket_count); k += blockDim.x)
    (&bk[0][0])[k] = bks[k];
  load_tables(tabs, tb); // synchronizes
  const int ns = sh.states;
  const int t0 = d::state_signed(sh.kind, 0) ? 0 : 1;
  const int t1 = d::state_signed(sh.kind, 1) ? 0 : 1;
  const int r = grp::rank();
  const work_range<W> range = work_range<W>::of(items, count, total);
  std::int64_t j = range.j;
  for (std::int64_t wb = range.first; wb < range.last; ++wb) {
    j = range.advance(items, count, j, wb);
    const optim_item it = items[j];
    const std::int64_t b = wb - it.block0, i0 = b * sh.block;
    const std::int64_t end = min(it.n, i0 + sh.block);
    float eta = sh.eta0, decay = sh.decay0;
    if (eta_decay != nullptr) {
      eta = eta_decay[2 * j];
      decay = eta_decay[2 * j + 1];
    }
    float np[EPT], s1[EPT], s2[EPT];
    // A block the pre-pass left out of its tensor's sums is left untouched too.
    bool bad = partial != nullptr && partial[2 * wb] == d::excluded_partial;
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const std::int64_t i = i0 + r + k * grp::lanes;
      np[k] = s1[k] = s2[k] = 0.0f;
      if (i < end) {
        const float p0 = d::load_param(it, i);
        const float g = d::load_param(it.ptype, it.grad, i);
        const float a = ns > 0 ? d::load_state(it, 0, tb[t0].value, i, b) : 0.0f;
        const float c = ns > 1 ? d::load_state(it, 1, tb[t1].value, i, b) : 0.0f;
        const optim_ops::result res = d::update(K, sh, eta, decay, p0, g, a, c);
        np[k] = res.p;
        s1[k] = res.s1;
        s2[k] = res.s2;
        bad |= !optim_ops::finite(g) | !optim_ops::finite(d::stored_value(it, res.p)) |
               (ns > 0 && !optim_ops::finite(res.s1)) | (ns > 1 && !optim_ops::finite(res.s2));
      }
    }
    if (grp::any(bad)) {
      if (r == 0 && skipped != nullptr)
        atomicAdd(reinterpret_cast<unsigned long long*>(skipped + j), 1ull);
      continue;
    }
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const std::int64_t i = i0 + r + k * grp::lanes;
      if (i < end)
        d::store_param(it, i, np[k]);
    }
    if (ns > 0)
      store_state<W>(s1, 0, it, j, b, i0, end, sh, tb[t0], bk[t0], red);
    if (ns > 1)
      store_state<W>(s2, 1, it, j, b, i0, end, sh, tb[t1], bk[t1], red);
  }
}

// The bucket tables of the two dynamic maps (blockwise_ops.hpp), built on the host once per
// process: the step kernel's nearest-entry search, equal to nearest_index for every |t| <= 1.
struct bucket_tables {
  std::uint32_t u[2][bops::bucket_count]; // signed, unsigned
};
const bucket_tables& buckets_of(const optim_problem& p) {
  static const bucket_tables bt = [&] {
    bucket_tables b;
    const bops::tables* t[2] = {&p.tb_signed, &p.tb_unsigned};
    for (int k = 0; k < 2; ++k)
      for (std::uint32_t u = 0; u < bops::bucket_count; ++u)
        b.u[k][u] = bops::bucket_entry(t[k]->sum_hi, t[k]->sum_lo, u);
    return b;
  }();
  return bt;
}

// CUDA blocks for `total` work blocks taken by groups of W warps: as many as fit on the device
// at once (each group walks its range), fewer where there are fewer work blocks.
// The kernel is a template argument: once_per_device caches per lambda type, which is then one
// per kernel (kernels of one signature would otherwise share an entry).
template <int W, auto kernel> unsigned grid_of(std::int64_t total) {
  const int per_sm = once_per_device([](int) {
    int b = 0;
    LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, optim_threads, 0));
    return b < 1 ? 1 : b;
  });
  const std::int64_t cap = static_cast<std::int64_t>(sm_count()) * per_sm;
  const std::int64_t need = (total + lane_group<W>::per_block - 1) / lane_group<W>::per_block;
  return static_cast<unsigned>(need < cap ? need : cap);
}

template <int W> void launch(const optim_problem& p, const exec& ex) {
  const cudaStream_t s = stream_of(ex);
  const std::int64_t count = static_cast<std::int64_t>(p.items.size());
  // One upload: the tensor table, then the two codebooks' tables.
  const std::size_t items_bytes = sizeof(optim_item) * p.items.size();
  const std::size_t tab_off = (items_bytes + 255) / 256 * 256;
  const std::size_t bk_off = tab_off + 2 * sizeof(bops::tables);
  std::vector<unsigned char> host(bk_off + sizeof(bucket_tables));
  std::memcpy(host.data() + bk_off, &buckets_of(p), sizeof(bucket_tables));
  std::memcpy(host.data(), p.items.data(), items_bytes);
  std::memcpy(host.data() + tab_off, &p.tb_signed, sizeof(bops::tables));
  std::memcpy(host.data() + tab_off + sizeof(bops::tables), &p.tb_unsigned, sizeof(bops::tables));
  scratch table(host.size(), s);
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(table.as<unsigned char>(), host.data(), host.size(),
                                    cudaMemcpyHostToDevice, s));
  const auto* items = table.as<const optim_item>();
  const auto* tabs = reinterpret_cast<const bops::tables*>(table.as<unsigned char>() + tab_off);
  const auto* bks = reinterpret_cast<const std::uint32_t*>(table.as<unsigned char>() + bk_off);
  const bool pre = p.sh.prepass;
  scratch extra(pre ? sizeof(float) * static_cast<std::size_t>(2 * p.total_blocks + 2 * count) : 4,
                s);
  float *eta_decay = nullptr, *partial = nullptr;
  if (pre) {
    partial = extra.as<float>();
    eta_decay = partial + 2 * p.total_blocks;
    prepass_kernel<W><<<grid_of<W, prepass_kernel<W>>(p.total_blocks), optim_threads, 0, s>>>(
        p.sh, items, count, p.total_blocks, tabs, partial);
    check_launch("prepass_kernel");
    tensor_pair_kernel<<<static_cast<unsigned>(count), optim_threads, 0, s>>>(p.sh, items, partial,
                                                                              eta_decay);
    check_launch("tensor_pair_kernel");
  }
  const auto run = [&](auto kind) {
    constexpr auto kernel = step_kernel<W, decltype(kind)::value>;
    kernel<<<grid_of<W, kernel>(p.total_blocks), optim_threads, 0, s>>>(
        p.sh, items, count, p.total_blocks, tabs, bks, eta_decay, partial, p.skipped);
    check_launch("step_kernel");
  };
  using o = optimizer;
  switch (p.sh.kind) {
  case o::adam: return run(std::integral_constant<o, o::adam>{});
  case o::adamw: return run(std::integral_constant<o, o::adamw>{});
  case o::stable_adamw: return run(std::integral_constant<o, o::stable_adamw>{});
  case o::sgd: return run(std::integral_constant<o, o::sgd>{});
  case o::lion: return run(std::integral_constant<o, o::lion>{});
  case o::rmsprop: return run(std::integral_constant<o, o::rmsprop>{});
  case o::lamb: return run(std::integral_constant<o, o::lamb>{});
  case o::lars: return run(std::integral_constant<o, o::lars>{});
  default: return run(std::integral_constant<o, o::adagrad>{});
  }
}

} // namespace

void optimizer_step(const optim_problem& p, const exec& ex) {
  if (optim_lanes(p.sh.block) == optim_threads)
    launch<warps>(p, ex); // blocks of 2048: the CUDA block
  else
    launch<1>(p, ex); // blocks of 256: a warp
}

} // namespace lowbit::kernels::cuda
