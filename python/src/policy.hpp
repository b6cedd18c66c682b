// The rounding arguments that every converting call of lowbit._core takes (cast, the scaled
// quantizations), as one Python-side bundle (lowbit._core._Rounding), turned into emu's policy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/emu/policy.hpp>

#include "arrays.hpp"

namespace lowbit::python {

inline emu::subnormals parse_subnormals(const std::string& s) {
  if (s == "keep")
    return emu::subnormals::keep;
  if (s == "flush")
    return emu::subnormals::flush;
  fail(errc::invalid_argument, "subnormals '" + s + "': expected one of keep, flush");
}

inline emu::nan_sign parse_nan_sign(const std::string& s) {
  if (s == "preserve")
    return emu::nan_sign::preserve;
  if (s == "positive")
    return emu::nan_sign::positive;
  fail(errc::invalid_argument, "nan_sign '" + s + "': expected one of preserve, positive");
}

struct rounding_args {
  std::string rounding = "nearest_even";
  bool saturate = false;
  std::string subnormals = "keep";
  std::string nan_sign = "preserve";
  std::optional<std::int64_t> random_bits;
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;

  emu::policy policy() const {
    emu::policy p;
    p.round = emu::parse_rounding(rounding);
    p.over = saturate ? emu::overflow::saturate : emu::overflow::nonsaturating;
    p.sub = parse_subnormals(subnormals);
    p.nan = parse_nan_sign(nan_sign);
    if (p.round == emu::rounding::stochastic) {
      const std::int64_t bits = random_bits.value_or(32);
      if (bits < 1 || bits > 32)
        fail(errc::invalid_argument,
             "random_bits: stochastic rounding takes 1..32 random bits, got " +
                 std::to_string(bits));
      p.random_bits = static_cast<int>(bits);
    } else if (random_bits) {
      // Accepting and ignoring them would hide a mistaken rounding argument.
      fail(errc::invalid_argument, "random_bits: only rounding='stochastic' uses random bits "
                                   "(got rounding='" +
                                       rounding + "')");
    }
    emu::validate(p);
    return p;
  }
  emu::random_stream rng() const { return emu::random_stream{seed, offset}; }
};

} // namespace lowbit::python
