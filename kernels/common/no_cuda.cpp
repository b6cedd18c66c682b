// Stand-ins for the CUDA entry points in builds without CUDA: device views are refused clearly.
#include <lowbit/kernels/tensor.hpp>

#include "../cast/cast_internal.hpp"
#include "../blockwise/blockwise_internal.hpp"
#include "../quantize/quantize_internal.hpp"
#include "device_check.hpp"

namespace lowbit::kernels {

namespace {
[[noreturn]] void no_cuda() {
  throw error(errc::unsupported,
              "this lowbit build has no CUDA kernels (configure with LOWBIT_ENABLE_CUDA=ON)");
}
}  // namespace

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }

void require_device_memory(std::initializer_list<const tensor_view*>,
                           std::initializer_list<const char*>) {
  no_cuda();
}

namespace cuda {
void cast(const tensor_view&, const tensor_view&, const emu::format&, const emu::policy&,
          const emu::random_stream&, const exec&) {
  no_cuda();
}
void decode(const tensor_view&, const tensor_view&, const emu::format&, const exec&) { no_cuda(); }
void quantize(const quant_problem&, const exec&) { no_cuda(); }
void dequantize(const dequant_problem&, const exec&) { no_cuda(); }
void quantize_mx(const mx_problem&, const exec&) { no_cuda(); }
void dequantize_mx(const dequant_problem&, const exec&) { no_cuda(); }
void quantize_blockwise(const blockwise_problem&, const exec&) { no_cuda(); }
void dequantize_blockwise(const blockwise_dequant_problem&, const exec&) { no_cuda(); }
void estimate_quantiles(const quantile_problem&, const exec&) { no_cuda(); }
}  // namespace cuda

}  // namespace lowbit::kernels
