// CPU twin of the scaled matmul, the witness of every backend: exact int32 sums for int8, and for
// fp8 and 16-bit operands the float32 sum acc = acc + a*b over k = 0, 1, ..., K-1 in order (the
// simt kernel's order), or the products in that order through the caller's accumulation model
// (emu/accumulate.hpp), then gemm_finish; with block scales, the same per K block and the
// blocked rule's float32 sum of the scaled block terms (gemm.hpp). The register-aligned block
// models over fp8 operands run in the float32 form that simt's model kernel runs
// (gemm_internal.hpp, gemm_model_*), outputs whose operands hold NaN or Inf through
// emu::accumulator. Threads split the rows of the output; each output's arithmetic is the same
// whatever the split.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "../common/cpu.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels::cpu {

namespace {

// An 8-bit operand's values by code (decoding is exact, so a table changes no result).
std::array<float, 256> table_of(gemm_elem e) {
  std::array<float, 256> t{};
  for (std::uint32_t c = 0; c < 256; ++c) {
    const std::uint8_t code = static_cast<std::uint8_t>(c);
    t[c] = gemm_value(e, &code, 0);
  }
  return t;
}

// The blocked rule (gemm.hpp): each K block's partial sum alone (`block(k0, k1)`), scaled by
// its two block scales, the terms summed in float32 in block order.
template <class Block>
void finish_blocked(const gemm_problem& p, std::int64_t m, std::int64_t n, Block block) {
  gemm_block_total t;
  for (std::int64_t j = 0, k0 = 0; k0 < p.k; ++j, k0 += p.kblock) {
    const std::int64_t k1 = p.k - k0 < p.kblock ? p.k : k0 + p.kblock;
    t.add(block(k0, k1), gemm_block_scale(p.a, m, j), gemm_block_scale(p.b, n, j));
  }
  gemm_finish_blocks(p, m, n, t.total);
}

void int8_rows(const gemm_problem& p, std::int64_t m0, std::int64_t m1) {
  const auto* a = static_cast<const std::int8_t*>(p.a.codes);
  const auto* b = static_cast<const std::int8_t*>(p.b.codes);
  for (std::int64_t m = m0; m < m1; ++m) {
    const std::int8_t* ar = a + m * p.a.row_stride;
    for (std::int64_t n = 0; n < p.n; ++n) {
      const std::int8_t* br = b + n * p.b.row_stride;
      if (p.kblock > 0) {
        finish_blocked(p, m, n, [&](std::int64_t k0, std::int64_t k1) {
          std::int64_t acc = 0;
          for (std::int64_t k = k0; k < k1; ++k)
            acc += std::int32_t{ar[k]} * std::int32_t{br[k]};
          return static_cast<float>(static_cast<std::int32_t>(acc));
        });
        continue;
      }
      // The K limit keeps every partial sum inside int32; int64 costs nothing here.
      std::int64_t acc = 0;
      for (std::int64_t k = 0; k < p.k; ++k)
        acc += std::int32_t{ar[k]} * std::int32_t{br[k]};
      gemm_finish(p, m, n, static_cast<float>(static_cast<std::int32_t>(acc)));
    }
  }
}

// a's row decoded once into `av`; b read through `value` (a table or a 16-bit load).
template <class ValueB>
void float_rows(const gemm_problem& p, std::int64_t m0, std::int64_t m1, ValueB value_b) {
  std::vector<float> av(static_cast<std::size_t>(p.k));
  for (std::int64_t m = m0; m < m1; ++m) {
    for (std::int64_t k = 0; k < p.k; ++k)
      av[static_cast<std::size_t>(k)] = gemm_value(p.a.elem, p.a.codes, m * p.a.row_stride + k);
    for (std::int64_t n = 0; n < p.n; ++n) {
      const std::int64_t b0 = n * p.b.row_stride;
      if (p.kblock > 0) {
        finish_blocked(p, m, n, [&](std::int64_t k0, std::int64_t k1) {
          if (p.accumulation.kind != emu::accumulation_kind::fp32_sequential) {
            emu::accumulator acc = gemm_accumulator(p);
            for (std::int64_t k = k0; k < k1; ++k)
              acc.add(av[static_cast<std::size_t>(k)], value_b(b0 + k));
            return acc.finish();
          }
          float acc = 0.0f;
          for (std::int64_t k = k0; k < k1; ++k) {
            const float prod = av[static_cast<std::size_t>(k)] * value_b(b0 + k);
            acc = acc + prod;
          }
          return acc;
        });
        continue;
      }
      if (p.accumulation.kind != emu::accumulation_kind::fp32_sequential) {
        emu::accumulator acc = gemm_accumulator(p);
        for (std::int64_t k = 0; k < p.k; ++k)
          acc.add(av[static_cast<std::size_t>(k)], value_b(b0 + k));
        gemm_finish(p, m, n, acc.finish());
        continue;
      }
      float acc = 0.0f;
      for (std::int64_t k = 0; k < p.k; ++k) {
        const float prod = av[static_cast<std::size_t>(k)] * value_b(b0 + k);
        acc = acc + prod;
      }
      gemm_finish(p, m, n, acc);
    }
  }
}

// x rounded to an integer (|x| < 2^22): toward zero, or to nearest even (the sum and difference
// with 1.5 2^23 round in float32's default mode, nearest even, at the units place).
template <bool Nearest> inline float to_integer(float x) {
  if constexpr (Nearest) {
    const float r = x + 0x1.8p23f;
    return r - 0x1.8p23f;
  } else {
    return static_cast<float>(static_cast<std::int32_t>(x));
  }
}

// One block's sum, k in [s, e), with the register: in units of its grid 2^q, each term a b 2^-q
// (exact: a power of two times an exact product) rounded to an integer, and the register's; the
// units' sum is exact in float32 (below 2^24 in all), so four partial sums change nothing but the
// speed. top: the block's largest key product (nonzero).
template <bool Nearest>
float block_sum(const gemm_model_args& ma, float top, float part, const float* av,
                const std::uint8_t* b, const std::array<float, 256>& tb, std::int64_t s,
                std::int64_t e) {
  // 2^q and 2^-q from M's bits (2^(q + 23)); both normal float32 values here.
  const std::uint32_t grid_bits = gemm_model_big(top, ma) - (23u << 23);
  const float unit = emu::detail::bit_cast<float>(grid_bits);
  const float inv = emu::detail::bit_cast<float>((254u << 23) - grid_bits);
  float sum[4] = {to_integer<Nearest>(part * inv), 0.0f, 0.0f, 0.0f};
  std::int64_t k = s;
  for (; k + 4 <= e; k += 4)
    for (int j = 0; j < 4; ++j) {
      const float p = av[k + j] * tb[b[k + j]];
      sum[j] = sum[j] + to_integer<Nearest>(p * inv);
    }
  for (; k < e; ++k) {
    const float p = av[k] * tb[b[k]];
    sum[0] = sum[0] + to_integer<Nearest>(p * inv);
  }
  return ((sum[0] + sum[1]) + (sum[2] + sum[3])) * unit;
}

// The float32 form of a register-aligned block model (gemm_model_takes): the model's finish()
// over the products of k in [k0, k1), A's values and keys in av/ak, B's codes through its value
// and key tables; per block, the largest key product (four partial maxima), then block_sum.
template <bool Nearest>
float model_sum(const gemm_model_args& ma, const float* av, const float* ak, const std::uint8_t* b,
                const std::array<float, 256>& tb, const std::array<float, 256>& kb, std::int64_t k0,
                std::int64_t k1) {
  float part = 0.0f, acc = 0.0f;
  int since = 0;
  for (std::int64_t s = k0; s < k1; s += ma.block) {
    const std::int64_t e = s + ma.block < k1 ? s + ma.block : k1;
    // The register's power of two (its exponent bits) starts the largest key product.
    float mx[4] = {
        emu::detail::bit_cast<float>(emu::detail::bit_cast<std::uint32_t>(part) & 0x7F800000u),
        0.0f, 0.0f, 0.0f};
    std::int64_t k = s;
    for (; k + 4 <= e; k += 4)
      for (int j = 0; j < 4; ++j) {
        const float key = ak[k + j] * kb[b[k + j]];
        mx[j] = key > mx[j] ? key : mx[j];
      }
    for (; k < e; ++k) {
      const float key = ak[k] * kb[b[k]];
      mx[0] = key > mx[0] ? key : mx[0];
    }
    const float top = std::max(std::max(mx[0], mx[1]), std::max(mx[2], mx[3]));
    if (top != 0.0f) // else no product and a zero register: the register stays 0
      part = gemm_model_register(block_sum<Nearest>(ma, top, part, av, b, tb, s, e), ma);
    if (ma.promote_every > 0 && ++since == ma.promote_every) {
      acc = acc + part;
      part = 0.0f;
      since = 0;
    }
  }
  if (ma.promote_every > 0)
    return since > 0 ? acc + part : acc;
  return part;
}

// What the float32 form reads of both operands, made once per call: their values and keys
// (gemm_model_key) by code, and which rows of B hold a NaN or Inf code.
struct model_tables {
  gemm_model_args ma;
  std::array<float, 256> ta, tb, ka, kb;
  std::vector<char> b_special;

  explicit model_tables(const gemm_problem& p)
      : ma(gemm_model_args_of(p.accumulation)), ta(table_of(p.a.elem)), tb(table_of(p.b.elem)),
        b_special(static_cast<std::size_t>(p.n)) {
    for (int c = 0; c < 256; ++c) {
      ka[c] = gemm_model_key(ta[c], gemm_min_exponent(p.a.elem), p.accumulation.exponent);
      kb[c] = gemm_model_key(tb[c], gemm_min_exponent(p.b.elem), p.accumulation.exponent);
    }
    const auto* b = static_cast<const std::uint8_t*>(p.b.codes);
    for (std::int64_t n = 0; n < p.n; ++n) {
      char& special = b_special[static_cast<std::size_t>(n)];
      for (std::int64_t k = 0; k < p.k && special == 0; ++k)
        special = kb[b[n * p.b.row_stride + k]] < 0.0f ? 1 : 0;
    }
  }
};

// The register-aligned block models over fp8 operands: the float32 form where neither operand's
// row holds NaN or Inf, emu::accumulator's sum where one does.
void model_rows(const gemm_problem& p, const model_tables& t, std::int64_t m0, std::int64_t m1) {
  const auto* a = static_cast<const std::uint8_t*>(p.a.codes);
  const auto* b = static_cast<const std::uint8_t*>(p.b.codes);
  std::vector<float> av(static_cast<std::size_t>(p.k)), ak(av.size());
  for (std::int64_t m = m0; m < m1; ++m) {
    const std::uint8_t* ar = a + m * p.a.row_stride;
    bool a_special = false;
    for (std::int64_t k = 0; k < p.k; ++k) {
      av[static_cast<std::size_t>(k)] = t.ta[ar[k]];
      ak[static_cast<std::size_t>(k)] = t.ka[ar[k]];
      a_special |= t.ka[ar[k]] < 0.0f;
    }
    for (std::int64_t n = 0; n < p.n; ++n) {
      const std::uint8_t* br = b + n * p.b.row_stride;
      const auto block = [&](std::int64_t k0, std::int64_t k1) {
        if (a_special || t.b_special[static_cast<std::size_t>(n)] != 0) {
          emu::accumulator acc = gemm_accumulator(p);
          for (std::int64_t k = k0; k < k1; ++k)
            acc.add(av[static_cast<std::size_t>(k)], t.tb[br[k]]);
          return acc.finish();
        }
        return t.ma.nearest_terms
                   ? model_sum<true>(t.ma, av.data(), ak.data(), br, t.tb, t.kb, k0, k1)
                   : model_sum<false>(t.ma, av.data(), ak.data(), br, t.tb, t.kb, k0, k1);
      };
      if (p.kblock > 0)
        finish_blocked(p, m, n, block);
      else
        gemm_finish(p, m, n, block(0, p.k));
    }
  }
}

void rows(const gemm_problem& p, std::int64_t m0, std::int64_t m1) {
  if (p.k == 0) {
    for (std::int64_t m = m0; m < m1; ++m)
      for (std::int64_t n = 0; n < p.n; ++n)
        gemm_empty_k(p, m, n);
    return;
  }
  if (p.a.elem == gemm_elem::int8)
    return int8_rows(p, m0, m1);
  if (gemm_is_fp8(p.b.elem)) {
    const std::array<float, 256> tb = table_of(p.b.elem);
    const auto* b = static_cast<const std::uint8_t*>(p.b.codes);
    return float_rows(p, m0, m1, [&](std::int64_t i) { return tb[b[i]]; });
  }
  return float_rows(p, m0, m1, [&](std::int64_t i) { return gemm_value(p.b.elem, p.b.codes, i); });
}

} // namespace

void scaled_matmul(const gemm_problem& p, const exec& ex) {
  if (p.m == 0 || p.n == 0)
    return;
  if (gemm_model_takes(p)) {
    const model_tables t(p);
    const std::int64_t grain = p.n * p.k >= (1 << 16) ? 1 : (1 << 16) / (p.n * p.k);
    parallel_for(
        p.m, ex.threads, [&](std::int64_t m0, std::int64_t m1) { model_rows(p, t, m0, m1); },
        grain);
    return;
  }
  // Rows per thread: about 2^16 multiply-adds of work at least.
  const std::int64_t per_row = p.n * (p.k > 0 ? p.k : 1);
  const std::int64_t grain = per_row >= (1 << 16) ? 1 : (1 << 16) / per_row;
  parallel_for(
      p.m, ex.threads, [&](std::int64_t m0, std::int64_t m1) { rows(p, m0, m1); }, grain);
}

} // namespace lowbit::kernels::cpu
