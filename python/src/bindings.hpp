// The parts of lowbit._core that live in their own translation units: each defines one
// bind_<part>(module) and core.cpp's PYBIND11_MODULE calls it.
#pragma once

#include <pybind11/pybind11.h>

namespace lowbit::python {

// lowbit._core.verify and the report classes (python/src/verify.cpp).
void bind_verify(pybind11::module_& m);
// Block-wise codebook quantization and SRAM-quantiles (python/src/blockwise.cpp).
void bind_blockwise(pybind11::module_& m);

} // namespace lowbit::python
