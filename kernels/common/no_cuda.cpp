// The technique-free CUDA entry points in builds without CUDA: no device, and every device view
// refused clearly. Each technique's own stand-ins live beside its kernels.
#include "no_cuda.hpp"

#include <lowbit/kernels/tensor.hpp>

#include "device_check.hpp"

namespace lowbit::kernels {

void throw_no_cuda() {
  throw error(errc::unsupported,
              "this lowbit build has no CUDA kernels (configure with LOWBIT_ENABLE_CUDA=ON)");
}

bool cuda_available() {
  return false;
}
int cuda_device_count() {
  return 0;
}

void require_device_memory(std::initializer_list<const tensor_view*>,
                           std::initializer_list<const char*>) {
  throw_no_cuda();
}

} // namespace lowbit::kernels
