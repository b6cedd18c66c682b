// quantize() and quantize_mx() for one input type (storage tags of element_ops.hpp), defined in
// quantize_kernels.cuh and instantiated in quantize_f32.cu, quantize_bf16.cu and quantize_f16.cu.
#pragma once

#include "../common/element_ops.hpp"
#include "quantize_internal.hpp"

namespace lowbit::kernels::cuda {

template <class In> void quantize_input(const quant_problem& p, const exec& ex);
template <class In> void quantize_mx_input(const mx_problem& p, const exec& ex);

extern template void quantize_input<float>(const quant_problem&, const exec&);
extern template void quantize_input<element_ops::bf16_bits>(const quant_problem&, const exec&);
extern template void quantize_input<element_ops::f16_bits>(const quant_problem&, const exec&);
extern template void quantize_mx_input<float>(const mx_problem&, const exec&);
extern template void quantize_mx_input<element_ops::bf16_bits>(const mx_problem&, const exec&);
extern template void quantize_mx_input<element_ops::f16_bits>(const mx_problem&, const exec&);

} // namespace lowbit::kernels::cuda
