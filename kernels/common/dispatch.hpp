// Turns run-time formats and policies into compile-time constants for the hot loops. A kernel body
// receives a "format tag" and a "policy tag" and asks them for the value; for the named formats and
// every rounding/overflow pair the value is a constant and emu's converter folds to straight-line
// code; any other format runs the same body with run-time values. Shared by CPU twins and CUDA.
#pragma once

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/policy.hpp>

namespace lowbit::kernels::detail {

template <emu::format F>
struct fixed_format {
  LOWBIT_HD static constexpr emu::format get() { return F; }
};
struct runtime_format {
  emu::format f;
  LOWBIT_HD constexpr emu::format get() const { return f; }
};

// Rounding and overflow are constants; subnormal, NaN-sign and random-bit settings stay run-time
// (they cost a branch on rare values only).
template <emu::rounding R, emu::overflow O>
struct fixed_policy {
  emu::subnormals sub;
  emu::nan_sign nan;
  int random_bits;
  LOWBIT_HD constexpr emu::policy get() const { return emu::policy{R, O, sub, nan, random_bits}; }
  static constexpr bool stochastic = R == emu::rounding::stochastic;
};

template <class Fn>
decltype(auto) dispatch_format(const emu::format& f, Fn&& fn) {
  using namespace emu;
  if (f == e4m3fn) return fn(fixed_format<e4m3fn>{});
  if (f == e5m2) return fn(fixed_format<e5m2>{});
  if (f == e4m3fnuz) return fn(fixed_format<e4m3fnuz>{});
  if (f == e5m2fnuz) return fn(fixed_format<e5m2fnuz>{});
  if (f == e8m0fnu) return fn(fixed_format<e8m0fnu>{});
  if (f == e3m2fn) return fn(fixed_format<e3m2fn>{});
  if (f == e2m3fn) return fn(fixed_format<e2m3fn>{});
  if (f == e2m1fn) return fn(fixed_format<e2m1fn>{});
  if (f == float16) return fn(fixed_format<float16>{});
  if (f == bfloat16) return fn(fixed_format<bfloat16>{});
  return fn(runtime_format{f});
}

template <emu::rounding R, class Fn>
decltype(auto) dispatch_overflow_for(const emu::policy& p, Fn&& fn) {
  if (p.over == emu::overflow::saturate)
    return fn(fixed_policy<R, emu::overflow::saturate>{p.sub, p.nan, p.random_bits});
  return fn(fixed_policy<R, emu::overflow::nonsaturating>{p.sub, p.nan, p.random_bits});
}

// Run-time policy; only whether random bits are needed is a constant.
struct runtime_policy {
  emu::policy p;
  LOWBIT_HD constexpr emu::policy get() const { return p; }
};
template <bool Stochastic>
struct runtime_policy_of : runtime_policy {
  static constexpr bool stochastic = Stochastic;
};

// For CPU twins, where compile time matters more than a few predictable branches.
template <class Fn>
decltype(auto) dispatch_stochastic(const emu::policy& p, Fn&& fn) {
  if (p.round == emu::rounding::stochastic) return fn(runtime_policy_of<true>{{p}});
  return fn(runtime_policy_of<false>{{p}});
}

// For GPU kernels: rounding and overflow become constants.
template <class Fn>
decltype(auto) dispatch_policy(const emu::policy& p, Fn&& fn) {
  using emu::rounding;
  switch (p.round) {
    case rounding::nearest_even: return dispatch_overflow_for<rounding::nearest_even>(p, fn);
    case rounding::nearest_away: return dispatch_overflow_for<rounding::nearest_away>(p, fn);
    case rounding::toward_zero: return dispatch_overflow_for<rounding::toward_zero>(p, fn);
    case rounding::up: return dispatch_overflow_for<rounding::up>(p, fn);
    case rounding::down: return dispatch_overflow_for<rounding::down>(p, fn);
    case rounding::odd: return dispatch_overflow_for<rounding::odd>(p, fn);
    case rounding::stochastic: break;
  }
  return dispatch_overflow_for<rounding::stochastic>(p, fn);
}

}  // namespace lowbit::kernels::detail
