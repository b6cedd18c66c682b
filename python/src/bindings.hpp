// The parts of lowbit._core, one translation unit per technique: each defines one
// bind_<part>(module) and core.cpp's PYBIND11_MODULE calls it.
#pragma once

#include <pybind11/pybind11.h>

namespace lowbit::python {

// lowbit.Format, format names, cast and decode (python/src/formats.cpp).
void bind_formats(pybind11::module_& m);
// Scaled quantization: per tensor/row/column/block/tile, delayed, OCP MX (python/src/quantize.cpp).
void bind_quantize(pybind11::module_& m);
// lowbit._core.verify and the report classes (python/src/verify.cpp).
void bind_verify(pybind11::module_& m);
// Block-wise codebook quantization and SRAM-quantiles (python/src/blockwise.cpp).
void bind_blockwise(pybind11::module_& m);

// The scaled matmul of the GEMM layer (gemm.cpp).
void bind_gemm(pybind11::module_& m);

// The optimizer steps (optim.cpp).
void bind_optim(pybind11::module_& m);

// Per-group activation quantization with running estimates (actquant.cpp).
void bind_actquant(pybind11::module_& m);

} // namespace lowbit::python
