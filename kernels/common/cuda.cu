#include "cuda.hpp"
#include "device_check.hpp"

#include <mutex>
#include <vector>

namespace lowbit::kernels {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky "no device" error for later calls
    return 0;
  }
  return n;
}

bool cuda_available() {
  return cuda_device_count() > 0;
}

namespace cuda {

namespace {
// Attribute A of the current device, asked once per device.
template <cudaDeviceAttr A> int cached_attribute() {
  return once_per_device([](int dev) {
    int n = 0;
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&n, A, dev));
    return n;
  });
}
} // namespace

int sm_count() {
  return cached_attribute<cudaDevAttrMultiProcessorCount>();
}
int max_shared_per_block() {
  return cached_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
}
int max_shared_per_sm() {
  return cached_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>();
}

// The least the pool keeps mapped between calls.
constexpr std::uint64_t min_keep = std::uint64_t{256} << 20;

cudaMemPool_t scratch_pool() {
  static std::mutex mu;
  static std::vector<cudaMemPool_t> pools; // per device; never destroyed (process lifetime)
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(pools.size()) <= dev)
    pools.resize(static_cast<std::size_t>(dev) + 1, nullptr);
  cudaMemPool_t& pool = pools[static_cast<std::size_t>(dev)];
  if (pool == nullptr) {
    int supported = 0;
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
    if (supported == 0) {
      LOWBIT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    } else {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = dev;
      LOWBIT_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
      std::uint64_t keep = min_keep;
      LOWBIT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
  }
  return pool;
}

void note_scratch_use(cudaMemPool_t pool) {
  // Two threads may race here; each sets a threshold it has seen in use, and a lower one
  // written last is raised again by the next large call.
  std::uint64_t used = 0, keep = 0;
  LOWBIT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &used));
  LOWBIT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  if (used > keep)
    LOWBIT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &used));
}

void require_device_memory(const tensor_view& v, const char* arg) {
  if (v.numel() == 0)
    return;
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, v.data);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw error(errc::invalid_argument, std::string(arg) + ": the pointer is not known to CUDA (" +
                                            cudaGetErrorString(err) +
                                            "); pass device memory for a cuda view");
  }
  require(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
          errc::invalid_argument, [&] {
            return std::string(arg) + ": a cuda view must point to device (or managed) memory";
          });
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice", __FILE__, __LINE__);
  require(attr.device == v.dev.index && dev == v.dev.index, errc::invalid_argument, [&] {
    return std::string(arg) + ": the memory is on cuda:" + std::to_string(attr.device) +
           " but the current device is cuda:" + std::to_string(dev) +
           " (view says cuda:" + std::to_string(v.dev.index) + ")";
  });
}

} // namespace cuda

void require_device_memory(std::initializer_list<const tensor_view*> views,
                           std::initializer_list<const char*> names) {
  auto name = names.begin();
  for (const tensor_view* v : views)
    cuda::require_device_memory(*v, *name++);
}

} // namespace lowbit::kernels
