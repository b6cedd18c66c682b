// Stand-ins for the CUDA entry points in builds without CUDA: device views are refused clearly.
#include <lowbit/kernels/tensor.hpp>

#include "../cast/cast_internal.hpp"

namespace lowbit::kernels {

namespace {
[[noreturn]] void no_cuda() {
  throw error(errc::unsupported,
              "this lowbit build has no CUDA kernels (configure with LOWBIT_ENABLE_CUDA=ON)");
}
}  // namespace

bool cuda_available() { return false; }

namespace cuda {
void cast(const tensor_view&, const tensor_view&, const emu::format&, const emu::policy&,
          const emu::random_stream&, const exec&) {
  no_cuda();
}
void decode(const tensor_view&, const tensor_view&, const emu::format&, const exec&) { no_cuda(); }
}  // namespace cuda

}  // namespace lowbit::kernels
