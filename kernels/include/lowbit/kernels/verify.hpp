// Checking a candidate array against a reference: bit for bit, within n ulps of a format's grid,
// within an absolute/relative tolerance, or within a bound computed per element. The result is a
// report (counts, largest errors, the worst elements with their index and bit patterns, a
// histogram of ulp distances) that prints readably, so a failing test says where and by how much:
//
//   const auto r = lowbit::verify::compare(lowbit::verify::view(out), lowbit::verify::view(ref),
//                                          lowbit::verify::ulp(1, lowbit::emu::e4m3fn));
//   EXPECT_TRUE(r.ok()) << r;  // GoogleTest; no dependency of the library on it
//
// Host memory only (CUDA views are refused with a message). docs/verification.md defines every
// policy and every field of the report; Python's lowbit.verify and `lowbit verify` call this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <lowbit/emu/format.hpp>
#include <lowbit/kernels/tensor.hpp>

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

struct options {
  std::size_t worst = 10; // how many elements the worst list keeps
  // The format of code inputs (uint8/16/32); unset: such inputs show as plain integers.
  std::optional<emu::format> input_format;
};

// Compares candidate against reference (same shape, host memory, any strides) under p. Values:
// float32, float64, float16, bfloat16 (exact), int8/int16/int32 (integers), or uint8/16/32 codes
// of p.format. `inputs` (same shape), when given, are shown next to the worst elements and passed
// to bound functions. Throws lowbit::error for unusable arguments, never for differences.
report compare(const kernels::tensor_view& candidate, const kernels::tensor_view& reference,
               const policy& p, const std::optional<kernels::tensor_view>& inputs = std::nullopt,
               const options& opt = {});

// ---- views of host containers ------------------------------------------------------------

template <class T> constexpr kernels::dtype dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return kernels::dtype::float32;
  else if constexpr (std::is_same_v<U, double>)
    return kernels::dtype::float64;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return kernels::dtype::uint8;
  else if constexpr (std::is_same_v<U, std::uint16_t>)
    return kernels::dtype::uint16;
  else if constexpr (std::is_same_v<U, std::uint32_t>)
    return kernels::dtype::uint32;
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return kernels::dtype::int8;
  else if constexpr (std::is_same_v<U, std::int16_t>)
    return kernels::dtype::int16;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return kernels::dtype::int32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return kernels::dtype::int64;
  else
    static_assert(sizeof(U) == 0, "lowbit::verify::view: unsupported element type");
}

// A contiguous view of a vector, array or span; 1-d, or of the given shape (row-major).
template <class C> kernels::tensor_view view(const C& container) {
  using T = std::remove_pointer_t<decltype(std::data(container))>;
  return kernels::tensor_view::contiguous(std::data(container), dtype_of<T>(),
                                          {static_cast<std::int64_t>(std::size(container))});
}
template <class C>
kernels::tensor_view view(const C& container, std::initializer_list<std::int64_t> shape) {
  using T = std::remove_pointer_t<decltype(std::data(container))>;
  auto v = kernels::tensor_view::contiguous(std::data(container), dtype_of<T>(), shape);
  require(v.numel() == static_cast<std::int64_t>(std::size(container)), errc::invalid_argument,
          "lowbit::verify::view: shape " + v.shape_string() + " holds " +
              std::to_string(v.numel()) + " elements but the container has " +
              std::to_string(std::size(container)));
  return v;
}

} // namespace lowbit::verify
