// lowbit._core's block-wise codebook quantization and SRAM-quantiles: the host API of
// kernels/include/lowbit/kernels/blockwise.hpp over numpy arrays and DLPack tensors (the array
// intake of arrays.hpp). Codebooks travel as their 256 float32 values (a host array), validated
// by codebook::from_values on every call; the Python layer (lowbit/_blockwise.py) wraps them in
// lowbit.Codebook and allocates the results in the caller's array library.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/kernels/blockwise.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"

namespace lowbit::python {
namespace {

namespace k = kernels;

py::array_t<float> values_of(const k::codebook& cb) {
  py::array_t<float> out(k::codebook_size);
  std::copy(cb.values().begin(), cb.values().end(), out.mutable_data());
  return out;
}

// The C++ messages start with the constructor ("codebook: entry 3 is not finite"); the Python
// ones start with the argument ("v: entry 3 is not finite").
[[noreturn]] void rethrow_as(const error& e, const char* arg) {
  std::string what = e.what();
  for (const char* prefix :
       {"codebook::from_format: ", "codebook::from_quantiles: ", "codebook: "}) {
    const std::size_t len = std::strlen(prefix);
    if (what.compare(0, len, prefix) == 0) {
      what.erase(0, len);
      break;
    }
  }
  fail(e.code(), std::string(arg) + ": " + what);
}

// The float32 values of a host array (numpy or a CPU DLPack tensor), read flat.
std::vector<float> host_values(py::handle v, const char* arg) {
  const array_arg a = take(v, arg, 0, {{dtype::float32}, ""});
  if (a.dev.type != k::device_type::cpu)
    fail(errc::invalid_argument,
         std::string(arg) + ": expected host memory (the codebook is built on the CPU); copy it "
                            "to the host first (x.cpu(), cupy.asnumpy(x))");
  if (!a.contiguous())
    fail(errc::invalid_argument, std::string(arg) + ": expected a contiguous array");
  const auto* p = static_cast<const float*>(a.data);
  return std::vector<float>(p, p + a.numel());
}

k::codebook codebook_of(py::handle values, const char* arg) {
  const std::vector<float> v = host_values(values, arg);
  try {
    return k::codebook::from_values(v.data(), static_cast<std::int64_t>(v.size()));
  } catch (const error& e) {
    rethrow_as(e, arg);
  }
}

// The codebook's nearest-entry rule breaks ties toward the entry of smaller magnitude, which is
// none of the cast's tie rules; its name says so, and the cast's names mean the cast's rules
// only.
k::codebook_rounding parse_rounding(const std::string& s) {
  if (s == "nearest_toward_zero")
    return k::codebook_rounding::nearest;
  if (s == "stochastic")
    return k::codebook_rounding::stochastic;
  if (s == "nearest")
    fail(errc::invalid_argument,
         "rounding 'nearest': renamed 'nearest_toward_zero' in lowbit 0.2 (the nearest entry, "
         "ties to the entry of smaller magnitude); expected one of nearest_toward_zero, "
         "stochastic");
  fail(errc::invalid_argument,
       "rounding '" + s + "': expected one of nearest_toward_zero, stochastic");
}

// Contiguous arrays are read flat (any rank); others keep their strides and get the kernels'
// "must be contiguous" error.
k::tensor_view flat_view(const array_arg& a) {
  return view_of(a, a.contiguous());
}

// The block length is checked by the kernels; the results are allocated for any length first.
k::blockwise_config config_of(std::int64_t block, const std::string& rounding, std::uint64_t seed,
                              std::uint64_t offset) {
  k::blockwise_config cfg;
  cfg.block = block;
  cfg.rounding = parse_rounding(rounding);
  cfg.rng = emu::random_stream{seed, offset};
  return cfg;
}

py::tuple quantize_blockwise(py::handle x, py::handle codebook, std::int64_t block,
                             const std::string& rounding, std::uint64_t seed, std::uint64_t offset,
                             const py::function& empty, std::int64_t threads,
                             std::uintptr_t stream) {
  const k::codebook cb = codebook_of(codebook, "codebook");
  const k::blockwise_config cfg = config_of(block, rounding, seed, offset);
  const k::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const py::object codes = result_array(py::none(), empty, xa.shape, dtype::uint8);
  const py::object absmax =
      result_array(py::none(), empty, {ceil_div(xa.numel(), block)}, dtype::float32);
  const array_arg ca = take(codes, "codes", stream, {{dtype::uint8}, ""}, true);
  const array_arg aa = take(absmax, "absmax", stream, {{dtype::float32}, ""}, true);
  const k::tensor_view xv = flat_view(xa), cv = flat_view(ca), av = flat_view(aa);
  {
    py::gil_scoped_release no_gil;
    k::quantize_blockwise(xv, cv, av, cb, cfg, ex);
  }
  return py::make_tuple(codes, absmax);
}

// Returns (codes, absmax.codes, absmax.absmax).
py::tuple quantize_blockwise_nested(py::handle x, py::handle codebook, py::handle nested_codebook,
                                    std::int64_t block, const std::string& rounding,
                                    std::uint64_t seed, std::uint64_t offset,
                                    const py::function& empty, std::int64_t threads,
                                    std::uintptr_t stream) {
  const k::codebook cb = codebook_of(codebook, "codebook");
  const k::codebook cb2 = codebook_of(nested_codebook, "nested_codebook");
  const k::blockwise_config cfg = config_of(block, rounding, seed, offset);
  const k::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const std::int64_t blocks = ceil_div(xa.numel(), block);
  const py::object codes = result_array(py::none(), empty, xa.shape, dtype::uint8);
  const py::object codes2 = result_array(py::none(), empty, {blocks}, dtype::uint8);
  const py::object absmax2 =
      result_array(py::none(), empty, {ceil_div(blocks, k::nested_block)}, dtype::float32);
  const array_arg ca = take(codes, "codes", stream, {{dtype::uint8}, ""}, true);
  const array_arg na = take(codes2, "absmax.codes", stream, {{dtype::uint8}, ""}, true);
  const array_arg a2 = take(absmax2, "absmax.absmax", stream, {{dtype::float32}, ""}, true);
  const k::tensor_view xv = flat_view(xa), cv = flat_view(ca);
  const k::nested_absmax nested{flat_view(na), flat_view(a2), cb2};
  {
    py::gil_scoped_release no_gil;
    k::quantize_blockwise_nested(xv, cv, nested, cb, cfg, ex);
  }
  return py::make_tuple(codes, codes2, absmax2);
}

py::object dequantize_blockwise(py::handle codes, py::handle absmax, py::handle codebook,
                                std::int64_t block, py::handle out, const py::function& empty,
                                std::int64_t threads, std::uintptr_t stream) {
  const k::codebook cb = codebook_of(codebook, "codebook");
  const k::exec ex = exec_of(threads, stream);
  const array_arg ca = take(codes, "codes", stream,
                            {{dtype::uint8}, "does not hold codebook indices; expected uint8"});
  const array_arg aa = take(absmax, "absmax", stream, {{dtype::float32}, ""});
  const py::object result = result_array(out, empty, ca.shape, dtype::float32);
  const array_arg oa = take(result, "out", stream, {{dtype::float32}, ""}, true);
  require_shape(oa, ca.shape, "the shape of codes");
  const k::tensor_view cv = flat_view(ca), av = flat_view(aa), ov = flat_view(oa);
  {
    py::gil_scoped_release no_gil;
    k::dequantize_blockwise(cv, av, ov, cb, block, ex);
  }
  return result;
}

py::object dequantize_blockwise_nested(py::handle codes, py::handle absmax_codes,
                                       py::handle absmax2, py::handle codebook,
                                       py::handle nested_codebook, std::int64_t block,
                                       py::handle out, const py::function& empty,
                                       std::int64_t threads, std::uintptr_t stream) {
  const k::codebook cb = codebook_of(codebook, "codebook");
  const k::codebook cb2 = codebook_of(nested_codebook, "absmax.codebook");
  const k::exec ex = exec_of(threads, stream);
  const array_arg ca = take(codes, "codes", stream,
                            {{dtype::uint8}, "does not hold codebook indices; expected uint8"});
  const array_arg na = take(absmax_codes, "absmax.codes", stream, {{dtype::uint8}, ""});
  const array_arg a2 = take(absmax2, "absmax.absmax", stream, {{dtype::float32}, ""});
  const py::object result = result_array(out, empty, ca.shape, dtype::float32);
  const array_arg oa = take(result, "out", stream, {{dtype::float32}, ""}, true);
  require_shape(oa, ca.shape, "the shape of codes");
  const k::tensor_view cv = flat_view(ca), ov = flat_view(oa);
  const k::nested_absmax nested{flat_view(na), flat_view(a2), cb2};
  {
    py::gil_scoped_release no_gil;
    k::dequantize_blockwise_nested(cv, nested, ov, cb, block, ex);
  }
  return result;
}

// k is this binding's own parameter (the kernels read the number of quantiles off out's size).
py::object estimate_quantiles(py::handle x, std::int64_t k, py::handle out,
                              const py::function& empty, std::int64_t threads,
                              std::uintptr_t stream) {
  if (k < 1 || k > k::quantile_chunk)
    fail(errc::invalid_argument, "k: expected 1.." + std::to_string(k::quantile_chunk) +
                                     " quantiles, got " + std::to_string(k));
  const k::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const py::object result = result_array(out, empty, {k}, dtype::float32);
  const array_arg oa = take(result, "out", stream, {{dtype::float32}, ""}, true);
  require_shape(oa, {k}, "k quantiles");
  const k::tensor_view xv = flat_view(xa), ov = flat_view(oa);
  {
    py::gil_scoped_release no_gil;
    k::estimate_quantiles(xv, ov, ex);
  }
  return result;
}

} // namespace

void bind_blockwise(py::module_& m) {
  // Codebooks: 256 float32 values (numpy arrays), built or validated by kernels::codebook.
  m.def(
      "codebook_dynamic_tree",
      [](bool is_signed) { return values_of(k::codebook::dynamic_tree(is_signed)); },
      py::arg("signed"), "The dynamic tree map (docs/techniques/blockwise.md).");
  m.def(
      "codebook_linear", [](bool is_signed) { return values_of(k::codebook::linear(is_signed)); },
      py::arg("signed"), "(2k - 255) / 255 (signed) or k / 255.");
  m.def(
      "codebook_from_format",
      [](py::handle fmt) {
        const emu::format f = to_format(fmt);
        try {
          return values_of(k::codebook::from_format(f));
        } catch (const error& e) {
          rethrow_as(e, "fmt");
        }
      },
      py::arg("fmt"), "Every finite value of a format of at most 8 bits, over its maximum.");
  m.def(
      "codebook_from_quantiles",
      [](py::handle q) {
        const std::vector<float> v = host_values(q, "q");
        try {
          return values_of(
              k::codebook::from_quantiles(v.data(), static_cast<std::int64_t>(v.size())));
        } catch (const error& e) {
          rethrow_as(e, "q");
        }
      },
      py::arg("q"), "A quantile map: 1..255 finite quantiles plus 0, over their maximum.");
  m.def(
      "codebook_from_values", [](py::handle v) { return values_of(codebook_of(v, "v")); },
      py::arg("v"), "256 user values, validated (finite, in [-1, 1], ascending).");
  m.def("is_blockwise_block", &k::is_blockwise_block, py::arg("block"),
        "Whether block is one of 64, 128, ..., 4096.");
  // The array functions allocate their results with `empty(shape, dtype)` unless `out` is given.
  m.def("quantize_blockwise", &quantize_blockwise, py::arg("x"), py::arg("codebook"),
        py::arg("block"), py::arg("rounding"), py::arg("seed"), py::arg("offset"), py::arg("empty"),
        py::arg("threads"), py::arg("stream"));
  m.def("quantize_blockwise_nested", &quantize_blockwise_nested, py::arg("x"), py::arg("codebook"),
        py::arg("nested_codebook"), py::arg("block"), py::arg("rounding"), py::arg("seed"),
        py::arg("offset"), py::arg("empty"), py::arg("threads"), py::arg("stream"));
  m.def("dequantize_blockwise", &dequantize_blockwise, py::arg("codes"), py::arg("absmax"),
        py::arg("codebook"), py::arg("block"), py::arg("out"), py::arg("empty"), py::arg("threads"),
        py::arg("stream"));
  m.def("dequantize_blockwise_nested", &dequantize_blockwise_nested, py::arg("codes"),
        py::arg("absmax_codes"), py::arg("absmax2"), py::arg("codebook"),
        py::arg("nested_codebook"), py::arg("block"), py::arg("out"), py::arg("empty"),
        py::arg("threads"), py::arg("stream"));
  m.def("estimate_quantiles", &estimate_quantiles, py::arg("x"), py::arg("k"), py::arg("out"),
        py::arg("empty"), py::arg("threads"), py::arg("stream"));
}

} // namespace lowbit::python
