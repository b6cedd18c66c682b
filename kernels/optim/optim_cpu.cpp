// CPU twin of the fused optimizer steps: the per-element updates of optim_ops.hpp and the
// block-level code of optim_internal.hpp, work blocks processed in parallel. Block maxima and the
// skip decision are order-free; the per-tensor pre-pass sums (StableAdamW's RMS, LAMB's and
// LARS' squared norms) are summed in the CUDA kernel's tree (each of the work block's block / 8
// lanes sums its eight elements in slot order, 4t .. 4t + 3 then 4 lanes + 4t .. for lane t,
// then each warp's 32 lanes pairwise by halving strides, then
// the warps so, where there are several; the tensor's block partials in double, 256 lanes in
// order then halving strides), so the results equal the GPU's bit for bit.
#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "../blockwise/blockwise_internal.hpp"
#include "../common/cpu.hpp"
#include "optim_internal.hpp"

namespace lowbit::kernels::cpu {

namespace {

namespace d = optim_detail;
namespace bops = blockwise_ops;

// The tensor that work block wb belongs to (the last one whose first block is <= wb).
std::int64_t tensor_of(const optim_problem& p, std::int64_t wb) {
  const auto it =
      std::upper_bound(p.items.begin(), p.items.end(), wb,
                       [](std::int64_t v, const optim_item& x) { return v < x.block0; });
  return static_cast<std::int64_t>(it - p.items.begin()) - 1;
}

// The kernel's sum of one float per lane of a work block (lanes: a multiple of 32, at most
// optim_threads).
float tree_sum(float* lane, int lanes) {
  const int nw = lanes / 32;
  for (int w = 0; w < nw; ++w)
    for (int off = 16; off > 0; off >>= 1)
      for (int l = 0; l < off; ++l)
        lane[32 * w + l] = lane[32 * w + l] + lane[32 * w + l + off];
  float warp[optim_threads / 32];
  for (int w = 0; w < nw; ++w)
    warp[w] = lane[32 * w];
  for (int off = nw / 2; off > 0; off >>= 1)
    for (int l = 0; l < off; ++l)
      warp[l] = warp[l] + warp[l + off];
  return warp[0];
}

// The pre-pass over work block b of tensor it: its two partial sums (partial[0], partial[1]), or
// excluded_partial in partial[0].
void prepass_partial(const optim_problem& p, const optim_item& it, std::int64_t b, float* partial) {
  const std::int64_t block = p.sh.block, i0 = (b - it.block0) * block;
  const bool two = p.sh.kind != optimizer::stable_adamw;
  const float* v0 = d::state_signed(p.sh.kind, 0) ? p.tb_signed.value : p.tb_unsigned.value;
  const float* v1 = p.tb_unsigned.value;
  const int lanes = optim_lanes(block);
  float lane0[optim_threads], lane1[optim_threads];
  std::uint32_t big = 0;
  const std::int64_t end = std::min(it.n, i0 + block);
  for (int t = 0; t < lanes; ++t) {
    float s0 = 0.0f, s1 = 0.0f;
    // Lane t's elements in the kernel's slot order: 4t .. 4t + 3, then 4 lanes + 4t .. (the
    // step kernel's lane_slots).
    for (int k = 0; k < optim_per_lane; ++k) {
      const std::int64_t i = i0 + 4 * ((k >> 2) * lanes + t) + (k & 3);
      if (i >= end)
        continue;
      const d::prepass_terms e = d::prepass_element(p.sh, it, v0, v1, i, b - it.block0);
      big = std::max(big, e.big);
      s0 = s0 + e.a;
      s1 = s1 + e.b;
    }
    lane0[t] = s0;
    lane1[t] = s1;
  }
  const float sum0 = tree_sum(lane0, lanes), sum1 = two ? tree_sum(lane1, lanes) : 0.0f;
  const bool bad = d::prepass_excluded(big, sum0, sum1);
  partial[0] = bad ? d::excluded_partial : sum0;
  partial[1] = bad ? 0.0f : sum1;
}

// The kernel's per-tensor totals of the block partials, then the tensor's pair.
void tensor_eta(const optim_problem& p, const optim_item& it, const float* partial, float& eta,
                float& decay) {
  const std::int64_t blocks = blockwise_blocks(it.n, p.sh.block);
  double lane0[optim_threads], lane1[optim_threads];
  std::int64_t count = 0;
  for (int t = 0; t < optim_threads; ++t) {
    double s0 = 0.0, s1 = 0.0;
    for (std::int64_t b = t; b < blocks; b += optim_threads) {
      const float* v = partial + 2 * (it.block0 + b);
      if (v[0] == d::excluded_partial)
        continue;
      s0 = s0 + static_cast<double>(v[0]);
      s1 = s1 + static_cast<double>(v[1]);
      count += std::min(p.sh.block, it.n - b * p.sh.block);
    }
    lane0[t] = s0;
    lane1[t] = s1;
  }
  for (int off = optim_threads / 2; off > 0; off >>= 1)
    for (int l = 0; l < off; ++l) {
      lane0[l] = lane0[l] + lane0[l + off];
      lane1[l] = lane1[l] + lane1[l + off];
    }
  d::tensor_pair(p.sh, lane0[0], lane1[0], count, eta, decay);
}

void step_block(const optim_problem& p, std::int64_t j, std::int64_t wb, float eta, float decay,
                const float* partial, const std::uint32_t* const* buckets) {
  const optim_item& it = p.items[static_cast<std::size_t>(j)];
  const std::int64_t block = p.sh.block, b = wb - it.block0, i0 = b * block;
  const std::int64_t m = std::min(block, it.n - i0);
  const int ns = p.sh.states;
  const auto table = [&](int k) {
    return d::state_signed(p.sh.kind, k) ? &p.tb_signed : &p.tb_unsigned;
  };
  const bops::tables* tb[3] = {table(0), table(1), table(2)};
  float np[2048], s1[2048], s2[2048], s3[2048];
  // A block the pre-pass left out of its tensor's sums is left untouched too.
  bool bad = partial != nullptr && partial[2 * wb] == d::excluded_partial;
  for (std::int64_t e = 0; e < m; ++e) {
    const std::int64_t i = i0 + e;
    const float p0 = d::load_param(it, i);
    const float g = d::load_param(it.ptype, it.grad, i);
    const float a = ns > 0 ? d::load_state(it, 0, tb[0]->value, i, b) : 0.0f;
    const float c = ns > 1 ? d::load_state(it, 1, tb[1]->value, i, b) : 0.0f;
    const float x = ns > 2 ? d::load_state(it, 2, tb[2]->value, i, b) : 0.0f;
    optim_ops::result3 r;
    if (ns > 2) {
      r = d::update<true>(p.sh.kind, p.sh, eta, decay, p0, g, a, c, x);
    } else {
      const optim_ops::result r2 = d::update<false>(p.sh.kind, p.sh, eta, decay, p0, g, a, c, x);
      r = {r2.p, r2.s1, r2.s2, 0.0f};
    }
    np[e] = r.p;
    s1[e] = r.s1;
    s2[e] = r.s2;
    s3[e] = r.s3;
    bad |= !optim_ops::finite(g) | !optim_ops::finite(d::stored_value(it, r.p)) |
           (ns > 0 && !optim_ops::finite(r.s1)) | (ns > 1 && !optim_ops::finite(r.s2)) |
           (ns > 2 && !optim_ops::finite(r.s3));
  }
  if (bad) {
    if (p.skipped != nullptr)
      std::atomic_ref<std::int64_t>(p.skipped[j]).fetch_add(1, std::memory_order_relaxed);
    return;
  }
  for (std::int64_t e = 0; e < m; ++e)
    d::store_param(it, i0 + e, np[e]);
  float* sv[3] = {s1, s2, s3};
  void* dst[3] = {it.s1, it.s2, it.s3};
  float* am[3] = {it.a1, it.a2, it.a3};
  const int streams = d::random_streams(ns);
  for (int k = 0; k < ns; ++k) {
    if (!it.eight_bit) {
      std::copy(sv[k], sv[k] + m, static_cast<float*>(dst[k]) + i0);
      continue;
    }
    std::uint32_t amax = 0;
    for (std::int64_t e = 0; e < m; ++e)
      amax = std::max(amax, bops::abs_bits(sv[k][e]));
    am[k][b] = emu::detail::bit_cast<float>(amax);
    auto* codes = static_cast<std::uint8_t*>(dst[k]);
    for (std::int64_t e = 0; e < m; ++e) {
      const std::uint32_t rb = p.sh.stochastic ? d::random_bits(p.sh, streams, j, k, i0 + e) : 0u;
      // Nearest: through the bucket table (amax is finite here: encode_nearest's zero code is
      // never taken).
      codes[i0 + e] = static_cast<std::uint8_t>(
          p.sh.stochastic ? d::encode_state(*tb[k], sv[k][e], amax, true, rb)
                          : bops::encode_nearest(*tb[k], buckets[k], sv[k][e], amax, 0u));
    }
  }
}

} // namespace

void optimizer_step(const optim_problem& p, const exec& ex) {
  const std::int64_t nt = static_cast<std::int64_t>(p.items.size());
  std::vector<float> eta(static_cast<std::size_t>(nt), p.sh.eta0), decay(eta.size(), p.sh.decay0);
  const std::int64_t grain = std::max<std::int64_t>(1, (1 << 16) / p.sh.block);
  std::vector<float> partial;
  if (p.sh.prepass) {
    partial.resize(2 * static_cast<std::size_t>(p.total_blocks));
    parallel_for(
        p.total_blocks, ex.threads,
        [&](std::int64_t b0, std::int64_t b1) {
          for (std::int64_t wb = b0; wb < b1; ++wb)
            prepass_partial(p, p.items[static_cast<std::size_t>(tensor_of(p, wb))], wb,
                            partial.data() + 2 * wb);
        },
        grain);
    for (std::int64_t j = 0; j < nt; ++j)
      tensor_eta(p, p.items[static_cast<std::size_t>(j)], partial.data(),
                 eta[static_cast<std::size_t>(j)], decay[static_cast<std::size_t>(j)]);
  }
  // The dynamic maps' bucket tables (the twin's nearest-entry search, bops::encode_nearest).
  const std::shared_ptr<const std::uint32_t[]> tables[2] = {bucket_table(p.tb_signed),
                                                            bucket_table(p.tb_unsigned)};
  const std::uint32_t* buckets[3];
  for (int k = 0; k < 3; ++k)
    buckets[k] = tables[d::state_signed(p.sh.kind, k) ? 0 : 1].get();
  parallel_for(
      p.total_blocks, ex.threads,
      [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t wb = b0; wb < b1; ++wb) {
          const std::int64_t j = tensor_of(p, wb);
          step_block(p, j, wb, eta[static_cast<std::size_t>(j)], decay[static_cast<std::size_t>(j)],
                     partial.empty() ? nullptr : partial.data(), buckets);
        }
      },
      grain);
}

} // namespace lowbit::kernels::cpu
