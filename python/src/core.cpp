// lowbit._core: the compiled half of the Python package. This file makes the module: the mapping
// of lowbit::error to Python exceptions, the build's CUDA facts, and each part's bind_<part>
// (bindings.hpp): formats and casts (formats.cpp), scaled quantization (quantize.cpp), block-wise
// quantization (blockwise.cpp), lowbit.verify (verify.cpp), over the array intake of arrays.cpp.
// The public, documented functions live in the pure-Python package (lowbit/_api.py,
// lowbit/_quantize.py, lowbit/_blockwise.py), which checks only what is Python's (argument types,
// array libraries, devices) and forwards each call here once; the C++ (these bindings and the
// kernels' host APIs) checks every argument's value, with the Python argument's name in the
// message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include <lowbit/emu/error.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"

namespace py = pybind11;

namespace lowbit::python {
namespace {

// For the tests of the DLPack import: what the module reads from an argument.
py::dict describe(py::handle obj, const std::string& name, bool writable) {
  const array_arg a = take(obj, name.c_str(), 0, {any_dtype, ""}, writable);
  py::dict d;
  d["dtype"] = kernels::dtype_name(a.type);
  d["shape"] = py::tuple(py::cast(a.shape));
  d["strides"] = py::tuple(py::cast(a.strides));
  d["device"] = kernels::device_name(a.dev);
  d["read_only"] = a.read_only;
  d["dlpack"] = static_cast<bool>(a.dl);
  d["versioned"] = a.dl.versioned();
  d["contiguous"] = a.contiguous();
  d["data"] = reinterpret_cast<std::uintptr_t>(a.data);
  return d;
}

} // namespace
} // namespace lowbit::python

PYBIND11_MODULE(_core, m) {
  namespace lp = lowbit::python;

  m.doc() = "Compiled core of lowbit: formats, casts, decodes and quantization (use the lowbit "
            "package).";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p)
        std::rethrow_exception(p);
    } catch (const lowbit::error& e) {
      switch (e.code()) {
      case lowbit::errc::invalid_type: PyErr_SetString(PyExc_TypeError, e.what()); return;
      case lowbit::errc::invalid_argument: PyErr_SetString(PyExc_ValueError, e.what()); return;
      case lowbit::errc::unsupported:
      case lowbit::errc::device: PyErr_SetString(PyExc_RuntimeError, e.what()); return;
      }
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("_describe", &lp::describe, py::arg("obj"), py::arg("name") = "x",
        py::arg("writable") = false,
        "What the module reads from an array argument (for the tests of the DLPack import and "
        "lowbit._interop.to_numpy).");
  // For the tests of the exception mapping: throws lowbit::error of the named kind.
  m.def(
      "_throw",
      [](const std::string& kind, const std::string& what) {
        using lowbit::errc;
        const errc code = kind == "invalid_type"  ? errc::invalid_type
                          : kind == "unsupported" ? errc::unsupported
                          : kind == "device"      ? errc::device
                                                  : errc::invalid_argument;
        throw lowbit::error(code, what);
      },
      py::arg("kind"), py::arg("what"));
  m.def("cuda_available", &lowbit::kernels::cuda_available,
        "True when this build has CUDA kernels and a device is present.");
  m.def("cuda_device_count", &lowbit::kernels::cuda_device_count,
        "Number of CUDA devices this process can use (0 without CUDA kernels).");
  m.def(
      "cuda_built",
      [] {
#if defined(LOWBIT_WITH_CUDA)
        return true;
#else
        return false;
#endif
      },
      "True when this build has CUDA kernels (whether or not a device is present).");
  lp::bind_formats(m);
  lp::bind_quantize(m);
  lp::bind_verify(m);
  lp::bind_blockwise(m);
  lp::bind_gemm(m);
  lp::bind_optim(m);
  lp::bind_actquant(m);
}
