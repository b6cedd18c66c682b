// lowbit::verify::compare: a candidate array against a reference under a policy, and views of
// host containers to compare. Reads lowbit::kernels tensor views (the one tensor-view type of
// lowbit), so lowbit::verify depends on lowbit::emu and lowbit::kernels, never the reverse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <type_traits>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/kernels/tensor.hpp>
#include <lowbit/verify/policy.hpp>
#include <lowbit/verify/report.hpp>

namespace lowbit::verify {

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
