// Exact evaluation of emu's accumulation models (docs/techniques/fp8-training.md), for checking
// emu::accumulator: the same definition written over Boost rationals (exponents found by
// comparing with powers of two, grids by exact division, float32 roundings by the reference's
// own rounding), so it shares no bit tricks with emu.
#pragma once

#include <vector>

#include <lowbit/emu/accumulate.hpp>

namespace lowbit::reference {

// The model's sum of `products` in order as float32 (its bits are the answer). fp32_sequential
// and block_fixed_point are evaluated; `exact` is refused (lowbit::error: exact_scaled_matmul
// rounds the exact sum), and so are invalid models.
float accumulate_exactly(const emu::accumulation& model, const std::vector<float>& products);

// The same for the products a[i] * b[i] (each exact in float32, else lowbit::error), placed on
// the grid by the model's exponent rule (product_exponent::of_operands: e(a[i]) + e(b[i]);
// of_operand_fields: max(e(a[i]), min_exponent_a) + max(e(b[i]), min_exponent_b)), as
// emu::accumulator::add(a, b) does with the same minimum exponents.
float accumulate_exactly(const emu::accumulation& model, const std::vector<float>& a,
                         const std::vector<float>& b,
                         int min_exponent_a = emu::accumulator::no_min_exponent,
                         int min_exponent_b = emu::accumulator::no_min_exponent);

} // namespace lowbit::reference
