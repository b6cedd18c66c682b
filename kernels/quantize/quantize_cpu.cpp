// CPU twin of the quantization kernels: the per-element and per-group code of quantize_ops.hpp,
// with groups processed in parallel. Group amaxes are maxima (exact, order-free), so the results
// equal the GPU's bit for bit whatever either side's reduction order.
#include <algorithm>
#include <vector>

#include "../common/cpu.hpp"
#include "../common/dispatch.hpp"
#include "quantize_internal.hpp"
#include "quantize_ops.hpp"

namespace lowbit::kernels::cpu {

namespace {

using quant_ops::abs_bits;

struct rect {
  std::int64_t r0, r1, c0, c1;
  std::int64_t size() const { return (r1 - r0) * (c1 - c0); }
};

template <class In, class Code, class FT, class PT> struct quantizer {
  const quant_problem& p;
  FT ft;
  PT pt;
  const In* x = p.x.template ptr<const In>();
  Code* codes = p.codes.template ptr<Code>();

  float load(std::int64_t r, std::int64_t c) const {
    return element_ops::load(x[r * p.xm.row_stride + c]);
  }

  std::uint32_t amax_bits(const rect& g) const {
    std::uint32_t m = 0;
    for (std::int64_t r = g.r0; r < g.r1; ++r)
      for (std::int64_t c = g.c0; c < g.c1; ++c)
        m = std::max(m, abs_bits(load(r, c)));
    return m;
  }

  void cast(const rect& g, float q) const {
    const std::int64_t n = p.xm.cols;
    for (std::int64_t r = g.r0; r < g.r1; ++r)
      for (std::int64_t c = g.c0; c < g.c1; ++c) {
        const std::uint64_t i = static_cast<std::uint64_t>(r * n + c);
        const std::uint32_t rb = pt.stochastic() ? p.rng.bits(i) : 0u;
        const auto code =
            static_cast<Code>(quant_ops::quantize_element(p.t, ft, pt, load(r, c), q, rb));
        if (p.transpose)
          codes[c * p.cm.row_stride + r] = code;
        else
          codes[r * p.cm.row_stride + c] = code;
      }
  }

  quant_ops::group_scale scale(std::uint32_t amax) const {
    return quant_ops::scale_from_amax(amax, p.target_max, p.sc);
  }

  // The tensor's amax, reduced over row chunks in parallel.
  std::uint32_t tensor_amax(const exec& ex) const {
    const std::int64_t m = p.xm.rows, n = p.xm.cols;
    std::vector<std::uint32_t> part(static_cast<std::size_t>(std::max<std::int64_t>(m, 1)), 0u);
    parallel_for(
        m, ex.threads,
        [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t r = b; r < e; ++r)
            part[static_cast<std::size_t>(r)] = amax_bits({r, r + 1, 0, n});
        },
        std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(n, 1)));
    return *std::max_element(part.begin(), part.end());
  }

  void cast_rows(float q, const exec& ex) const {
    const std::int64_t n = p.xm.cols;
    parallel_for(
        p.xm.rows, ex.threads,
        [&](std::int64_t b, std::int64_t e) {
          cast({b, e, 0, n}, q);
        },
        std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(n, 1)));
  }

  void run(const exec& ex) const {
    const std::int64_t m = p.xm.rows, n = p.xm.cols;
    float* scales = p.scales.template ptr<float>();
    switch (p.src) {
    case scale_source::given: {
      cast_rows(p.scale_in.template ptr<const float>()[0], ex);
      return;
    }
    case scale_source::history: {
      float* hist = p.scale_in.template ptr<float>();
      const std::int64_t h = p.scale_in.numel();
      std::uint32_t used = abs_bits(hist[0]);
      if (p.reduce == history_reduce::max)
        for (std::int64_t k = 1; k < h; ++k)
          used = std::max(used, abs_bits(hist[k]));
      const auto s = scale(used);
      scales[0] = s.q;
      scales[1] = s.d;
      cast_rows(s.q, ex);
      const std::uint32_t now = tensor_amax(ex);
      for (std::int64_t k = h - 1; k > 0; --k)
        hist[k] = hist[k - 1];
      hist[0] = quant_ops::bit_cast<float>(now);
      return;
    }
    case scale_source::amax: break;
    }
    switch (p.g.k) {
    case grouping::kind::tensor: {
      const auto s = scale(tensor_amax(ex));
      scales[0] = s.d;
      cast_rows(s.q, ex);
      return;
    }
    case grouping::kind::columns: {
      std::vector<float> q(static_cast<std::size_t>(n));
      parallel_for(
          n, ex.threads,
          [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t c = b; c < e; ++c) {
              const auto s = scale(amax_bits({0, m, c, c + 1}));
              q[static_cast<std::size_t>(c)] = s.q;
              scales[c] = s.d;
            }
          },
          std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(m, 1)));
      parallel_for(
          m, ex.threads,
          [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t c = 0; c < n; ++c)
              cast({b, e, c, c + 1}, q[static_cast<std::size_t>(c)]);
          },
          std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(n, 1)));
      return;
    }
    default: break;
    }
    // rows, blocks, tiles: independent rectangles.
    const std::int64_t gr = p.g.k == grouping::kind::tiles ? p.g.tile_rows : 1;
    const std::int64_t gc =
        p.g.k == grouping::kind::rows ? std::max<std::int64_t>(n, 1) : p.g.tile_cols;
    const std::int64_t sr = p.g.scale_rows(m), sc = p.g.scale_cols(n);
    parallel_for(
        sr * sc, ex.threads,
        [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t g = b; g < e; ++g) {
            const std::int64_t i = g / sc, j = g % sc;
            const rect r{i * gr, std::min(m, (i + 1) * gr), j * gc, std::min(n, (j + 1) * gc)};
            const auto s = scale(amax_bits(r));
            scales[g] = s.d;
            cast(r, s.q);
          }
        },
        std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(gr * gc, 1)));
  }
};

// Calls fn(input tag, code type tag) for the dtypes of a quantization call.
template <class Fn> void with_types(dtype in, dtype code, Fn&& fn) {
  element_ops::dispatch_input(in, [&](auto in_tag) {
    switch (code) {
    case dtype::int8: return fn(in_tag, std::int8_t{});
    case dtype::uint16: return fn(in_tag, std::uint16_t{});
    default: return fn(in_tag, std::uint8_t{});
    }
  });
}

} // namespace

void quantize(const quant_problem& p, const exec& ex) {
  with_types(p.x.type, p.codes.type, [&](auto in_tag, auto code_tag) {
    using In = decltype(in_tag);
    using Code = decltype(code_tag);
    if constexpr (!std::is_same_v<In, double>) {
      detail::dispatch_target(p.t, [&](auto ft) {
        detail::dispatch_policy(p.pol, [&](auto pt) {
          quantizer<In, Code, decltype(ft), decltype(pt)>{p, ft, pt}.run(ex);
        });
      });
    }
  });
}

// The CPU dequantize loops: out[r][c] = value(r, c, code bits), rows in parallel, codes of the
// type the codes view holds.
template <class Value>
void dequantize_each(const dequant_problem& p, const exec& ex, const Value& value) {
  const std::int64_t n = p.cm.cols;
  float* out = p.out.ptr<float>();
  const auto body = [&](auto code_tag) {
    using Code = decltype(code_tag);
    const Code* codes = p.codes.ptr<const Code>();
    parallel_for(
        p.cm.rows, ex.threads,
        [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t r = b; r < e; ++r)
            for (std::int64_t c = 0; c < n; ++c)
              out[r * p.om.row_stride + c] =
                  value(r, c, static_cast<std::uint32_t>(codes[r * p.cm.row_stride + c]));
        },
        std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(n, 1)));
  };
  switch (p.codes.type) {
  case dtype::int8: return body(std::int8_t{});
  case dtype::uint16: return body(std::uint16_t{});
  default: return body(std::uint8_t{});
  }
}

void dequantize(const dequant_problem& p, const exec& ex) {
  const group_index gi = make_group_index(p.g, p.cm.cols);
  const float* scales = p.scales.ptr<const float>();
  const std::uint32_t mask = p.t.is_int ? 0xFFu : 0xFFFFu;
  dequantize_each(p, ex, [&](std::int64_t r, std::int64_t c, std::uint32_t code) {
    return quant_ops::descaled(quant_ops::element_value(p.t, code & mask), scales[gi(r, c)]);
  });
}

void quantize_mx(const mx_problem& p, const exec& ex) {
  const std::int64_t m = p.xm.rows, n = p.xm.cols, k = p.block;
  const std::int64_t nb = (n + k - 1) / k;
  std::uint8_t* scales = p.scales.ptr<std::uint8_t>();
  const int emax = p.t.emax();
  const auto body = [&](auto in_tag, auto code_tag) {
    using In = decltype(in_tag);
    using Code = decltype(code_tag);
    if constexpr (!std::is_same_v<In, double>) {
      const In* x = p.x.ptr<const In>();
      Code* codes = p.codes.ptr<Code>();
      detail::dispatch_target(p.t, [&](auto ft) {
        detail::dispatch_policy(p.pol, [&](auto pt) {
          parallel_for(
              m, ex.threads,
              [&](std::int64_t b, std::int64_t e) {
                for (std::int64_t r = b; r < e; ++r)
                  for (std::int64_t j = 0; j < nb; ++j) {
                    const std::int64_t c0 = j * k, c1 = std::min(n, c0 + k);
                    std::uint32_t amax = 0;
                    for (std::int64_t c = c0; c < c1; ++c)
                      amax = std::max(
                          amax, quant_ops::abs_bits(element_ops::load(x[r * p.xm.row_stride + c])));
                    const std::uint32_t sc = quant_ops::mx_scale_code(amax, emax);
                    scales[r * nb + j] = static_cast<std::uint8_t>(sc);
                    for (std::int64_t c = c0; c < c1; ++c) {
                      const std::uint64_t i = static_cast<std::uint64_t>(r * n + c);
                      const std::uint32_t rb = pt.stochastic() ? p.rng.bits(i) : 0u;
                      codes[r * p.cm.row_stride + c] = static_cast<Code>(quant_ops::mx_element(
                          p.t, ft, pt, element_ops::load(x[r * p.xm.row_stride + c]), sc, rb));
                    }
                  }
              },
              std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(n, 1)));
        });
      });
    }
  };
  // MX codes are single bytes (the host API admits only the OCP element formats), so every
  // admitted call reaches one of these two code types; none is skipped.
  element_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    if (p.codes.type == dtype::int8)
      return body(in_tag, std::int8_t{});
    return body(in_tag, std::uint8_t{});
  });
}

void dequantize_mx(const dequant_problem& p, const exec& ex) {
  const std::int64_t k = p.block, nb = (p.cm.cols + k - 1) / k;
  const std::uint8_t* scales = p.scales.ptr<const std::uint8_t>();
  dequantize_each(p, ex, [&](std::int64_t r, std::int64_t c, std::uint32_t code) {
    return quant_ops::mx_value(p.t, code & 0xFFu, scales[r * nb + c / k]);
  });
}

} // namespace lowbit::kernels::cpu
