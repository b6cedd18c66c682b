// Asynchronous copies from global to shared memory, the staging of the group pass and of the
// quantile kernel's next chunk.
#pragma once

#include <cstdint>

#include "cuda.hpp"

namespace lowbit::kernels::cuda {

// The shared-memory address (the 32-bit offset in the shared window) of a pointer into shared
// memory. Kernels that keep such addresses in registers spare the conversion per access.
__device__ __forceinline__ std::uint32_t shared_address(const void* smem) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
}

// v through an opaque move: the compiler then keeps it in a register instead of computing it
// again where it is used (as it does with addresses in loops).
__device__ __forceinline__ std::uint32_t kept(std::uint32_t v) {
  std::uint32_t r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

// cp.async on sm_80 and later, a plain copy before. A thread sees its own copies once it has
// waited for their copy group; other threads see them after a barrier that follows that wait.
template <int Bytes>
__device__ __forceinline__ void copy_async(std::uint32_t dst, const void* gmem) {
  static_assert(Bytes == 8 || Bytes == 16, "cp.async of 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(gmem) : "memory");
#else
  if constexpr (Bytes == 16) {
    const uint4 w = *static_cast<const uint4*>(gmem);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(w.x), "r"(w.y),
                 "r"(w.z), "r"(w.w)
                 : "memory");
  } else {
    const uint2 w = *static_cast<const uint2*>(gmem);
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(dst), "r"(w.x), "r"(w.y) : "memory");
  }
#endif
}
template <int Bytes> __device__ __forceinline__ void copy_async(void* smem, const void* gmem) {
  copy_async<Bytes>(shared_address(smem), gmem);
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `pending` (0..3) of this thread's newest copy groups are unfinished.
__device__ __forceinline__ void copy_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  switch (pending) {
  case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
  case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
  case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
  default: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
  }
#else
  (void)pending;
#endif
}

} // namespace lowbit::kernels::cuda
