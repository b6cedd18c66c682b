// CUDA helpers shared by every kernel: error checks that throw lowbit::error, stream-ordered
// scratch memory, the launch geometry, device-pointer validation, and aligned vector types for
// 16-byte memory access.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include <lowbit/emu/error.hpp>
#include <lowbit/kernels/tensor.hpp>

#define LOWBIT_CUDA_CHECK(expr) ::lowbit::kernels::cuda::check((expr), #expr, __FILE__, __LINE__)

namespace lowbit::kernels::cuda {

inline void check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess)
    throw error(errc::device, std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                                  cudaGetErrorString(err) + ") in " + what + " at " + file + ":" +
                                  std::to_string(line));
}

inline cudaStream_t stream_of(const exec& ex) {
  return static_cast<cudaStream_t>(ex.stream);
}

// The stream-ordered memory pool of lowbit's scratch memory on the current device: lowbit's own
// pool, which keeps memory mapped between calls (the default pool returns its memory at every
// synchronization, so the next call would map it again); the device's default pool where pools
// cannot be created. What it keeps: at least 256 MiB, raised by scratch to the most scratch that
// has been in use at once (see note_scratch_use), so that a workload repeating the same large
// calls (a 65536 x 5120 float32 accumulator is 1.3 GB) maps its memory once, not every call.
cudaMemPool_t scratch_pool();

// Raises the pool's release threshold to the bytes it has in use now, when that is more than it
// keeps already. Mapping and unmapping a gigabyte costs more than the matmul it serves; the
// memory stays reserved by lowbit until the process ends (it is never more than the largest
// working set of one call, or of concurrent calls on several streams).
void note_scratch_use(cudaMemPool_t pool);

// Stream-ordered scratch memory for the duration of one host call.
class scratch {
public:
  scratch(std::size_t bytes, cudaStream_t s) : stream_(s) {
    cudaMemPool_t pool = scratch_pool();
    LOWBIT_CUDA_CHECK(cudaMallocFromPoolAsync(&p_, bytes < 4 ? 4 : bytes, pool, s));
    note_scratch_use(pool);
  }
  ~scratch() { cudaFreeAsync(p_, stream_); }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p_); }

private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

// A positive value of the current device, computed once per device by compute(device) and
// kept per call site (each lambda type has its own cache); lock-free: two threads may both
// compute it, with the same result. Devices past the 64th are not cached.
template <class Compute> int once_per_device(Compute compute) {
  constexpr int max_devices = 64;
  static std::atomic<int> known[max_devices] = {}; // 0: not computed yet
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < max_devices) {
    const int k = known[dev].load(std::memory_order_relaxed);
    if (k > 0)
      return k;
  }
  const int v = compute(dev);
  if (dev < max_devices)
    known[dev].store(v, std::memory_order_relaxed);
  return v;
}

// Multiprocessor count of the current device (cached per device).
int sm_count();
// Shared memory a block of the current device may opt in to, in bytes (cached per device).
int max_shared_per_block();
// Shared memory of one multiprocessor of the current device, in bytes (cached per device).
int max_shared_per_sm();

// Blocks of `kernel` resident per SM with `block_threads` threads and `smem` bytes of dynamic
// shared memory, after opting in to that much; asked once per kernel and device (the first
// call's smem: give each kernel one value, the most it takes). Kernels that walk their work from
// a grid of this many blocks per SM run no partial second wave.
template <auto kernel> int resident_blocks(int block_threads, int smem) {
  return once_per_device([&](int) {
    // Opted in whatever the size: a kernel's static shared memory counts against the default
    // 48 KiB too.
    if (smem > 0)
      LOWBIT_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int n = 0;
    LOWBIT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block_threads, smem));
    return n < 1 ? 1 : n;
  });
}

// Blocks for a grid-stride loop over `work` items with `threads` per block: enough to fill the
// device a few times over, never more than the work needs.
inline unsigned grid_for(std::int64_t work, int threads, int blocks_per_sm = 8) {
  const std::int64_t need = (work + threads - 1) / threads;
  const std::int64_t cap = static_cast<std::int64_t>(sm_count()) * blocks_per_sm;
  const std::int64_t g = need < cap ? need : cap;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

// Blocks along y of a 2-D grid-stride loop whose gx blocks along x span a row (or a band of
// rows): about eight blocks per SM in all, at least one, at most one per row and 65535.
inline unsigned grid_rows_for(std::int64_t rows, unsigned gx) {
  const std::int64_t want = std::max<std::int64_t>(1, std::int64_t{sm_count()} * 8 / gx);
  return static_cast<unsigned>(
      std::max<std::int64_t>(1, std::min({want, rows, std::int64_t{65535}})));
}

// The grid of a loop over `rows` rows of `row_work` items each (a thread per item and step):
// blocks along a row for its items (up to 1024), grid_rows_for along the rows.
inline dim3 grid_2d_for(std::int64_t row_work, std::int64_t rows, int threads) {
  const auto gx =
      static_cast<unsigned>(std::min<std::int64_t>((row_work + threads - 1) / threads, 1024));
  return dim3(gx, grid_rows_for(rows, gx));
}

// Throws unless the view's memory is device memory of the current device (catches host
// pointers handed in as device views, which would otherwise fault inside a kernel).
void require_device_memory(const tensor_view& v, const char* arg);

// Throws the launch error, if any, of the last kernel launch.
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel, __FILE__, __LINE__);
}

template <class T, int N> struct alignas(sizeof(T) * N) vec { T v[N]; };

template <class T> inline bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

} // namespace lowbit::kernels::cuda
