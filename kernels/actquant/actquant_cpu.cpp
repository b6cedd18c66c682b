// CPU twin of the activation quantization: the per-group min/max reduction (per-thread partial
// results merged afterwards: min and max are exact, so the chunking does not matter), the update
// of the estimates, and the element-wise quantize and dequantize, all through actquant_ops.hpp;
// the backward passes that read codes (LayerNorm's, in the row order of actquant_ops.hpp, and
// the activations', through activation_ops.hpp).
#include <algorithm>
#include <mutex>
#include <type_traits>
#include <vector>

#include "../common/cpu.hpp"
#include "../common/element_ops.hpp"
#include "activation_ops.hpp"
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

// Calls fn(g, begin, end) for each run [begin, end) of consecutive elements of group g in
// [0, n), the runs split across threads.
template <class Fn>
void for_each_run(const ops::group_of& group, std::int64_t n, int threads, Fn&& fn) {
  parallel_for(n, threads, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e;) {
      const std::int64_t end = std::min(e, (i / group.run + 1) * group.run);
      fn(group(i), i, end);
      i = end;
    }
  });
}

template <class In> void quantize_elements(const actquant_problem& p, const exec& ex) {
  const In* x = input<In>(p.x);
  auto* codes = static_cast<std::uint8_t*>(p.codes.data);
  const bool stochastic = p.pol.round == emu::rounding::stochastic;
  for_each_run(p.group, p.n, ex.threads, [&](std::int64_t g, std::int64_t i, std::int64_t end) {
    const ops::step st = ops::step_of({p.alpha[g], p.beta[g]});
    if (p.pol.round == emu::rounding::nearest_even) {
      for (; i < end; ++i)
        codes[i] = ops::quantize_nearest(element_ops::load(x[i]), st);
      return;
    }
    if (!stochastic) {
      for (; i < end; ++i)
        codes[i] = ops::quantize(element_ops::load(x[i]), st, p.pol, 0u);
      return;
    }
    // One Philox evaluation per four elements (element i draws word i % 4 of block i / 4).
    emu::philox_block blk = p.rng.block(static_cast<std::uint64_t>(i) >> 2);
    for (; i < end; ++i) {
      if ((i & 3) == 0)
        blk = p.rng.block(static_cast<std::uint64_t>(i) >> 2);
      codes[i] = ops::quantize(element_ops::load(x[i]), st, p.pol, blk.v[i & 3]);
    }
  });
}

template <class Out, class Store>
void dequantize_elements(const actquant_problem& p, const exec& ex, Store store) {
  const auto* codes = static_cast<const std::uint8_t*>(p.codes.data);
  Out* out = static_cast<Out*>(p.out.data);
  for_each_run(p.group, p.n, ex.threads, [&](std::int64_t g, std::int64_t i, std::int64_t end) {
    const ops::estimate est{p.alpha[g], p.beta[g]};
    for (; i < end; ++i)
      out[i] = store(ops::canonical(ops::dequantize(codes[i], est)));
  });
}

// A dequantized input element as a backward reads it: stored as D (actquant_dequantize's
// value), read back as float.
template <class D> float stored_input(std::uint8_t code, ops::estimate e) {
  const float v = ops::canonical(ops::dequantize(code, e));
  if constexpr (std::is_same_v<D, element_ops::bf16_bits>)
    return element_ops::load(D{ops::to_bf16(v)});
  else if constexpr (std::is_same_v<D, element_ops::f16_bits>)
    return element_ops::load(D{ops::to_f16(v)});
  else
    return v;
}
template <class D> D stored_output(float v) {
  v = ops::canonical(v);
  if constexpr (std::is_same_v<D, element_ops::bf16_bits>)
    return D{ops::to_bf16(v)};
  else if constexpr (std::is_same_v<D, element_ops::f16_bits>)
    return D{ops::to_f16(v)};
  else
    return v;
}

// One chunk of rows [r0, r1): the rows' input gradients, and the chunk's float32 sums of
// gy xhat (pw) and gy (pb) per column.
template <class D>
void ln_chunk(const ln_backward_problem& p, std::int64_t r0, std::int64_t r1, float* pw,
              float* pb) {
  const std::int64_t C = p.cols;
  const auto n = static_cast<float>(C);
  const auto* gy_all = static_cast<const D*>(p.gy);
  std::vector<float> x(static_cast<std::size_t>(C)), gy(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c)
    pw[c] = pb[c] = 0.0f;
  const auto row_sum = [&](auto term) {
    float part[ops::ln_lanes] = {};
    for (std::int64_t c = 0; c < C; ++c)
      part[ops::ln_lane(c)] = part[ops::ln_lane(c)] + term(c);
    return ops::ln_combine(part);
  };
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::uint8_t* codes = p.codes + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t g = c / p.group_size;
      x[c] = stored_input<D>(codes[c], {p.alpha[g], p.beta[g]});
      gy[c] = element_ops::load(gy_all[r * C + c]);
    }
    const float mean = ops::div_rn(row_sum([&](std::int64_t c) { return x[c]; }), n);
    const float rstd = ops::ln_rstd(row_sum([&](std::int64_t c) {
                                      const float d = x[c] - mean;
                                      return d * d;
                                    }),
                                    n, p.eps);
    const auto xhat = [&](std::int64_t c) { return (x[c] - mean) * rstd; };
    const auto g = [&](std::int64_t c) { return p.weight ? gy[c] * p.weight[c] : gy[c]; };
    const float a = ops::div_rn(row_sum(g), n);
    const float b = ops::div_rn(row_sum([&](std::int64_t c) { return g(c) * xhat(c); }), n);
    D* gx = p.gx ? static_cast<D*>(p.gx) + r * C : nullptr;
    for (std::int64_t c = 0; c < C; ++c) {
      const float xh = xhat(c);
      if (gx)
        gx[c] = stored_output<D>(ops::ln_gx(g(c), xh, a, b, rstd));
      pw[c] = pw[c] + gy[c] * xh;
      pb[c] = pb[c] + gy[c];
    }
  }
}

// An element's input is one of a group's 256 dequantized values, so the derivative and the value
// are tabulated per group and code where the tables are smaller than the tensor (the same bits
// as evaluating them per element).
template <class D> void activation_elements(const act_backward_problem& p, const exec& ex) {
  const auto* dy = static_cast<const D*>(p.dy);
  D* gx = static_cast<D*>(p.gx);
  D* value = static_cast<D*>(p.value);
  const std::int64_t G = p.group.groups;
  const bool table = G * 256 <= p.n;
  std::vector<float> deriv(table ? static_cast<std::size_t>(G * 256) : 0), val(deriv.size());
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(deriv.size()); ++k) {
    const float x =
        stored_input<D>(static_cast<std::uint8_t>(k & 255), {p.alpha[k >> 8], p.beta[k >> 8]});
    deriv[static_cast<std::size_t>(k)] = activation_ops::derivative(p.f, x);
    val[static_cast<std::size_t>(k)] = value != nullptr ? activation_ops::value(p.f, x) : 0.0f;
  }
  for_each_run(p.group, p.n, ex.threads, [&](std::int64_t g, std::int64_t i, std::int64_t end) {
    const ops::estimate est{p.alpha[g], p.beta[g]};
    for (; i < end; ++i) {
      float d = 0.0f, v = 0.0f;
      if (table) {
        const auto k = static_cast<std::size_t>(g * 256 + p.codes[i]);
        d = deriv[k];
        v = val[k];
      } else {
        const float x = stored_input<D>(p.codes[i], est);
        d = activation_ops::derivative(p.f, x);
        v = value != nullptr ? activation_ops::value(p.f, x) : 0.0f;
      }
      gx[i] = stored_output<D>(activation_ops::gradient_of(p.f, d, element_ops::load(dy[i])));
      if (value != nullptr)
        value[i] = stored_output<D>(v);
    }
  });
}

// The chunks' sums of one column in float64: per segment of ln_segment chunks in order, then the
// segments in order (the CUDA kernels' two passes).
float ln_column_sum(const float* part, std::int64_t chunks, std::int64_t cols, std::int64_t c) {
  double total = 0.0;
  for (std::int64_t s0 = 0; s0 < chunks; s0 += ops::ln_segment) {
    double seg = 0.0;
    for (std::int64_t k = s0; k < std::min(chunks, s0 + ops::ln_segment); ++k)
      seg += static_cast<double>(part[k * cols + c]);
    total += seg;
  }
  return ops::canonical(static_cast<float>(total));
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

void actquant_layer_norm_backward(const ln_backward_problem& p, const exec& ex) {
  const std::int64_t K = p.chunks(), C = p.cols;
  // The chunks' column sums where a parameter gradient is wanted (else each thread's chunks
  // write theirs into one reused scratch row).
  const bool params = p.gw != nullptr || p.gb != nullptr;
  const std::int64_t slots = params ? K : 0;
  std::vector<float> pw(static_cast<std::size_t>(slots * C)), pb(pw.size());
  element_ops::dispatch_input(p.type, [&](auto tag) {
    using D = decltype(tag);
    if constexpr (!std::is_same_v<D, double>) {
      parallel_for(
          K, ex.threads,
          [&](std::int64_t b, std::int64_t e) {
            std::vector<float> own(params ? 0 : static_cast<std::size_t>(2 * C));
            for (std::int64_t k = b; k < e; ++k)
              ln_chunk<D>(p, k * ops::ln_chunk_rows, std::min(p.rows, (k + 1) * ops::ln_chunk_rows),
                          params ? pw.data() + k * C : own.data(),
                          params ? pb.data() + k * C : own.data() + C);
          },
          1);
    }
  });
  for (std::int64_t c = 0; c < C; ++c) {
    if (p.gw)
      p.gw[c] = ln_column_sum(pw.data(), K, C, c);
    if (p.gb)
      p.gb[c] = ln_column_sum(pb.data(), K, C, c);
  }
}

void actquant_activation_backward(const act_backward_problem& p, const exec& ex) {
  element_ops::dispatch_input(p.type, [&](auto tag) {
    using D = decltype(tag);
    if constexpr (!std::is_same_v<D, double>)
      activation_elements<D>(p, ex);
  });
}

} // namespace lowbit::kernels::cpu
