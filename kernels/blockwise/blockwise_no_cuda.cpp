// The block-wise quantization's CUDA entry points in builds without CUDA (host API callers reach
// them only with device views, which such a build refuses).
#include "../common/no_cuda.hpp"
#include "blockwise_internal.hpp"

namespace lowbit::kernels::cuda {

void quantize_blockwise(const blockwise_problem&, const exec&) {
  throw_no_cuda();
}
void dequantize_blockwise(const blockwise_dequant_problem&, const exec&) {
  throw_no_cuda();
}
void estimate_quantiles(const quantile_problem&, const exec&) {
  throw_no_cuda();
}

} // namespace lowbit::kernels::cuda
