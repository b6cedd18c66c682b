// Portability macros shared by every lowbit header that runs on both the host and the device.
// emu code is written once and compiled by the host compiler and by nvcc; LOWBIT_HD marks it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOWBIT_HD __host__ __device__
#define LOWBIT_DEVICE_ONLY __device__
#else
#define LOWBIT_HD
#define LOWBIT_DEVICE_ONLY
#endif

// Forces inlining of the per-element converter so that a format and policy known at the call site
// fold into straight-line code (the compilers' size heuristics would otherwise keep a call).
#if defined(__CUDACC__)
#define LOWBIT_INLINE __forceinline__
#elif defined(__GNUC__)
#define LOWBIT_INLINE inline __attribute__((always_inline))
#else
#define LOWBIT_INLINE inline
#endif

// An out-of-line function in device code (one copy per kernel module instead of one per call
// site), an ordinary inline function on the host. Used for the generic (run-time format or
// policy) conversion paths, which would otherwise be inlined, fully unrolled, into every kernel.
#if defined(__CUDACC__)
#define LOWBIT_OUTLINE_ON_DEVICE __noinline__
#else
#define LOWBIT_OUTLINE_ON_DEVICE inline
#endif

#if defined(__CUDA_ARCH__)
#define LOWBIT_ON_DEVICE 1
#else
#define LOWBIT_ON_DEVICE 0
#endif

namespace lowbit::emu::detail {

// std::bit_cast is not callable from device code without --expt-relaxed-constexpr on every
// translation unit; the builtin behind it is available to gcc, clang and nvcc alike.
template <class To, class From> LOWBIT_HD constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From));
  return __builtin_bit_cast(To, from);
}

// Number of bits needed to hold v (0 for 0). Used only off the hot path (subnormal sources).
LOWBIT_HD constexpr int bit_width(std::uint64_t v) noexcept {
  int n = 0;
  while (v != 0) {
    v >>= 1;
    ++n;
  }
  return n;
}

} // namespace lowbit::emu::detail
