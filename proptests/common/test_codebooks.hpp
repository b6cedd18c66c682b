// Codebook values shared by the CPU and GPU block-wise tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace lowbit::proptest::test {

// 256 sorted values in [-1, 1] whose entries crowd: a cluster 2^-12 wide, a run of equal values,
// tiny entries. The GPU's bucket search then walks several midpoints per bucket.
inline std::vector<float> crowded_codebook_values() {
  std::vector<float> v;
  for (int i = 0; i < 96; ++i) v.push_back(0.5f + std::ldexp(static_cast<float>(i), -19));
  for (int i = 0; i < 32; ++i) v.push_back(0.25f);
  for (int i = 0; i < 64; ++i) v.push_back(-std::ldexp(1.0f, -i));
  for (int i = 0; i < 63; ++i) v.push_back(static_cast<float>(i) / 63.0f);
  v.push_back(1.0f);
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace lowbit::proptest::test
