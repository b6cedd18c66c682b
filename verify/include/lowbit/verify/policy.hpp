// The policies of lowbit::verify: how close a candidate must be to its reference. Bit for bit
// (exact), within n ulps of a format's grid (ulp), within an absolute/relative tolerance
// (tolerance), or within a bound computed per element (bound); and their text form
// ("ulp:1@e4m3fn"), which the Python package and `lowbit verify` use too.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <lowbit/emu/format.hpp>

namespace lowbit::verify {

enum class policy_kind : std::uint8_t { exact, ulp, tolerance, bound };

// What a bound function sees of one element.
struct bound_args {
  std::span<const std::int64_t> index; // multi-dimensional, one entry per dimension
  std::int64_t flat_index = 0;         // row-major
  double reference = 0;                // the reference element's exact value
  std::optional<double> input;         // the input element's value, when inputs were given
};
// Returns the largest absolute error allowed at that element (>= 0; +Inf allows anything).
using bound_function = std::function<double(const bound_args&)>;

struct policy {
  policy_kind kind = policy_kind::exact;
  // The format of code arrays (uint8/16/32) and the grid of every ulp distance; unset: code
  // arrays are refused and the grid is the candidate's dtype (float64 bits, or the integers).
  std::optional<emu::format> format;
  bool strict_nan = false;   // exact: NaNs must match bit for bit too (default: any NaN)
  double max_ulp = 0;        // ulp: the largest allowed distance (need not be an integer)
  double atol = 0, rtol = 0; // tolerance: |c - r| <= atol + rtol * |r|
  bound_function bound;      // bound: |c - r| <= bound(element)
  std::string bound_name;    // bound: shown as "bound:<name>" in reports
};

policy exact(bool strict_nan = false);
policy ulp(double n, std::optional<emu::format> fmt = std::nullopt);
policy tolerance(double atol, double rtol = 0);
policy bound(bound_function fn, std::string name = {});

// "exact", "exact:strict", "ulp:N", "atol:X", "rtol:Y", "atol:X,rtol:Y", each optionally followed
// by "@<format>"; `fmt`, when given, must agree with the text's format. Throws lowbit::error.
policy parse_policy(std::string_view text, std::optional<emu::format> fmt = std::nullopt);
// The canonical text of a policy (parse_policy(to_string(p)) == p except for bound policies).
std::string to_string(const policy& p);
// Throws lowbit::error unless p is usable (tolerances >= 0 and not NaN, a bound function, ...).
void validate(const policy& p);

} // namespace lowbit::verify
