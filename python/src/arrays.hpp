// The array intake of lowbit._core, shared by its translation units (arrays.cpp defines it):
// numpy arrays (buffer protocol, ml_dtypes' bfloat16 included) and DLPack producers (torch,
// cupy, jax, ...) resolved into views for the kernels, without copies, with the argument's name
// in every error.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "dlpack.hpp"

namespace lowbit::python {

namespace py = pybind11;
using kernels::dtype;
using dtypes = std::vector<dtype>;

extern const dtypes real_dtypes;  // float32, float64, float16, bfloat16
extern const dtypes quant_inputs; // float32, float16, bfloat16
extern const dtypes any_dtype;    // every dtype the kernels know

// Throws lowbit::error (mapped to TypeError, ValueError or RuntimeError by the module).
[[noreturn]] void fail(errc code, const std::string& what);
std::string type_name(py::handle h);
std::string str_of(py::handle h);
// "float32, float16 or bfloat16"
std::string dtype_list(const dtypes& allowed);
// A format name or a lowbit.Format (errors name the argument `fmt`).
emu::format to_format(py::handle fmt);

// An array argument, resolved: where its elements are and what keeps them alive until the call
// returns (the numpy array, or the producer and the DLPack tensor taken from it).
struct array_arg {
  const char* name = "";
  py::object owner;
  dlpack::owned_tensor dl;
  void* data = nullptr;
  dtype type = dtype::float32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides; // in elements; 0 where the extent is 0 or 1
  kernels::device dev{};
  bool read_only = false;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto e : shape)
      n *= e;
    return n;
  }
  bool contiguous() const {
    if (numel() == 0)
      return true;
    std::int64_t expect = 1;
    for (std::size_t k = shape.size(); k-- > 0;) {
      if (shape[k] != 1 && strides[k] != expect)
        return false;
      expect *= shape[k];
    }
    return true;
  }
};

// Everything a call needs to know about its arguments' dtypes: the allowed ones, and the text
// after "<name>: dtype <dt> " when the dtype is not one of them.
struct dtype_rule {
  dtypes allowed;      // empty: any dtype the kernels know
  std::string refusal; // empty: "is not supported; expected <allowed>"
  std::string message(const char* name, const std::string& have) const {
    return std::string(name) + ": dtype " + have + " " +
           (refusal.empty() ? "is not supported; expected " + dtype_list(allowed) : refusal);
  }
  void check(const char* name, std::optional<dtype> t, const std::string& have) const {
    if (!t)
      fail(errc::invalid_type, message(name, have));
    if (allowed.size() == 0)
      return;
    for (dtype a : allowed)
      if (*t == a)
        return;
    fail(errc::invalid_type, message(name, have));
  }
};

// Resolves a numpy array or a DLPack producer; `writable` refuses read-only memory. CUDA
// producers are told `stream`.
array_arg take(py::handle obj, const char* name, std::uintptr_t stream, const dtype_rule& rule,
               bool writable = false);
// The kernels' view of an argument; `flat` reads a contiguous array as one dimension.
kernels::tensor_view view_of(const array_arg& a, bool flat = false);
// ValueError naming the argument unless its shape is `shape` (`of` says what that shape is).
void require_shape(const array_arg& a, const std::vector<std::int64_t>& shape, const char* of);
int check_threads(std::int64_t threads);
kernels::exec exec_of(std::int64_t threads, std::uintptr_t stream);

// A result array: `out` where the caller gave one (its dtype and shape are checked where it is
// taken and by the kernels), else `empty(shape, dtype name)`, the Python layer's allocator in the
// caller's array library. Allocating here keeps each call one trip into the module: the shapes
// and code dtypes are the C++'s to know.
py::object result_array(py::handle out, const py::function& empty,
                        const std::vector<std::int64_t>& shape, dtype type);
// ceil(n / k) for n >= 0 without overflow; k < 1 counts as 1 (the kernels refuse it after the
// results are allocated).
std::int64_t ceil_div(std::int64_t n, std::int64_t k);

// The kernels' messages start with their C++ parameter names ("target: ...", "grouping: ...");
// a binding whose Python parameter is called differently rethrows them with the Python name.
struct rename {
  const char* cpp; // "target"
  const char* py;  // "fmt"
};
[[noreturn]] void rethrow_renamed(const error& e, std::initializer_list<rename> renames);

} // namespace lowbit::python
