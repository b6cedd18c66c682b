// Device-memory validation for host APIs (defined in the CUDA build; the CPU-only build refuses
// every CUDA view with errc::unsupported).
#pragma once

#include <initializer_list>

#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

// Throws lowbit::error naming the argument unless every view points to memory of the current
// CUDA device (a host pointer in a CUDA view would otherwise fault inside a kernel).
void require_device_memory(std::initializer_list<const tensor_view*> views,
                           std::initializer_list<const char*> names);

} // namespace lowbit::kernels
