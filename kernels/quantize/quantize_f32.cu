// quantize() and quantize_mx() for float32 inputs (quantize_kernels.cuh).
#include "quantize_kernels.cuh"

namespace lowbit::kernels::cuda {

template void quantize_input<float>(const quant_problem&, const exec&);
template void quantize_mx_input<float>(const mx_problem&, const exec&);

} // namespace lowbit::kernels::cuda
