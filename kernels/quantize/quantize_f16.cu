// quantize() and quantize_mx() for element_ops::f16_bits inputs (quantize_kernels.cuh).
#include "quantize_kernels.cuh"

namespace lowbit::kernels::cuda {

template void quantize_input<element_ops::f16_bits>(const quant_problem&, const exec&);
template void quantize_mx_input<element_ops::f16_bits>(const mx_problem&, const exec&);

} // namespace lowbit::kernels::cuda
