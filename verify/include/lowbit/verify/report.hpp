// The report of a lowbit::verify comparison: counts, largest errors, the worst elements with
// their index and bit patterns, and a histogram of ulp distances; printable as text and JSON.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace lowbit::verify {

// One element of the report's worst list.
struct element {
  std::vector<std::int64_t> index;     // multi-dimensional
  std::int64_t flat_index = 0;         // row-major
  std::optional<double> input;         // the input's value, when inputs were given
  std::string input_hex;               // its bit pattern ("" without inputs)
  double candidate = 0, reference = 0; // exact values (NaN for NaN)
  std::string candidate_hex, reference_hex;
  double abs_error = 0, rel_error = 0, ulp_error = 0; // NaN for a NaN mismatch
  double allowed = 0; // exact: 0; ulp: the policy's n; tolerance and bound: the absolute error
  bool failed = false;
  bool nan_mismatch = false;
};

// Elements whose ulp distance d lies in (lo, hi]; the first bucket is d == 0 (lo = hi = 0).
struct histogram_bucket {
  std::string label;
  double lo = 0, hi = 0;
  std::int64_t count = 0;
};

struct report {
  std::string policy; // to_string(policy)
  std::string grid;   // where ulp distances are counted: a format name, "float64" or "integers"
  std::string candidate_dtype, reference_dtype, input_dtype; // input_dtype "" without inputs
  std::vector<std::int64_t> shape;
  // total = checked + nan_matches + nan_mismatches. checked: pairs with no NaN (they have errors
  // and fill the histogram); nan_matches: NaN against NaN, accepted (bits too under
  // exact:strict); nan_mismatches: NaN against a number, or NaNs whose bits differ under
  // exact:strict. failed counts every element the policy rejects, NaN mismatches included.
  std::int64_t total = 0, checked = 0, nan_matches = 0, nan_mismatches = 0, failed = 0;
  double max_abs_error = 0, max_rel_error = 0, max_ulp_error = 0; // over the checked elements
  std::vector<element> worst; // failing first, then by error; elements with no error left out
  std::vector<histogram_bucket> histogram; // non-empty buckets, ascending; counts sum to checked

  bool ok() const { return failed == 0; }
  explicit operator bool() const { return ok(); }
  std::string to_string() const;
  std::string to_json() const;
};
std::ostream& operator<<(std::ostream& os, const report& r);

} // namespace lowbit::verify
