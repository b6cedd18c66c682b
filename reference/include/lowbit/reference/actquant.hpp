// Exact reference for the activation quantization with running estimates (Mesa;
// docs/techniques/mesa.md): the estimate update from a group's exact minimum and maximum, an
// element's code as the exact rounding of (x - beta) / alpha clamped to [0, 255], and the value of
// a code. Plain C++ over the rationals of round.hpp; shares nothing with the kernels it checks.
#pragma once

#include <cstdint>

#include <lowbit/emu/policy.hpp>
#include <lowbit/reference/round.hpp>

namespace lowbit::reference {

struct actquant_estimate {
  rational alpha, beta;
};

// The update of a group's estimate from its exact min lo and max hi (finite elements):
// a = (hi - lo) / 255; (a, lo) when there is no estimate yet (`known` false), else
// (m alpha + (1 - m) a, m beta + (1 - m) lo), all exact.
actquant_estimate actquant_update(const actquant_estimate& old, bool known, const rational& lo,
                                  const rational& hi, const rational& momentum);

// The code of an exact value x: round((x - beta) / alpha) under p (stochastic: with rbits),
// clamped to [0, 255]. alpha > 0.
std::uint32_t actquant_code(const rational& x, const actquant_estimate& e, const emu::policy& p,
                            std::uint32_t rbits = 0);

// The value of a code: code * alpha + beta.
rational actquant_value(std::uint32_t code, const actquant_estimate& e);

} // namespace lowbit::reference
