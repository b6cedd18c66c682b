// CPU twin of the scaled matmul, the witness of every backend: exact int32 sums for int8, and for
// fp8 and 16-bit operands the float32 sum acc = acc + a*b over k = 0, 1, ..., K-1 in order (the
// simt kernel's order), or the products in that order through the caller's accumulation model
// (emu/accumulate.hpp), then gemm_finish; with block scales, the same per K block and the
// blocked rule's float32 sum of the scaled block terms (gemm.hpp). Threads split the rows of the
// output; each output's arithmetic is the same whatever the split.
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
  // Rows per thread: about 2^16 multiply-adds of work at least.
  const std::int64_t per_row = p.n * (p.k > 0 ? p.k : 1);
  const std::int64_t grain = per_row >= (1 << 16) ? 1 : (1 << 16) / per_row;
  parallel_for(
      p.m, ex.threads, [&](std::int64_t m0, std::int64_t m1) { rows(p, m0, m1); }, grain);
}

} // namespace lowbit::kernels::cpu
