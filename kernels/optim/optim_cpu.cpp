// CPU twin of the fused optimizer steps: the per-element updates of optim_ops.hpp and the
// block-level code of optim_internal.hpp, work blocks processed in parallel. Block maxima and the
// skip decision are order-free; StableAdamW's RMS is summed in the CUDA kernel's tree (each of
// the work block's block / 8 lanes sums its elements in order, then each warp's 32 lanes pairwise
// by halving strides, then the warps so, where there are several; the tensor's block partials in
// double, 256 lanes in order then halving strides), so the results equal the GPU's bit for bit.
#include <algorithm>
#include <atomic>
#include <vector>

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

// StableAdamW's first pass over work block b of tensor it: the partial sum of its RMS terms, or
// excluded_partial.
float rms_partial(const optim_problem& p, const optim_item& it, std::int64_t b) {
  const std::int64_t block = p.sh.block, i0 = (b - it.block0) * block;
  const bops::tables& tu = p.tb_unsigned;
  const int lanes = optim_lanes(block);
  float lane[optim_threads];
  bool bad = false;
  for (int t = 0; t < lanes; ++t) {
    float s = 0.0f;
    for (std::int64_t i = i0 + t; i < std::min(it.n, i0 + block); i += lanes) {
      const float g = d::load_param(it.ptype, it.grad, i);
      const float v = d::load_state(it, 1, tu.value, i, b - it.block0);
      const float gg = p.sh.c.maximize ? -g : g;
      const float vn = optim_ops::stable_v(p.sh.c, gg, v);
      const float r = optim_ops::stable_rms_term(p.sh.c, gg, vn);
      bad |= !optim_ops::finite(g) | !optim_ops::finite(vn) | !optim_ops::finite(r);
      s = s + r;
    }
    lane[t] = s;
  }
  return bad ? d::excluded_partial : tree_sum(lane, lanes);
}

// The kernel's per-tensor total of the block partials.
void tensor_eta(const optim_problem& p, const optim_item& it, const float* partial, float& eta,
                float& decay) {
  const std::int64_t blocks = blockwise_blocks(it.n, p.sh.block);
  double lane[optim_threads];
  std::int64_t count = 0;
  for (int t = 0; t < optim_threads; ++t) {
    double s = 0.0;
    for (std::int64_t b = t; b < blocks; b += optim_threads) {
      const float v = partial[it.block0 + b];
      if (v == d::excluded_partial)
        continue;
      s = s + static_cast<double>(v);
      count += std::min(p.sh.block, it.n - b * p.sh.block);
    }
    lane[t] = s;
  }
  for (int off = optim_threads / 2; off > 0; off >>= 1)
    for (int l = 0; l < off; ++l)
      lane[l] = lane[l] + lane[l + off];
  d::stable_eta(p.sh, lane[0], count, eta, decay);
}

void step_block(const optim_problem& p, std::int64_t j, std::int64_t wb, float eta, float decay) {
  const optim_item& it = p.items[static_cast<std::size_t>(j)];
  const std::int64_t block = p.sh.block, b = wb - it.block0, i0 = b * block;
  const std::int64_t m = std::min(block, it.n - i0);
  const int ns = p.sh.states;
  const bops::tables* tb[2] = {d::state_signed(p.sh.kind, 0) ? &p.tb_signed : &p.tb_unsigned,
                               d::state_signed(p.sh.kind, 1) ? &p.tb_signed : &p.tb_unsigned};
  float np[2048], s1[2048], s2[2048];
  bool bad = false;
  for (std::int64_t e = 0; e < m; ++e) {
    const std::int64_t i = i0 + e;
    const float p0 = d::load_param(it, i);
    const float g = d::load_param(it.ptype, it.grad, i);
    const float a = ns > 0 ? d::load_state(it, 0, tb[0]->value, i, b) : 0.0f;
    const float c = ns > 1 ? d::load_state(it, 1, tb[1]->value, i, b) : 0.0f;
    const optim_ops::result r = d::update(p.sh.kind, p.sh, eta, decay, p0, g, a, c);
    np[e] = r.p;
    s1[e] = r.s1;
    s2[e] = r.s2;
    bad |= !optim_ops::finite(g) | !optim_ops::finite(d::stored_value(it, r.p)) |
           (ns > 0 && !optim_ops::finite(r.s1)) | (ns > 1 && !optim_ops::finite(r.s2));
  }
  if (bad) {
    if (p.skipped != nullptr)
      std::atomic_ref<std::int64_t>(p.skipped[j]).fetch_add(1, std::memory_order_relaxed);
    return;
  }
  for (std::int64_t e = 0; e < m; ++e)
    d::store_param(it, i0 + e, np[e]);
  float* sv[2] = {s1, s2};
  void* dst[2] = {it.s1, it.s2};
  float* am[2] = {it.a1, it.a2};
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
      const std::uint32_t rb = p.sh.stochastic ? d::random_bits(p.sh, j, k, i0 + e) : 0u;
      codes[i0 + e] = d::encode_state(*tb[k], sv[k][e], amax, p.sh.stochastic, rb);
    }
  }
}

} // namespace

void optimizer_step(const optim_problem& p, const exec& ex) {
  const std::int64_t nt = static_cast<std::int64_t>(p.items.size());
  std::vector<float> eta(static_cast<std::size_t>(nt), p.sh.c.lr), decay(eta.size(), 1.0f);
  const std::int64_t grain = std::max<std::int64_t>(1, (1 << 16) / p.sh.block);
  if (p.sh.kind == optimizer::stable_adamw) {
    std::vector<float> partial(static_cast<std::size_t>(p.total_blocks));
    parallel_for(
        p.total_blocks, ex.threads,
        [&](std::int64_t b0, std::int64_t b1) {
          for (std::int64_t wb = b0; wb < b1; ++wb)
            partial[static_cast<std::size_t>(wb)] =
                rms_partial(p, p.items[static_cast<std::size_t>(tensor_of(p, wb))], wb);
        },
        grain);
    for (std::int64_t j = 0; j < nt; ++j)
      tensor_eta(p, p.items[static_cast<std::size_t>(j)], partial.data(),
                 eta[static_cast<std::size_t>(j)], decay[static_cast<std::size_t>(j)]);
  }
  parallel_for(
      p.total_blocks, ex.threads,
      [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t wb = b0; wb < b1; ++wb) {
          const std::int64_t j = tensor_of(p, wb);
          step_block(p, j, wb, eta[static_cast<std::size_t>(j)],
                     decay[static_cast<std::size_t>(j)]);
        }
      },
      grain);
}

} // namespace lowbit::kernels::cpu
