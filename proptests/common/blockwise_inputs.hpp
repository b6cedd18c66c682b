// Inputs shared by the CPU and GPU block-wise and SRAM-quantile tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <lowbit/kernels/blockwise.hpp>

namespace lowbit::proptest::test {

// 256 sorted values in [-1, 1] whose entries crowd: a cluster 2^-12 wide, a run of equal values,
// tiny entries. The GPU's bucket search then walks several midpoints per bucket.
inline std::vector<float> crowded_codebook_values() {
  std::vector<float> v;
  for (int i = 0; i < 96; ++i)
    v.push_back(0.5f + std::ldexp(static_cast<float>(i), -19));
  for (int i = 0; i < 32; ++i)
    v.push_back(0.25f);
  for (int i = 0; i < 64; ++i)
    v.push_back(-std::ldexp(1.0f, -i));
  for (int i = 0; i < 63; ++i)
    v.push_back(static_cast<float>(i) / 63.0f);
  v.push_back(1.0f);
  std::sort(v.begin(), v.end());
  return v;
}

// quantile_group + 2 chunks whose weighted chunk values are 2^53 (chunk 0), 1 (chunk 1), 1 (the
// first chunk of group 1) and -2^53 (the next), 0 elsewhere: summed in chunk order the estimate
// is 0 (2^53 + 1 rounds to 2^53 twice), in the definition's two-level order 1 / n.
inline std::vector<float> cancelling_chunks_input() {
  const std::int64_t chunk = kernels::quantile_chunk, g = kernels::quantile_group;
  std::vector<float> x(static_cast<std::size_t>((g + 2) * chunk), 0.0f);
  const auto fill_chunk = [&](std::int64_t c, float v) {
    std::fill(x.begin() + c * chunk, x.begin() + (c + 1) * chunk, v);
  };
  fill_chunk(0, std::ldexp(1.0f, 41));
  fill_chunk(1, std::ldexp(1.0f, -12));
  fill_chunk(g, std::ldexp(1.0f, -12));
  fill_chunk(g + 1, -std::ldexp(1.0f, 41));
  return x;
}

} // namespace lowbit::proptest::test
