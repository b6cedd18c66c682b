// Turns run-time formats, targets and policies into compile-time constants for the hot loops. A
// kernel body receives a "format tag" and a "policy tag" and asks them for the value; where the
// tag is fixed the value is a constant and emu's converter folds to straight-line code; otherwise
// the same body runs with run-time values. Shared by CPU twins and CUDA kernels of every technique.
#pragma once

#include <type_traits>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/emu/target.hpp>

namespace lowbit::kernels::detail {

template <emu::format F> struct fixed_format {
  static constexpr bool fixed = true;
  LOWBIT_HD static constexpr emu::format get() { return F; }
};
struct runtime_format {
  static constexpr bool fixed = false;
  emu::format f;
  LOWBIT_HD constexpr emu::format get() const { return f; }
};

// An integer target fixed at compile time (int8 symmetric: SwitchBack and LLM.int8 style). It
// has no format: code that takes a format tag asks is_fixed_int first.
template <emu::int_format I> struct fixed_int {
  static constexpr bool fixed = true;
  LOWBIT_HD static constexpr emu::int_format get_int() { return I; }
};

template <class T> inline constexpr bool is_fixed_int = false;
template <emu::int_format I> inline constexpr bool is_fixed_int<fixed_int<I>> = true;

// The run-time tag of a target. An integer target's code reads the target itself (t.is_int
// first) and never the tag's format, so the tag holds an empty format rather than a member of
// the target that is not held.
inline runtime_format runtime_format_of(const emu::target& t) {
  return runtime_format{t.is_int ? emu::format{} : t.fmt};
}

// A format to a tag for the GPU kernels: e4m3fn and e5m2 (the hot fp8 formats) become
// compile-time constants, every other format a run-time value (the CPU twins use
// dispatch_format, which fixes every named format).
template <class Fn> decltype(auto) dispatch_hot_format(const emu::format& f, Fn&& fn) {
  if (f == emu::e4m3fn)
    return fn(fixed_format<emu::e4m3fn>{});
  if (f == emu::e5m2)
    return fn(fixed_format<emu::e5m2>{});
  return fn(runtime_format{f});
}

// The same for float32 inputs only (the hot path); other input types take the run-time path,
// which keeps the number of kernel instantiations (and build time) in check.
template <class In, class Fn>
decltype(auto) dispatch_hot_format_for(const emu::format& f, Fn&& fn) {
  if constexpr (std::is_same_v<In, float>)
    return dispatch_hot_format(f, fn);
  else
    return fn(runtime_format{f});
}

// A target to a tag: e4m3fn and e5m2 (the hot fp8 formats) and int8 symmetric become
// compile-time constants, every other format and integer target a run-time value (GPU kernels).
template <class Fn> decltype(auto) dispatch_target(const emu::target& t, Fn&& fn) {
  if (!t.is_int && t.fmt == emu::e4m3fn)
    return fn(fixed_format<emu::e4m3fn>{});
  if (!t.is_int && t.fmt == emu::e5m2)
    return fn(fixed_format<emu::e5m2>{});
  if (t.is_int && t.ifmt == emu::int8_sym)
    return fn(fixed_int<emu::int8_sym>{});
  return fn(runtime_format_of(t));
}

// Compile-time targets for float32, bfloat16 and float16 inputs: the low-precision layers
// quantize their 16-bit activations and gradients on every step, and the run-time path is
// several times slower than the memory bandwidth; float64 inputs take the run-time path.
template <class In, class Fn> decltype(auto) dispatch_target_for(const emu::target& t, Fn&& fn) {
  if constexpr (!std::is_same_v<In, double>)
    return dispatch_target(t, fn);
  else
    return fn(runtime_format_of(t));
}

// Named formats become compile-time tags (CPU twins; the GPU kernels use dispatch_target).
template <class Fn> decltype(auto) dispatch_format(const emu::format& f, Fn&& fn) {
  using namespace emu;
  if (f == e4m3fn)
    return fn(fixed_format<e4m3fn>{});
  if (f == e5m2)
    return fn(fixed_format<e5m2>{});
  if (f == e4m3fnuz)
    return fn(fixed_format<e4m3fnuz>{});
  if (f == e5m2fnuz)
    return fn(fixed_format<e5m2fnuz>{});
  if (f == e8m0fnu)
    return fn(fixed_format<e8m0fnu>{});
  if (f == e3m2fn)
    return fn(fixed_format<e3m2fn>{});
  if (f == e2m3fn)
    return fn(fixed_format<e2m3fn>{});
  if (f == e2m1fn)
    return fn(fixed_format<e2m1fn>{});
  if (f == float16)
    return fn(fixed_format<float16>{});
  if (f == bfloat16)
    return fn(fixed_format<bfloat16>{});
  if (f == e4m3)
    return fn(fixed_format<e4m3>{});
  if (f == e3m4)
    return fn(fixed_format<e3m4>{});
  if (f == e4m3b11fnuz)
    return fn(fixed_format<e4m3b11fnuz>{});
  if (f == tfloat32)
    return fn(fixed_format<tfloat32>{});
  return fn(runtime_format{f});
}

// Policy tags: get() gives the policy, stochastic() whether random bits are needed. Where a tag
// fixes the rounding mode, both fold to constants in the per-element code.

// Run-time policy: a switch on the rounding mode (uniform across a warp on the GPU).
struct runtime_policy {
  static constexpr bool fixed = false;
  emu::policy p;
  LOWBIT_HD constexpr emu::policy get() const { return p; }
  LOWBIT_HD constexpr bool stochastic() const { return p.round == emu::rounding::stochastic; }
};

// The hot policy: rounding R, subnormals kept and NaN signs preserved are constants (the
// encoder then needs no select for them); overflow stays run-time (a min with a uniform bound).
// dispatch_policy hands other policies to runtime_policy.
template <emu::rounding R> struct fixed_rounding {
  static constexpr bool fixed = true;
  static constexpr emu::rounding mode = R;
  emu::policy p;
  LOWBIT_HD constexpr emu::policy get() const {
    return emu::policy{R, p.over, emu::subnormals::keep, emu::nan_sign::preserve, p.random_bits};
  }
  LOWBIT_HD static constexpr bool stochastic() { return R == emu::rounding::stochastic; }
};

// Nearest-even, the hot mode, is a constant; the other modes run with a run-time policy (and an
// out-of-line converter on the GPU), which keeps build times and kernel sizes small.
template <class Fn> decltype(auto) dispatch_policy(const emu::policy& p, Fn&& fn) {
  if (p.round == emu::rounding::nearest_even && p.sub == emu::subnormals::keep &&
      p.nan == emu::nan_sign::preserve)
    return fn(fixed_rounding<emu::rounding::nearest_even>{p});
  return fn(runtime_policy{p});
}

// The generic conversion, out of line in device code.
template <class T>
LOWBIT_HD LOWBIT_OUTLINE_ON_DEVICE std::uint32_t encode_generic(emu::format f, T x, emu::policy p,
                                                                std::uint32_t rbits) {
  return emu::encode(f, x, p, rbits);
}
template <class T>
LOWBIT_HD LOWBIT_OUTLINE_ON_DEVICE std::int32_t
quantize_int_generic(emu::int_format f, T x, emu::policy p, std::uint32_t rbits) {
  return emu::quantize_int(f, x, p, rbits);
}

// encode() through the tags: inlined where format and rounding are both compile-time constants
// (the hot paths), out of line otherwise.
template <class FT, class PT, class T>
LOWBIT_HD LOWBIT_INLINE std::uint32_t encode(FT ft, PT pt, T x, std::uint32_t rbits) {
  if constexpr (FT::fixed && PT::fixed)
    return emu::encode(ft.get(), x, pt.get(), rbits);
  else
    return encode_generic(ft.get(), x, pt.get(), rbits);
}

} // namespace lowbit::kernels::detail
