// Dispatch of a quantization target to a format tag: e4m3fn and e5m2 (the hot fp8 formats)
// become compile-time constants, every other format and the integer targets run-time values.
#pragma once

#include <lowbit/kernels/quantize.hpp>

#include <type_traits>

#include "dispatch.hpp"

namespace lowbit::kernels::detail {

// An integer target fixed at compile time (int8 symmetric: SwitchBack and LLM.int8 style).
template <emu::int_format I>
struct fixed_int {
  static constexpr bool fixed = true;
  LOWBIT_HD static constexpr emu::int_format get_int() { return I; }
  LOWBIT_HD static constexpr emu::format get() { return emu::e4m3fn; }  // unused for integers
};

template <class T>
inline constexpr bool is_fixed_int = false;
template <emu::int_format I>
inline constexpr bool is_fixed_int<fixed_int<I>> = true;

template <class Fn>
decltype(auto) dispatch_target(const target& t, Fn&& fn) {
  if (!t.is_int && t.fmt == emu::e4m3fn) return fn(fixed_format<emu::e4m3fn>{});
  if (!t.is_int && t.fmt == emu::e5m2) return fn(fixed_format<emu::e5m2>{});
  if (t.is_int && t.ifmt == emu::int8_sym) return fn(fixed_int<emu::int8_sym>{});
  return fn(runtime_format{t.fmt});
}

// Compile-time formats for float32 inputs only (the hot path); other input types take the
// run-time path, which keeps the number of kernel instantiations (and build time) in check.
template <class In, class Fn>
decltype(auto) dispatch_target_for(const target& t, Fn&& fn) {
  if constexpr (std::is_same_v<In, float>)
    return dispatch_target(t, fn);
  else
    return fn(runtime_format{t.fmt});
}

}  // namespace lowbit::kernels::detail
