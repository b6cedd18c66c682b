// Reference of residual master weights (docs/techniques/residual.md): the split of a float32
// value into a 16-bit weight (the exact nearest bfloat16/float16 value, ties away from zero, by
// reference::round) and a k-bit residual, and the join, with the float32 steps between the two
// counted in exact rational arithmetic (the rank of a float32 magnitude computed from its value
// by the definition of the format, not from its bits). Shares nothing with the kernels.
#pragma once

#include <cstdint>

namespace lowbit::reference {

enum class residual_weight { bf16, f16 };

struct residual_parts {
  std::uint16_t w; // the weight's code
  std::int32_t r;
};

// split of a float32 value x (any bits; NaN gives the quiet NaN code of x's sign and r = 0).
residual_parts residual_split_exact(residual_weight t, int bits, float x);
// join: the float32 value of a pair (NaN weight: float32's quiet NaN of its sign).
float residual_join_exact(residual_weight t, int bits, std::uint16_t w, std::int32_t r);

} // namespace lowbit::reference
