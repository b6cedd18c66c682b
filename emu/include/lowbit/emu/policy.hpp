// How a value that a format cannot hold exactly becomes a code: rounding, overflow, subnormal and
// NaN-sign rules. Every conversion takes a policy argument; docs/rounding.md defines each rule.
#pragma once

#include <cstdint>

#include <lowbit/emu/config.hpp>

namespace lowbit::emu {

enum class rounding : std::uint8_t {
  nearest_even, // to nearest, ties to the code whose last bit is 0
  nearest_away, // to nearest, ties away from zero
  toward_zero,
  up,         // toward +Inf
  down,       // toward -Inf
  odd,        // to the neighbour whose last code bit is 1 when inexact (sticky rounding)
  stochastic, // up with probability (x - lo)/(hi - lo), from k caller-supplied random bits
};

enum class overflow : std::uint8_t {
  saturate,      // finite overflow and Inf go to +-max finite
  nonsaturating, // IEEE 754 / OCP: Inf where the format has it, else NaN; see docs/rounding.md
};

enum class subnormals : std::uint8_t {
  keep,
  flush, // a result whose exact value is below the smallest normal becomes zero of its sign
};

enum class nan_sign : std::uint8_t {
  preserve, // a NaN keeps its sign where the format has signed NaNs
  positive, // every NaN result is the positive canonical NaN
};

struct policy {
  rounding round = rounding::nearest_even;
  overflow over = overflow::nonsaturating;
  subnormals sub = subnormals::keep;
  nan_sign nan = nan_sign::preserve;
  int random_bits = 0; // k, 1..32, for rounding::stochastic only

  friend constexpr bool operator==(const policy&, const policy&) = default;
};

constexpr const char* check_policy(const policy& p) {
  // (enumerators from a C++ caller's cast of an integer, which the switches would not know)
  if (static_cast<int>(p.round) > static_cast<int>(rounding::stochastic))
    return "rounding is not one of the roundings";
  if (static_cast<int>(p.over) > static_cast<int>(overflow::nonsaturating))
    return "overflow is not saturate or nonsaturating";
  if (static_cast<int>(p.sub) > static_cast<int>(subnormals::flush))
    return "subnormals is not keep or flush";
  if (static_cast<int>(p.nan) > static_cast<int>(nan_sign::positive))
    return "nan_sign is not preserve or positive";
  if (p.round == rounding::stochastic && (p.random_bits < 1 || p.random_bits > 32))
    return "stochastic rounding needs 1..32 random bits";
  if (p.round != rounding::stochastic && p.random_bits != 0)
    return "random bits are only used by stochastic rounding";
  return nullptr;
}

// Named policies for the common cases, so call sites say what they mean.
inline constexpr policy rne{}; // IEEE 754 default: nearest-even, Inf/NaN on overflow
inline constexpr policy rne_sat{rounding::nearest_even, overflow::saturate};
inline constexpr policy truncate{rounding::toward_zero, overflow::saturate};
constexpr policy stochastic(int k, overflow o) {
  return policy{rounding::stochastic, o, subnormals::keep, nan_sign::preserve, k};
}

} // namespace lowbit::emu
