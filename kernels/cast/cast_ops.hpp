// Per-element cast code shared by the CPU twin and the CUDA kernel.
#pragma once

#include <cstdint>

#include <lowbit/emu/convert.hpp>

#include "../common/dispatch.hpp"
#include "../common/element_ops.hpp"

namespace lowbit::kernels::cast_ops {

// The cast reads its inputs like every technique (common/element_ops.hpp); the names stay
// reachable here for the white-box tests that read the loads through cast_ops.
using element_ops::bf16_bits;
using element_ops::dispatch_input;
using element_ops::f16_bits;
using element_ops::load;

template <class FormatTag, class PolicyTag, class T>
LOWBIT_HD LOWBIT_INLINE std::uint32_t encode_one(FormatTag ft, PolicyTag pt, T x,
                                                 std::uint32_t rbits) {
  return detail::encode(ft, pt, element_ops::load(x), rbits);
}

} // namespace lowbit::kernels::cast_ops
