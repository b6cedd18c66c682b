// Asynchronous copies from global to shared memory, the staging of the group pass and of the
// quantile kernel's next chunk.
#pragma once

#include <cstdint>

#include "cuda.hpp"

namespace lowbit::kernels::cuda {

// cp.async on sm_80 and later, a plain copy before. A thread sees its own copies once it has
// waited for their copy group; other threads see them after a barrier that follows that wait.
template <int Bytes>
__device__ __forceinline__ void copy_async(void* smem, const void* gmem) {
  static_assert(Bytes == 8 || Bytes == 16, "cp.async of 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(gmem) : "memory");
#else
  using word = vec<std::uint32_t, Bytes / 4>;
  *static_cast<word*>(smem) = *static_cast<const word*>(gmem);
#endif
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

}  // namespace lowbit::kernels::cuda
