// Exact reference for block-wise codebook quantization and quantiles
// (docs/techniques/blockwise.md, docs/techniques/sram-quantiles.md): the codebooks' defining
// values as exact rationals, the nearest codebook entry by exact comparison against all 256
// entries (no search), the neighbours of stochastic rounding, and exact quantiles of a whole
// tensor by a full sort. Plain C++ over the rationals of round.hpp; shares nothing with the
// kernels it checks.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <lowbit/reference/round.hpp>

namespace lowbit::reference {

using codebook_values = std::array<float, 256>;

// The exact defining values of the dynamic tree map (sorted, 256 entries): per decade 10^-d,
// d = 6..0, the midpoints of F evenly spaced points on [0.1, 1] times 10^-d, with F - 1 = 2^(6-d)
// (signed, with negatives) or 2^(7-d) (unsigned); plus 0 and 1. The mathematical map, which no
// implementation stores: see dynamic_tree_float32.
std::vector<rational> dynamic_tree_exact(bool is_signed);
// The dynamic tree map as its published implementation computes it, every step of
// docs/techniques/blockwise.md an exact rational rounded to float32 (ties to even): the ends
// 0.1 and 1 and the decade scales 10^-d are double constants rounded to float32; linspace step
// fl((1 - s) / (F - 1)), point k fl(s + step k) for k < F/2 and fl(1 - step (F-1-k)) after,
// the multiply-add rounded once when fused_linspace (PyTorch on AVX2/AVX-512 CPUs and on CUDA),
// the product rounded first otherwise (its baseline CPU kernel); midpoint fl(b_k + b_k+1) / 2;
// value fl(scale * midpoint), its negative for the signed map; plus 0 and 1, sorted.
codebook_values dynamic_tree_float32(bool is_signed, bool fused_linspace = true);
// The linear map: (2k - 255)/255 (signed) or k/255 (unsigned), k = 0..255.
std::vector<rational> linear_exact(bool is_signed);
// Each value rounded to the nearest float32 (ties to even), exactly.
codebook_values to_float32(const std::vector<rational>& v);

// The index of the codebook entry nearest to y, by exact comparison with every entry. Ties:
// between two different values, the one of smaller magnitude (between -c and +c, +c); among
// equal entries (duplicates), the run is entered from y's side: the lowest index when y is below
// the value, the highest when above; y equal to it: the lowest for a positive value, the highest
// for zero or a negative one.
// exact_codebook holds the entries as rationals (converted once).
struct exact_codebook {
  std::vector<rational> c;
  explicit exact_codebook(const codebook_values& cb);
};
int nearest_entry(const exact_codebook& cb, const rational& y);

// The neighbours of stochastic rounding: lo = the last index with cb[lo] <= y (-1 if none),
// hi = lo + 1 (256 if none).
struct entry_bracket {
  int lo, hi;
};
entry_bracket bracket_entries(const exact_codebook& cb, const rational& y);

// Quantile i of k of n sorted values: the value at position floor((2i + 1) n / (2k)). x must be
// finite and non-empty; the result is exact (a value of x).
std::vector<double> exact_quantiles(std::vector<double> x, int k);

} // namespace lowbit::reference
