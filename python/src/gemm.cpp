// lowbit._core's scaled matmul: the host API of kernels/include/lowbit/kernels/gemm.hpp over
// numpy arrays and DLPack tensors. lowbit/_gemm.py gives the function its documented signature
// and turns typed codes (ml_dtypes and torch float8 arrays) into raw codes before they get here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/gemm.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"

namespace lowbit::python {
namespace {

// The kernels name an operand's parts after the C++ struct (a.codes, a.scales, a.fmt), in the
// middle of their messages too; Python has one argument for each.
const std::pair<const char*, const char*> gemm_names[] = {
    {"a.codes", "a"},
    {"b.codes", "b"},
    {"a.scales", "a_scales"},
    {"b.scales", "b_scales"},
    {"a.fmt", "a_fmt"},
    {"b.fmt", "b_fmt"},
    {"opt.backend", "backend"},
    {"opt.accumulation", "accumulation"},
    {"opt.fast_accumulation", "fast_accumulation"}};

// Built by appending pieces: GCC 12 warns falsely (-Wstringop-overflow) on std::string::replace.
[[noreturn]] void rethrow_gemm(const error& e) {
  const std::string what = e.what();
  std::string out;
  std::size_t at = 0;
  while (at < what.size()) {
    bool renamed = false;
    for (const auto& [cpp, py] : gemm_names) {
      const std::size_t len = std::strlen(cpp);
      if (what.compare(at, len, cpp) == 0) {
        out += py;
        at += len;
        renamed = true;
        break;
      }
    }
    if (!renamed)
      out += what[at++];
  }
  throw error(e.code(), out);
}

// What an operand may hold; which of these goes with which format is the kernels' to check.
const dtype_rule operand_rule{{dtype::int8, dtype::uint8, dtype::bfloat16, dtype::float16},
                              "is not supported; expected int8 (int8, int8_sym), uint8 "
                              "(e4m3fn or e5m2 codes), bfloat16 or float16"};
const dtype_rule scales_rule{{dtype::float32, dtype::uint8},
                             "is not supported; expected float32 (uint8 E8M0 codes for MX block "
                             "scales)"};
const dtype_rule result_rule{{dtype::float32, dtype::bfloat16, dtype::float16}, ""};

bool integer_name(const std::string& name) {
  return name.rfind("int", 0) == 0 || name.rfind("uint", 0) == 0;
}

// A format name, a lowbit.Format or an integer target's name; which of them an operand may
// have is the kernels' to say.
kernels::target operand_format(py::handle f, const char* arg) {
  if (py::isinstance<py::str>(f)) {
    const std::string name = f.cast<std::string>();
    try {
      if (integer_name(name))
        return kernels::target::of(emu::parse_int_format(name));
      return kernels::target::of(emu::parse_format(name));
    } catch (const error& e) {
      fail(e.code(), std::string(arg) + ": " + e.what());
    }
  }
  if (py::isinstance<emu::format>(f))
    return kernels::target::of(f.cast<emu::format>());
  fail(errc::invalid_type, std::string(arg) +
                               ": expected a format name (int8, int8_sym, e4m3fn, e5m2, "
                               "bfloat16, float16) or a lowbit.Format, got " +
                               type_name(f));
}

kernels::gemm_backend parse_backend(const std::string& s) {
  using b = kernels::gemm_backend;
  for (b k : {b::automatic, b::simt, b::cublaslt, b::cutlass, b::widened})
    if (s == kernels::gemm_backend_name(k))
      return k;
  fail(errc::invalid_argument,
       "backend '" + s + "': expected one of automatic, simt, cublaslt, cutlass, widened");
}

dtype parse_out_dtype(const std::string& s) {
  for (dtype t : result_rule.allowed)
    if (s == kernels::dtype_name(t))
      return t;
  fail(errc::invalid_argument, "out_dtype '" + s + "': expected one of float32, bfloat16, float16");
}

// The rows of an operand's matrix reading (leading dimensions collapsed; a 1-d operand is one
// row).
std::int64_t rows_of(const array_arg& a) {
  std::int64_t rows = 1;
  for (std::size_t k = 0; k + 1 < a.shape.size(); ++k)
    rows *= a.shape[k];
  return rows;
}

// No scales: an empty view on the codes' device (the kernels read it as every scale 1).
kernels::tensor_view no_scales(const array_arg& codes) {
  kernels::tensor_view v;
  v.type = dtype::float32;
  v.ndim = 1;
  v.dev = codes.dev;
  return v;
}

// lowbit.Accumulation's fields as lowbit/_gemm.py passes them: (kind, block, fraction_bits,
// align_with_register, terms, register, promote_every, register_bits, exponent), kind 0
// fp32_sequential, 1 exact, 2 block_fixed_point; terms, register and exponent in emu's enum
// order. The ranges are the kernels' to check (emu::is_valid), with the message naming
// opt.accumulation.
emu::accumulation accumulation_of(const std::vector<std::int64_t>& f) {
  if (f.size() != 9)
    fail(errc::invalid_argument, "accumulation: expected 9 fields");
  const auto small = [](std::int64_t v) {
    return static_cast<int>(v < -1000000 ? -1000000 : (v > 1000000 ? 1000000 : v));
  };
  emu::accumulation m;
  m.kind = static_cast<emu::accumulation_kind>(f[0] < 0 || f[0] > 2 ? 255 : f[0]);
  m.block = small(f[1]);
  m.fraction_bits = small(f[2]);
  m.align_with_register = f[3] != 0;
  m.terms = static_cast<emu::term_rounding>(f[4] < 0 || f[4] > 1 ? 255 : f[4]);
  m.reg = static_cast<emu::register_rounding>(f[5] < 0 || f[5] > 1 ? 255 : f[5]);
  m.promote_every = small(f[6]);
  m.register_bits = small(f[7]);
  m.exponent = static_cast<emu::product_exponent>(f[8] < 0 || f[8] > 2 ? 255 : f[8]);
  return m;
}

py::object scaled_matmul(py::handle a, py::handle b, py::handle a_fmt, py::handle b_fmt,
                         py::handle a_scales, py::handle b_scales, py::handle bias,
                         const std::optional<std::string>& out_dtype, py::handle out,
                         const std::string& backend, const py::function& empty,
                         std::int64_t threads, std::uintptr_t stream,
                         const std::optional<std::vector<std::int64_t>>& accumulation,
                         const std::pair<std::int64_t, std::int64_t>& a_block,
                         const std::pair<std::int64_t, std::int64_t>& b_block,
                         bool fast_accumulation) {
  kernels::gemm_operand ga, gb;
  ga.fmt = operand_format(a_fmt, "a_fmt");
  gb.fmt = operand_format(b_fmt, "b_fmt");
  ga.block_rows = a_block.first;
  ga.block_k = a_block.second;
  gb.block_rows = b_block.first;
  gb.block_k = b_block.second;
  kernels::gemm_options opt;
  opt.backend = parse_backend(backend);
  if (accumulation)
    opt.accumulation = accumulation_of(*accumulation);
  opt.fast_accumulation = fast_accumulation;
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg aa = take(a, "a", stream, operand_rule);
  const array_arg ba = take(b, "b", stream, operand_rule);
  if (ba.shape.size() != 2)
    fail(errc::invalid_argument, "b: expected a 2-d (N, K) operand, got " +
                                     std::to_string(ba.shape.size()) + " dimensions");
  std::optional<array_arg> sa, sb, bv;
  if (!a_scales.is_none())
    sa = take(a_scales, "a_scales", stream, scales_rule);
  if (!b_scales.is_none())
    sb = take(b_scales, "b_scales", stream, scales_rule);
  if (!bias.is_none())
    bv = take(bias, "bias", stream, result_rule);

  std::vector<std::int64_t> shape(aa.shape.begin(),
                                  aa.shape.empty() ? aa.shape.end() : aa.shape.end() - 1);
  shape.push_back(rows_of(ba));
  std::optional<dtype> want;
  if (out_dtype)
    want = parse_out_dtype(*out_dtype);
  const py::object result = result_array(out, empty, shape, want.value_or(dtype::float32));
  const array_arg oa = take(result, "out", stream, result_rule, true);
  if (!out.is_none()) {
    require_shape(oa, shape, "a's leading dimensions and b's rows");
    if (want && oa.type != *want)
      fail(errc::invalid_type, std::string("out: dtype ") + kernels::dtype_name(oa.type) +
                                   " but out_dtype is " + kernels::dtype_name(*want));
  }

  ga.codes = view_of(aa);
  gb.codes = view_of(ba);
  ga.scales = sa ? view_of(*sa, sa->contiguous()) : no_scales(aa);
  gb.scales = sb ? view_of(*sb, sb->contiguous()) : no_scales(ba);
  kernels::tensor_view biasv = no_scales(aa);
  if (bv)
    biasv = view_of(*bv, bv->contiguous());
  const kernels::tensor_view ov = view_of(oa);
  try {
    py::gil_scoped_release no_gil;
    kernels::scaled_matmul(ga, gb, biasv, ov, opt, ex);
  } catch (const error& e) {
    rethrow_gemm(e);
  }
  return result;
}

} // namespace

void bind_gemm(py::module_& m) {
  // The result is allocated with `empty(shape, dtype)` (the Python layer's allocator in the
  // caller's array library) unless `out` is given; `stream` is the caller's current CUDA
  // stream (0: the default stream; ignored for CPU arrays).
  m.def("scaled_matmul", &scaled_matmul, py::arg("a"), py::arg("b"), py::arg("a_fmt"),
        py::arg("b_fmt"), py::arg("a_scales"), py::arg("b_scales"), py::arg("bias"),
        py::arg("out_dtype"), py::arg("out"), py::arg("backend"), py::arg("empty"),
        py::arg("threads"), py::arg("stream"), py::arg("accumulation") = py::none(),
        py::arg("a_block") = std::pair<std::int64_t, std::int64_t>{0, 0},
        py::arg("b_block") = std::pair<std::int64_t, std::int64_t>{0, 0},
        py::arg("fast_accumulation") = false);
}

} // namespace lowbit::python
