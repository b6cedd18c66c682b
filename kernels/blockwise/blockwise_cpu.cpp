// CPU twin of block-wise codebook quantization and SRAM-quantiles: the per-element code of
// blockwise_ops.hpp with blocks (chunks) processed in parallel. Absmax values are maxima (exact,
// order-free) and the quantile averages are summed in the GPU's fixed two-level order (chunks
// within groups, then groups), so the results equal the GPU's bit for bit.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "../common/cpu.hpp"
#include "../common/element_ops.hpp"
#include "blockwise_internal.hpp"

namespace lowbit::kernels::cpu {

namespace {

namespace ops = blockwise_ops;

// Grain: about 64K elements of work per thread chunk.
std::int64_t grain_for(std::int64_t per_item) {
  return std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(per_item, 1));
}

// Quantizes blocks [b0, b1) of x; writes the absmax bits of each block to amax_out. buckets:
// the codebook's bucket table (null for stochastic rounding, which does not search).
template <class In>
void quantize_blocks(const blockwise_problem& p, const In* x, const std::uint32_t* buckets,
                     std::uint8_t* codes, std::uint32_t* amax_out, std::int64_t b0,
                     std::int64_t b1) {
  for (std::int64_t b = b0; b < b1; ++b) {
    const std::int64_t i0 = b * p.block, i1 = std::min(p.n, i0 + p.block);
    std::uint32_t m = 0;
    for (std::int64_t i = i0; i < i1; ++i)
      m = std::max(m, ops::abs_bits(element_ops::load(x[i])));
    amax_out[b] = m;
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::uint32_t rb = p.stochastic ? p.rng.bits(static_cast<std::uint64_t>(i)) : 0u;
      const float v = element_ops::load(x[i]);
      codes[i] = static_cast<std::uint8_t>(
          p.stochastic ? ops::encode(p.tb, v, m, true, rb, p.zero_code)
                       : ops::encode_nearest(p.tb, buckets, v, m, p.zero_code));
    }
  }
}

} // namespace

std::shared_ptr<const std::uint32_t[]> bucket_table(const ops::tables& tb) {
  struct entry {
    ops::tables tb;
    std::shared_ptr<const std::uint32_t[]> buckets;
  };
  constexpr std::size_t kept = 16;
  static std::mutex mu;
  static std::vector<entry> known; // the most recently used last
  {
    const std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = 0; i < known.size(); ++i)
      if (std::memcmp(&known[i].tb, &tb, sizeof(tb)) == 0) {
        std::rotate(known.begin() + static_cast<std::ptrdiff_t>(i),
                    known.begin() + static_cast<std::ptrdiff_t>(i) + 1, known.end());
        return known.back().buckets;
      }
  }
  std::shared_ptr<std::uint32_t[]> b(new std::uint32_t[ops::bucket_count]);
  for (std::uint32_t u = 0; u < ops::bucket_count; ++u)
    b[u] = ops::bucket_entry(tb.sum_hi, tb.sum_lo, u);
  const std::lock_guard<std::mutex> lock(mu);
  if (known.size() == kept)
    known.erase(known.begin());
  known.push_back({tb, b});
  return b;
}

void quantize_blockwise(const blockwise_problem& p, const exec& ex) {
  const std::shared_ptr<const std::uint32_t[]> buckets =
      p.stochastic ? nullptr : bucket_table(p.tb);
  std::vector<std::uint32_t> amax(static_cast<std::size_t>(p.blocks));
  element_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>) {
      const In* x = p.x.ptr<const In>();
      std::uint8_t* codes = p.codes.ptr<std::uint8_t>();
      parallel_for(
          p.blocks, ex.threads,
          [&](std::int64_t b, std::int64_t e) {
            quantize_blocks(p, x, buckets.get(), codes, amax.data(), b, e);
          },
          grain_for(p.block));
    }
  });
  if (!p.nested) {
    float* out = p.absmax.ptr<float>();
    for (std::int64_t b = 0; b < p.blocks; ++b)
      out[b] = ops::stored_absmax(amax[static_cast<std::size_t>(b)]);
    return;
  }
  // Nested: the stored absmax values, quantized in blocks of nested_block (nearest entry).
  std::vector<float> a(static_cast<std::size_t>(p.blocks));
  for (std::int64_t b = 0; b < p.blocks; ++b)
    a[static_cast<std::size_t>(b)] = ops::stored_absmax(amax[static_cast<std::size_t>(b)]);
  std::uint8_t* codes2 = p.codes2.ptr<std::uint8_t>();
  float* absmax2 = p.absmax2.ptr<float>();
  const std::int64_t blocks2 = blockwise_blocks(p.blocks, nested_block);
  for (std::int64_t g = 0; g < blocks2; ++g) {
    const std::int64_t i0 = g * nested_block, i1 = std::min(p.blocks, i0 + nested_block);
    std::uint32_t m = 0;
    for (std::int64_t i = i0; i < i1; ++i)
      m = std::max(m, ops::abs_bits(a[static_cast<std::size_t>(i)]));
    absmax2[g] = ops::stored_absmax(m);
    for (std::int64_t i = i0; i < i1; ++i)
      codes2[i] = static_cast<std::uint8_t>(
          ops::encode(p.tb2, a[static_cast<std::size_t>(i)], m, false, 0u, p.zero_code2));
  }
}

void dequantize_blockwise(const blockwise_dequant_problem& p, const exec& ex) {
  const std::uint8_t* codes = p.codes.ptr<const std::uint8_t>();
  float* out = p.out.ptr<float>();
  parallel_for(
      p.blocks, ex.threads,
      [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
          const float a = p.nested ? ops::decode(p.value2[p.codes2.ptr<const std::uint8_t>()[b]],
                                                 p.absmax2.ptr<const float>()[b / nested_block])
                                   : p.absmax.ptr<const float>()[b];
          const std::int64_t i0 = b * p.block, i1 = std::min(p.n, i0 + p.block);
          for (std::int64_t i = i0; i < i1; ++i)
            out[i] = ops::decode(p.value[codes[i]], a);
        }
      },
      grain_for(p.block));
}

void estimate_quantiles(const quantile_problem& p, const exec& ex) {
  const std::int64_t k = p.k, n = p.n;
  std::vector<float> part(static_cast<std::size_t>(p.chunks * k));
  element_ops::dispatch_input(p.x.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    if constexpr (!std::is_same_v<In, double>) {
      const In* x = p.x.ptr<const In>();
      parallel_for(
          p.chunks, ex.threads,
          [&](std::int64_t c0, std::int64_t c1) {
            std::vector<std::uint32_t> keys;
            for (std::int64_t c = c0; c < c1; ++c) {
              const std::int64_t i0 = c * quantile_chunk, m = std::min(n - i0, quantile_chunk);
              keys.resize(static_cast<std::size_t>(m));
              for (std::int64_t i = 0; i < m; ++i)
                keys[static_cast<std::size_t>(i)] = ops::order_key(
                    emu::detail::bit_cast<std::uint32_t>(element_ops::load(x[i0 + i])));
              std::sort(keys.begin(), keys.end());
              for (std::int64_t q = 0; q < k; ++q)
                part[static_cast<std::size_t>(c * k + q)] = emu::detail::bit_cast<float>(
                    ops::key_bits(keys[static_cast<std::size_t>(ops::quantile_position(q, k, m))]));
            }
          },
          grain_for(quantile_chunk));
    }
  });
  // The order of the definition (blockwise.hpp), as the GPU sums: the exact products m_c * Q_q(c)
  // in chunk order within each group of quantile_group chunks (groups in parallel), then the
  // group sums in group order.
  const std::int64_t groups = (p.chunks + quantile_group - 1) / quantile_group;
  std::vector<double> sums(static_cast<std::size_t>(groups * k), 0.0);
  parallel_for(
      groups, ex.threads,
      [&](std::int64_t g0, std::int64_t g1) {
        for (std::int64_t g = g0; g < g1; ++g) {
          double* s = sums.data() + g * k;
          const std::int64_t c1 = std::min(p.chunks, (g + 1) * quantile_group);
          for (std::int64_t c = g * quantile_group; c < c1; ++c) {
            const double m = static_cast<double>(std::min(n - c * quantile_chunk, quantile_chunk));
            const float* row = part.data() + c * k;
            for (std::int64_t q = 0; q < k; ++q)
              s[q] += m * static_cast<double>(row[q]);
          }
        }
      },
      1);
  float* out = p.out.ptr<float>();
  for (std::int64_t q = 0; q < k; ++q) {
    double acc = 0.0;
    for (std::int64_t g = 0; g < groups; ++g)
      acc += sums[static_cast<std::size_t>(g * k + q)];
    out[q] = static_cast<float>(acc / static_cast<double>(n));
  }
}

} // namespace lowbit::kernels::cpu
