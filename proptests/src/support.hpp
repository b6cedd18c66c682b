// Shared helpers of lowbit's own property tests (not installed): the formats and policies under
// test, readable descriptions of failing inputs, a rapidcheck driver with fixed seeds and case
// counts, tables of reference results for exhaustive sweeps, and a two-thread loop.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/emu/names.hpp>

namespace lowbit::proptest::test {

struct named_format {
  std::string name;
  emu::format fmt;
};
// gtest prints parameters through this (test names use the format name).
inline void PrintTo(const named_format& f, std::ostream* os) {
  *os << f.name;
}

// Every named format of emu plus user-defined formats that reach the corners of the definition:
// no mantissa bits (with zero, with fn NaN, unsigned), one exponent bit, unsigned formats, a
// signed format without zero, exponent ranges beyond float's in both directions, 16-bit fn/fnuz.
const std::vector<named_format>& all_formats();
// The subsets of all_formats() of at most 16 and at most 8 bits.
std::vector<named_format> formats_up_to(int bits);
// gtest parameter names must be alphanumeric or '_'.
std::string test_name(const named_format& f);

// Every deterministic rounding x overflow x subnormals x nan_sign (48 policies).
std::vector<emu::policy> deterministic_policies();
// The 6 deterministic roundings x 2 overflows with subnormals kept and NaN sign preserved.
std::vector<emu::policy> rounding_overflow_policies();
// The 8 stochastic policies with k random bits (overflow x subnormals x nan_sign).
std::vector<emu::policy> stochastic_policies(int k);

std::string describe(const emu::policy& p);
std::string hex_code(std::uint32_t code);
// "0x1.8p+3 (bits 0x4028000000000000)": exact and unambiguous for NaN payloads and -0.
std::string describe_input(double x);
std::string describe_input(float x);

// Runs a rapidcheck property with `cases` successful cases (times LOWBIT_PROPTEST_SCALE when set)
// and a seed derived from `id`, so that CI runs are reproducible; RC_PARAMS="seed=..." overrides
// the seed. A failure is reported to gtest with rapidcheck's counterexample.
void check_property(const std::string& id, int cases, std::function<void()> property);

// The reference's result for every double, tabulated for one (format, deterministic policy):
// under a deterministic rounding the result is constant between consecutive breakpoints (grid
// points and midpoints), so the reference is asked once per breakpoint and once inside each open
// interval, and a double is classified by exact comparison against the breakpoints.
struct breakpoint_table {
  emu::format fmt;
  emu::policy pol;
  std::vector<double> points; // ascending magnitudes: 0, grid points, midpoints, max + ulp
  // [negative][j]: the result at points[j], and on the open interval (points[j-1], points[j]);
  // between[s][n] (n = points.size()) covers (points[n-1], +Inf).
  std::vector<std::uint32_t> at[2], between[2];
  std::uint32_t infinity[2] = {}, nan[2] = {};

  std::uint32_t expected(double x) const;
};
// Builds the table from reference::round alone (the format must have at most 16 bits).
breakpoint_table make_breakpoint_table(const emu::format& f, const emu::policy& p);

// Calls fn(t) for t in [0, threads) on `threads` threads (the CI machine has two cores).
void on_threads(int threads, const std::function<void(int)>& fn);

// Seconds since the epoch of steady_clock, for the wall-time lines the sweeps print.
double now_seconds();

} // namespace lowbit::proptest::test

// rapidcheck prints generated values of these types in counterexamples through showValue (ADL).
namespace lowbit::emu {
void showValue(const policy& p, std::ostream& os);
void showValue(overflow o, std::ostream& os);
void showValue(const format& f, std::ostream& os);
} // namespace lowbit::emu
