// The exact reference for emu's conversions: the value of every code, and rounding to a format or
// an integer target, computed from the definitions in docs/rounding.md with exact rationals
// (Boost.Multiprecision). It enumerates a format's values and compares exactly instead of
// manipulating bits, so it shares no code and no tricks with emu/convert.hpp: the property tests
// hold the two against each other. Obviously correct before fast (a round() costs microseconds).
//
// emu::format, emu::int_format and emu::policy are used as plain data; every rule is re-derived
// here. All functions are thread-safe; per-format tables are built once and cached.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <boost/multiprecision/cpp_int.hpp>

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/policy.hpp>

namespace lowbit::reference {

using rational = boost::multiprecision::cpp_rational;
using integer = boost::multiprecision::cpp_int;

// ---- codes ---------------------------------------------------------------------------------

// Whether `code` is a NaN / an infinity of f, by the specials table of docs/rounding.md.
// Codes wider than f.bits() are refused (lowbit::error), as in every function taking a code.
bool is_nan(const emu::format& f, std::uint32_t code);
bool is_inf(const emu::format& f, std::uint32_t code);
// True when `code` carries a sign bit that is set (formats without a sign bit: false).
bool sign_of(const emu::format& f, std::uint32_t code);

// The exact value of a finite code, by the definition (sign, exponent field, mantissa field).
// Both zeros give 0 (see sign_of). Throws lowbit::error for NaN and Inf codes.
rational value_of(const emu::format& f, std::uint32_t code);

// Every finite value of f, ascending, one entry per distinct value with one code for it (+0 once,
// with its positive code). Cached per format. Formats of more than 16 bits are refused (2^32
// rationals do not fit in memory); round() handles them by searching the codes lazily.
const std::vector<std::pair<rational, std::uint32_t>>& finite_values(const emu::format& f);

// ---- facts of a format, derived from its values ----------------------------------------------

rational max_value(const emu::format& f);    // largest finite value
rational min_positive(const emu::format& f); // smallest positive value (subnormal or not)
rational min_normal(const emu::format& f);   // smallest positive value with an implicit 1
// The grid point above max: max + 2^(emax - M), where 2^emax <= max < 2^(emax + 1).
rational grid_above_max(const emu::format& f);
// True when grid value v (nonnegative, on the grid including grid_above_max) has an odd
// significand v / 2^(max(E_v, emin) - M) (docs/rounding.md); throws if v is not on the grid.
bool odd_significand(const emu::format& f, const rational& v);

// Consecutive grid points around a magnitude: lo <= a <= hi (lo == hi == a when a is on the grid;
// lo may be 0). The grid is the nonnegative finite values plus grid_above_max(f).
struct bracket {
  rational lo, hi;
};
// Requires min(grid) <= a <= grid_above_max(f); throws lowbit::error otherwise.
bracket neighbours(const emu::format& f, const rational& a);

// ---- rounding --------------------------------------------------------------------------------

// x exactly as a rational (finite x only; throws for NaN and Inf).
rational exact(double x);

// emu::encode(f, x, p, rbits) as docs/rounding.md defines it, for every double (NaN, Inf, zeros
// included). rbits: the random bits of stochastic rounding (the low p.random_bits bits count).
std::uint32_t round(const emu::format& f, double x, const emu::policy& p, std::uint32_t rbits = 0);
// The same for an exact value. `negative` gives the sign of an exact zero; for x != 0 the sign of
// x is used and `negative` is ignored.
std::uint32_t round(const emu::format& f, const rational& x, bool negative, const emu::policy& p,
                    std::uint32_t rbits = 0);

// emu::quantize_int(f, x, p, rbits) per the "Integer targets" section: round to an integer under
// p.round, then clamp to f's range; +-Inf clamp, NaN gives 0.
std::int32_t round_int(const emu::int_format& f, double x, const emu::policy& p,
                       std::uint32_t rbits = 0);
std::int32_t round_int(const emu::int_format& f, const rational& x, const emu::policy& p,
                       std::uint32_t rbits = 0);

} // namespace lowbit::reference
