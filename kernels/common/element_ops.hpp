// How every technique reads its input elements, shared by the CPU twins and the CUDA kernels:
// float32 and float64 as they are, float16 and bfloat16 from their storage bits as their exact
// float value, and the dispatch from a tensor's dtype to the storage type a kernel loops over;
// and the float32 quotient and square root, correctly rounded on both (the CUDA intrinsics, so
// that no compiler flag trades them for approximations).
#pragma once

#include <cmath>
#include <cstdint>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/dtype.hpp>

namespace lowbit::kernels::element_ops {

// Storage of 16-bit float inputs, read as their exact float value.
struct f16_bits {
  std::uint16_t bits;
};
struct bf16_bits {
  std::uint16_t bits;
};

LOWBIT_HD constexpr float load(float x) {
  return x;
}
LOWBIT_HD constexpr double load(double x) {
  return x;
}
LOWBIT_HD constexpr float load(f16_bits x) {
  constexpr emu::format f16 = emu::float16; // a local copy: device code cannot bind the global
  return emu::decode<float>(f16, x.bits);
}
LOWBIT_HD constexpr float load(bf16_bits x) {
  return emu::detail::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}

LOWBIT_HD LOWBIT_INLINE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LOWBIT_HD LOWBIT_INLINE float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// Calls fn(storage_type_tag) for an input dtype: float64, float16, bfloat16, else float32 (the
// host APIs have refused every other dtype before).
template <class Fn> decltype(auto) dispatch_input(emu::dtype t, Fn&& fn) {
  switch (t) {
  case emu::dtype::float64: return fn(double{});
  case emu::dtype::float16: return fn(f16_bits{});
  case emu::dtype::bfloat16: return fn(bf16_bits{});
  default: return fn(float{});
  }
}

} // namespace lowbit::kernels::element_ops
