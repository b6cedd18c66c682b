// The activation quantization's CUDA entry points in builds without CUDA (host API callers reach
// them only with device views, which such a build refuses).
#include "../common/no_cuda.hpp"
#include "actquant_internal.hpp"

namespace lowbit::kernels::cuda {

void actquant_quantize(const actquant_problem&, const exec&) {
  throw_no_cuda();
}
void actquant_dequantize(const actquant_problem&, const exec&) {
  throw_no_cuda();
}
void actquant_layer_norm_backward(const ln_backward_problem&, const exec&) {
  throw_no_cuda();
}
void actquant_activation_backward(const act_backward_problem&, const exec&) {
  throw_no_cuda();
}

} // namespace lowbit::kernels::cuda
