// Exact reference for scaled quantization (docs/techniques/quantization.md): the group scale
// q* = max / amax * 2^-margin (or the largest power of two below it) and every element's code as
// the exact rounding of x * q*; OCP MX shared exponents and elements x / 2^s. Plain C++ over the
// rationals of round.hpp; shares nothing with the kernels it checks.
#pragma once

#include <cstdint>

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/reference/round.hpp>

namespace lowbit::reference {

// What an element becomes (the reference's own description, not the kernels' type).
struct quant_target {
  bool is_int = false;
  emu::format fmt{};
  emu::int_format ifmt{};
};

// The largest finite value of the target (the integer maximum for integers).
rational target_max(const quant_target& t);

// q* for a group with finite amax > 0. pow2: the largest power of two <= max / amax * 2^-margin.
rational exact_scale(const quant_target& t, const rational& amax, int margin, bool pow2);

// d* = 1 / q* (what the kernels store per group, up to one float rounding).
rational exact_dequant_factor(const quant_target& t, const rational& amax, int margin, bool pow2);

// The code of the exact value y (sign of a zero y from `negative`); integers as two's complement
// in the low 8 bits, like the kernels.
std::uint32_t quantize_value(const quant_target& t, const rational& y, bool negative,
                             const emu::policy& p, std::uint32_t rbits = 0);

// OCP MX shared exponent s = clamp(floor(log2(amax)) - emax_elem, -127, 127), amax finite > 0.
int mx_shared_exponent(const rational& amax, int emax_elem);

// An MX element: the rounding of x / 2^s (MXINT8: of x * 2^(6-s) to int8), exactly.
std::uint32_t mx_element(const quant_target& t, const rational& x, bool negative, int s,
                         const emu::policy& p, std::uint32_t rbits = 0);

} // namespace lowbit::reference
