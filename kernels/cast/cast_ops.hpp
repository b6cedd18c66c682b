// Per-element cast code shared by the CPU twin and the CUDA kernel.
#pragma once

#include <cstdint>

#include <lowbit/emu/convert.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "../common/dispatch.hpp"

namespace lowbit::kernels::cast_ops {

// Storage of 16-bit float inputs, read as their exact float value.
struct f16_bits {
  std::uint16_t bits;
};
struct bf16_bits {
  std::uint16_t bits;
};

LOWBIT_HD constexpr float load(float x) { return x; }
LOWBIT_HD constexpr double load(double x) { return x; }
LOWBIT_HD constexpr float load(f16_bits x) {
  constexpr emu::format f16 = emu::float16;  // a local copy: device code cannot bind the global
  return emu::decode<float>(f16, x.bits);
}
LOWBIT_HD constexpr float load(bf16_bits x) {
  return emu::detail::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}

template <class FormatTag, class PolicyTag, class T>
LOWBIT_HD LOWBIT_INLINE std::uint32_t encode_one(FormatTag ft, PolicyTag pt, T x,
                                                 std::uint32_t rbits) {
  return detail::encode(ft, pt, load(x), rbits);
}

// Calls fn(storage_type_tag) for the input dtype of a cast.
template <class Fn>
decltype(auto) dispatch_input(dtype t, Fn&& fn) {
  switch (t) {
    case dtype::float64: return fn(double{});
    case dtype::float16: return fn(f16_bits{});
    case dtype::bfloat16: return fn(bf16_bits{});
    default: return fn(float{});
  }
}

}  // namespace lowbit::kernels::cast_ops
