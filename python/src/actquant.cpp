// lowbit._core's activation quantization (Mesa): kernels/include/lowbit/kernels/actquant.hpp
// over raw data pointers of contiguous tensors the caller owns (lowbit/_torch_ops.py, the torch
// layer of lowbit.nn.mesa, allocates them; no DLPack exchange per call, which for the dozens of
// saved activations of a training step would add up). The host API checks every value.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/kernels/actquant.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"

namespace lowbit::python {
namespace {

namespace k = kernels;

dtype float_dtype(int code, const char* what) {
  switch (code) {
  case 0: return dtype::float32;
  case 1: return dtype::bfloat16;
  case 2: return dtype::float16;
  default:
    fail(errc::invalid_argument, std::string(what) + ": dtype code " + std::to_string(code) +
                                     " (expected 0 float32, 1 bfloat16, 2 float16)");
  }
}

k::device device_of(int type, int index) {
  if (type != 0 && type != 1)
    fail(errc::invalid_argument, "device_type: expected 0 (cpu) or 1 (cuda)");
  return k::device{type == 1 ? k::device_type::cuda : k::device_type::cpu, index};
}

k::tensor_view raw_view(std::uintptr_t ptr, dtype t, const std::vector<std::int64_t>& shape,
                        k::device dev) {
  require(shape.size() <= static_cast<std::size_t>(k::max_dims), errc::invalid_argument,
          "shape: at most 8 dimensions");
  k::tensor_view v;
  v.data = reinterpret_cast<void*>(ptr);
  v.type = t;
  v.ndim = static_cast<int>(shape.size());
  v.dev = dev;
  std::int64_t s = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[d] = shape[static_cast<std::size_t>(d)];
    v.strides[d] = s;
    s *= v.shape[d] > 0 ? v.shape[d] : 1;
  }
  return v;
}

emu::policy rounding_of(const std::string& rounding, int random_bits) {
  if (rounding == "nearest_even")
    return emu::rne_sat;
  if (rounding == "stochastic")
    return emu::stochastic(random_bits, emu::overflow::saturate);
  fail(errc::invalid_argument,
       "rounding '" + rounding + "': expected one of nearest_even, stochastic");
}

void quantize_raw(std::uintptr_t x, int x_dtype, const std::vector<std::int64_t>& shape, int dim,
                  std::int64_t group_size, std::uintptr_t codes, std::uintptr_t alpha,
                  std::uintptr_t beta, bool quantize, bool update, bool lagged, float momentum,
                  const std::string& rounding, int random_bits, std::uint64_t seed,
                  std::uint64_t offset, int device_type, int device_index, std::int64_t threads,
                  std::uintptr_t stream) {
  const k::device dev = device_of(device_type, device_index);
  const k::actquant_groups g{dim, group_size};
  const k::tensor_view xv = raw_view(x, float_dtype(x_dtype, "x"), shape, dev);
  const std::int64_t groups = k::actquant_group_count(xv, g);
  const k::tensor_view av = raw_view(alpha, dtype::float32, {groups}, dev);
  const k::tensor_view bv = raw_view(beta, dtype::float32, {groups}, dev);
  const k::exec ex = exec_of(threads, stream);
  if (!quantize) {
    py::gil_scoped_release no_gil;
    k::actquant_update(xv, av, bv, g, momentum, ex);
    return;
  }
  const emu::policy pol = rounding_of(rounding, random_bits);
  const k::tensor_view cv = raw_view(codes, dtype::uint8, shape, dev);
  py::gil_scoped_release no_gil;
  if (lagged)
    k::actquant_quantize_lagged(xv, cv, av, bv, g, pol, emu::random_stream{seed, offset}, momentum,
                                ex);
  else
    k::actquant_quantize(xv, cv, av, bv, g, pol, emu::random_stream{seed, offset}, update, momentum,
                         ex);
}

void dequantize_raw(std::uintptr_t codes, const std::vector<std::int64_t>& shape, int dim,
                    std::int64_t group_size, std::uintptr_t alpha, std::uintptr_t beta,
                    std::uintptr_t out, int out_dtype, int device_type, int device_index,
                    std::int64_t threads, std::uintptr_t stream) {
  const k::device dev = device_of(device_type, device_index);
  const k::actquant_groups g{dim, group_size};
  const k::tensor_view cv = raw_view(codes, dtype::uint8, shape, dev);
  const std::int64_t groups = k::actquant_group_count(cv, g);
  const k::tensor_view av = raw_view(alpha, dtype::float32, {groups}, dev);
  const k::tensor_view bv = raw_view(beta, dtype::float32, {groups}, dev);
  const k::tensor_view ov = raw_view(out, float_dtype(out_dtype, "out"), shape, dev);
  const k::exec ex = exec_of(threads, stream);
  py::gil_scoped_release no_gil;
  k::actquant_dequantize(cv, av, bv, ov, g, ex);
}

// The optional outputs and the weight: pointer 0 means absent.
k::tensor_view optional_vector(std::uintptr_t ptr, std::int64_t n, k::device dev) {
  return ptr == 0 ? k::tensor_view{} : raw_view(ptr, dtype::float32, {n}, dev);
}

void layer_norm_backward_raw(std::uintptr_t codes, const std::vector<std::int64_t>& shape,
                             std::int64_t group_size, std::uintptr_t alpha, std::uintptr_t beta,
                             std::uintptr_t gy, int dtype_code, std::uintptr_t weight, float eps,
                             std::uintptr_t gx, std::uintptr_t gw, std::uintptr_t gb,
                             int device_type, int device_index, std::int64_t threads,
                             std::uintptr_t stream) {
  const k::device dev = device_of(device_type, device_index);
  const k::tensor_view cv = raw_view(codes, dtype::uint8, shape, dev);
  const std::int64_t groups = k::actquant_group_count(cv, k::actquant_groups{-1, group_size});
  const std::int64_t cols = shape.empty() ? 0 : shape.back();
  const dtype t = float_dtype(dtype_code, "gy");
  const k::tensor_view av = raw_view(alpha, dtype::float32, {groups}, dev);
  const k::tensor_view bv = raw_view(beta, dtype::float32, {groups}, dev);
  const k::tensor_view gyv = raw_view(gy, t, shape, dev);
  const k::tensor_view gxv = gx == 0 ? k::tensor_view{} : raw_view(gx, t, shape, dev);
  const k::tensor_view wv = optional_vector(weight, cols, dev);
  const k::tensor_view gwv = optional_vector(gw, cols, dev);
  const k::tensor_view gbv = optional_vector(gb, cols, dev);
  const k::exec ex = exec_of(threads, stream);
  py::gil_scoped_release no_gil;
  k::actquant_layer_norm_backward(cv, av, bv, group_size, gyv, wv, eps, gxv, gwv, gbv, ex);
}

void activation_backward_raw(std::uintptr_t codes, const std::vector<std::int64_t>& shape, int dim,
                             std::int64_t group_size, std::uintptr_t alpha, std::uintptr_t beta,
                             const std::string& activation, std::uintptr_t dy, int dtype_code,
                             std::uintptr_t gx, std::uintptr_t value, int device_type,
                             int device_index, std::int64_t threads, std::uintptr_t stream) {
  const k::device dev = device_of(device_type, device_index);
  const k::actquant_groups g{dim, group_size};
  k::actquant_activation f{};
  if (activation == "gelu")
    f = k::actquant_activation::gelu;
  else if (activation == "gelu_tanh")
    f = k::actquant_activation::gelu_tanh;
  else if (activation == "silu")
    f = k::actquant_activation::silu;
  else if (activation == "relu")
    f = k::actquant_activation::relu;
  else
    fail(errc::invalid_argument,
         "activation '" + activation + "': expected one of gelu, gelu_tanh, silu, relu");
  const k::tensor_view cv = raw_view(codes, dtype::uint8, shape, dev);
  const std::int64_t groups = k::actquant_group_count(cv, g);
  const dtype t = float_dtype(dtype_code, "dy");
  const k::tensor_view av = raw_view(alpha, dtype::float32, {groups}, dev);
  const k::tensor_view bv = raw_view(beta, dtype::float32, {groups}, dev);
  const k::tensor_view dyv = raw_view(dy, t, shape, dev);
  const k::tensor_view gxv = raw_view(gx, t, shape, dev);
  const k::tensor_view vv = value == 0 ? k::tensor_view{} : raw_view(value, t, shape, dev);
  const k::exec ex = exec_of(threads, stream);
  py::gil_scoped_release no_gil;
  k::actquant_activation_backward(cv, av, bv, g, f, dyv, gxv, vv, ex);
}

} // namespace

void bind_actquant(py::module_& m) {
  m.def(
      "actquant_quantize_raw", &quantize_raw, py::arg("x"), py::arg("x_dtype"), py::arg("shape"),
      py::arg("dim"), py::arg("group_size"), py::arg("codes"), py::arg("alpha"), py::arg("beta"),
      py::arg("quantize"), py::arg("update"), py::arg("lagged"), py::arg("momentum"),
      py::arg("rounding"), py::arg("random_bits"), py::arg("seed"), py::arg("offset"),
      py::arg("device_type"), py::arg("device_index"), py::arg("threads"), py::arg("stream"),
      "Per-group 8-bit activation quantization over raw pointers of contiguous tensors "
      "(kernels/include/lowbit/kernels/actquant.hpp): codes (uint8) from x (dtype code 0 "
      "float32, 1 bfloat16, 2 float16), alpha and beta (float32, one per group) updated in "
      "place when `update` (before quantizing; after it, from the same read of x, when `lagged`); "
      "quantize=False updates the estimates only.");
  m.def("actquant_dequantize_raw", &dequantize_raw, py::arg("codes"), py::arg("shape"),
        py::arg("dim"), py::arg("group_size"), py::arg("alpha"), py::arg("beta"), py::arg("out"),
        py::arg("out_dtype"), py::arg("device_type"), py::arg("device_index"), py::arg("threads"),
        py::arg("stream"),
        "out = codes * alpha[g] + beta[g] over raw pointers of contiguous tensors (out dtype "
        "code 0 float32, 1 bfloat16, 2 float16).");
  m.def("actquant_layer_norm_backward_raw", &layer_norm_backward_raw, py::arg("codes"),
        py::arg("shape"), py::arg("group_size"), py::arg("alpha"), py::arg("beta"), py::arg("gy"),
        py::arg("dtype"), py::arg("weight"), py::arg("eps"), py::arg("gx"), py::arg("gw"),
        py::arg("gb"), py::arg("device_type"), py::arg("device_index"), py::arg("threads"),
        py::arg("stream"),
        "LayerNorm's backward over the last dimension from its input's codes "
        "(kernels/include/lowbit/kernels/actquant.hpp, actquant_layer_norm_backward) over raw "
        "pointers of contiguous tensors: gy and gx of dtype code 0 float32, 1 bfloat16, "
        "2 float16; weight, gw and gb float32 [C]; a pointer 0 is an absent weight or output.");
  m.def("actquant_activation_backward_raw", &activation_backward_raw, py::arg("codes"),
        py::arg("shape"), py::arg("dim"), py::arg("group_size"), py::arg("alpha"), py::arg("beta"),
        py::arg("activation"), py::arg("dy"), py::arg("dtype"), py::arg("gx"), py::arg("value"),
        py::arg("device_type"), py::arg("device_index"), py::arg("threads"), py::arg("stream"),
        "An activation's backward from its input's codes (actquant_activation_backward): gx = "
        "dy f'(x) and, where value is not 0, value = f(x), x the dequantized input; dy, gx and "
        "value of dtype code 0 float32, 1 bfloat16, 2 float16; activation gelu, gelu_tanh, "
        "silu or relu.");
}

} // namespace lowbit::python
