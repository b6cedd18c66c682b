// CPU twin of the activation quantization: the per-group min/max reduction (per-thread partial
// results merged afterwards: min and max are exact, so the chunking does not matter), the update
// of the estimates, and the element-wise quantize and dequantize, all through actquant_ops.hpp.
#include <algorithm>
#include <mutex>
#include <vector>

#include "../common/cpu.hpp"
#include "../common/element_ops.hpp"
#include "actquant_internal.hpp"

namespace lowbit::kernels::cpu {

namespace {

namespace ops = actquant_ops;

template <class In> const In* input(const tensor_view& v) {
  return static_cast<const In*>(v.data);
}

template <class In> void update_estimates(const actquant_problem& p, const exec& ex) {
  const In* x = input<In>(p.x);
  const auto groups = static_cast<std::size_t>(p.group.groups);
  std::vector<ops::minmax> all(groups);
  std::mutex merging;
  parallel_for(p.n, ex.threads, [&](std::int64_t b, std::int64_t e) {
    std::vector<ops::minmax> mm(groups);
    std::int64_t i = b;
    while (i < e) {
      // One run of the same group at a time.
      const std::int64_t g = p.group(i);
      const std::int64_t end = std::min(e, (i / p.group.run + 1) * p.group.run);
      ops::minmax& m = mm[static_cast<std::size_t>(g)];
      for (; i < end; ++i)
        m.add(element_ops::load(x[i]));
    }
    const std::lock_guard<std::mutex> lock(merging);
    for (std::size_t g = 0; g < groups; ++g)
      all[g].merge(mm[g]);
  });
  for (std::size_t g = 0; g < groups; ++g) {
    const ops::estimate e = ops::update({p.alpha[g], p.beta[g]}, all[g], p.momentum);
    p.alpha[g] = e.alpha;
    p.beta[g] = e.beta;
  }
}

template <class In> void quantize_elements(const actquant_problem& p, const exec& ex) {
  const In* x = input<In>(p.x);
  auto* codes = static_cast<std::uint8_t*>(p.codes.data);
  const bool stochastic = p.pol.round == emu::rounding::stochastic;
  parallel_for(p.n, ex.threads, [&](std::int64_t b, std::int64_t e) {
    std::int64_t i = b;
    while (i < e) {
      const std::int64_t g = p.group(i);
      const ops::step st = ops::step_of({p.alpha[g], p.beta[g]});
      const std::int64_t end = std::min(e, (i / p.group.run + 1) * p.group.run);
      if (p.pol.round == emu::rounding::nearest_even) {
        for (; i < end; ++i)
          codes[i] = ops::quantize_nearest(element_ops::load(x[i]), st);
        continue;
      }
      if (!stochastic) {
        for (; i < end; ++i)
          codes[i] = ops::quantize(element_ops::load(x[i]), st, p.pol, 0u);
        continue;
      }
      // One Philox evaluation per four elements (element i draws word i % 4 of block i / 4).
      emu::philox_block blk = p.rng.block(static_cast<std::uint64_t>(i) >> 2);
      for (; i < end; ++i) {
        if ((i & 3) == 0)
          blk = p.rng.block(static_cast<std::uint64_t>(i) >> 2);
        codes[i] = ops::quantize(element_ops::load(x[i]), st, p.pol, blk.v[i & 3]);
      }
    }
  });
}

template <class Out, class Store>
void dequantize_elements(const actquant_problem& p, const exec& ex, Store store) {
  const auto* codes = static_cast<const std::uint8_t*>(p.codes.data);
  Out* out = static_cast<Out*>(p.out.data);
  parallel_for(p.n, ex.threads, [&](std::int64_t b, std::int64_t e) {
    std::int64_t i = b;
    while (i < e) {
      const std::int64_t g = p.group(i);
      const ops::estimate est{p.alpha[g], p.beta[g]};
      const std::int64_t end = std::min(e, (i / p.group.run + 1) * p.group.run);
      for (; i < end; ++i)
        out[i] = store(ops::canonical(ops::dequantize(codes[i], est)));
    }
  });
}

} // namespace

void actquant_quantize(const actquant_problem& p, const exec& ex) {
  element_ops::dispatch_input(p.x.type, [&](auto tag) {
    using In = decltype(tag);
    if (p.update && !p.lagged)
      update_estimates<In>(p, ex);
    if (p.quantize)
      quantize_elements<In>(p, ex);
    if (p.lagged)
      update_estimates<In>(p, ex);
  });
}

void actquant_dequantize(const actquant_problem& p, const exec& ex) {
  switch (p.out.type) {
  case dtype::bfloat16:
    dequantize_elements<std::uint16_t>(p, ex, [](float v) { return actquant_ops::to_bf16(v); });
    break;
  case dtype::float16:
    dequantize_elements<std::uint16_t>(p, ex, [](float v) { return actquant_ops::to_f16(v); });
    break;
  default: dequantize_elements<float>(p, ex, [](float v) { return v; }); break;
  }
}

} // namespace lowbit::kernels::cpu
