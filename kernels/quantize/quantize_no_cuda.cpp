// The quantization's CUDA entry points in builds without CUDA (host API callers reach them only
// with device views, which such a build refuses).
#include "../common/no_cuda.hpp"
#include "quantize_internal.hpp"

namespace lowbit::kernels::cuda {

void quantize(const quant_problem&, const exec&) {
  throw_no_cuda();
}
void dequantize(const dequant_problem&, const exec&) {
  throw_no_cuda();
}
void quantize_mx(const mx_problem&, const exec&) {
  throw_no_cuda();
}
void dequantize_mx(const dequant_problem&, const exec&) {
  throw_no_cuda();
}

} // namespace lowbit::kernels::cuda
