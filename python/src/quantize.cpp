// lowbit._core's scaled quantization: the host API of kernels/include/lowbit/kernels/quantize.hpp
// (per tensor, row, column, block and tile; delayed scaling; OCP MX) over numpy arrays and DLPack
// tensors. lowbit/_quantize.py gives the functions their documented signatures.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/quantize.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"
#include "policy.hpp"

namespace lowbit::python {
namespace {

// The kernels name the target `target` (`elem` in MX) and the grouping `grouping`; Python calls
// them `fmt` and `granularity`.
constexpr std::initializer_list<rename> quant_names = {{"target", "fmt"},
                                                       {"elem", "fmt"},
                                                       {"grouping", "granularity"},
                                                       {"quantize_mx", "fmt"},
                                                       {"dequantize_mx", "fmt"}};

bool integer_name(const std::string& name) {
  return name.rfind("int", 0) == 0 || name.rfind("uint", 0) == 0;
}

// A target: a float format (name or Format) or an integer target by name.
kernels::target to_target(py::handle t) {
  if (py::isinstance<py::str>(t)) {
    const std::string name = t.cast<std::string>();
    try {
      if (integer_name(name))
        return kernels::target::of(emu::parse_int_format(name));
      return kernels::target::of(emu::parse_format(name));
    } catch (const error& e) {
      fail(e.code(), std::string("fmt: ") + e.what() +
                         (integer_name(name) ? ""
                                             : " (or an integer target: int8, int8_sym, uint8, "
                                               "int4, int4_sym, uint4)"));
    }
  }
  if (py::isinstance<emu::format>(t))
    return kernels::target::of(t.cast<emu::format>());
  fail(errc::invalid_type, "fmt: expected a format name, a lowbit.Format or an integer target "
                           "name (int8, int8_sym, uint8, int4, int4_sym, uint4), got " +
                               type_name(t));
}

std::string target_name(const kernels::target& t) {
  return t.is_int ? emu::int_format_name(t.ifmt) : emu::format_name(t.fmt);
}

// (name, code dtype, largest finite value, is an integer) of a target. Targets that no
// quantization function accepts are refused with the kernels' reasons.
py::tuple target_info(py::handle t) {
  const kernels::target tg = to_target(t);
  if (tg.is_int) {
    if (const char* why = emu::check_int_format(tg.ifmt))
      fail(errc::invalid_argument, std::string("fmt: ") + why);
  } else if (!tg.fmt.fits_float() || tg.fmt.bits() > 16) {
    fail(errc::invalid_argument,
         "fmt: format " + emu::format_name(tg.fmt) +
             " cannot be a quantization target (its values must fit float32 and its codes 16 "
             "bits)");
  }
  return py::make_tuple(target_name(tg), kernels::dtype_name(tg.code_dtype()), tg.max_value(),
                        tg.is_int);
}

// The sizes are checked by the kernels (kernels::quantize refuses blocks and tiles < 1).
kernels::grouping make_grouping(const std::string& kind, std::int64_t rows, std::int64_t cols) {
  using g = kernels::grouping;
  if (kind == "tensor")
    return g::per_tensor();
  if (kind == "rows")
    return g::per_row();
  if (kind == "columns")
    return g::per_column();
  if (kind == "blocks")
    return g::blocks(cols);
  if (kind == "tiles")
    return g::tiles(rows, cols);
  fail(errc::invalid_argument, "granularity '" + kind +
                                   "': expected tensor, rows, columns, ('blocks', k) or "
                                   "('tiles', r, c)");
}

// The kernels refuse margins outside -126..126; larger integers are clamped to a refused value
// so that they reach that check instead of overflowing int.
kernels::scaling make_scaling(std::int64_t margin, bool pow2) {
  const std::int64_t m = margin < -1000 ? -1000 : margin > 1000 ? 1000 : margin;
  return kernels::scaling{static_cast<int>(m), pow2};
}

// The matrix reading of a shape: the leading dimensions are the rows (a 0-d array is 1 x 1).
struct matrix_dims {
  std::vector<std::int64_t> lead;
  std::int64_t rows = 1, cols = 1;
};
matrix_dims dims_of(const std::vector<std::int64_t>& shape) {
  matrix_dims d;
  if (shape.empty())
    return d;
  d.lead.assign(shape.begin(), shape.end() - 1);
  for (std::int64_t e : d.lead)
    d.rows *= e;
  d.cols = shape.back();
  return d;
}

std::vector<std::int64_t> with_last(std::vector<std::int64_t> lead, std::int64_t last) {
  lead.push_back(last);
  return lead;
}

std::vector<std::int64_t> scale_shape(const kernels::grouping& g, const matrix_dims& d) {
  using kind = kernels::grouping::kind;
  switch (g.k) {
  case kind::tensor: return {};
  case kind::rows: return with_last(d.lead, 1);
  case kind::columns: return {d.cols};
  case kind::blocks: return with_last(d.lead, ceil_div(d.cols, g.tile_cols));
  case kind::tiles: return {ceil_div(d.rows, g.tile_rows), ceil_div(d.cols, g.tile_cols)};
  }
  return {};
}

py::tuple quantize(py::handle x, py::handle fmt, const std::string& kind, std::int64_t rows,
                   std::int64_t cols, std::int64_t margin, bool pow2, bool transpose,
                   const rounding_args& r, const py::function& empty, std::int64_t threads,
                   std::uintptr_t stream) {
  const kernels::target t = to_target(fmt);
  const kernels::grouping g = make_grouping(kind, rows, cols);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const matrix_dims d = dims_of(xa.shape);
  // Transposed codes are allocated for any granularity; the kernels refuse the wrong ones.
  const py::object codes = result_array(
      py::none(), empty, transpose ? std::vector<std::int64_t>{d.cols, d.rows} : xa.shape,
      t.code_dtype());
  const py::object scales = result_array(
      py::none(), empty, transpose ? std::vector<std::int64_t>{d.cols, 1} : scale_shape(g, d),
      dtype::float32);
  const array_arg ca = take(codes, "codes", stream, {{t.code_dtype()}, ""}, true);
  const array_arg sa = take(scales, "scales", stream, {{dtype::float32}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), cv = view_of(ca), sv = view_of(sa);
  try {
    py::gil_scoped_release no_gil;
    kernels::quantize(xv, cv, sv, t, g, pol, make_scaling(margin, pow2), r.rng(), transpose, ex);
  } catch (const error& e) {
    rethrow_renamed(e, quant_names);
  }
  return py::make_tuple(codes, scales);
}

py::object cast_scaled(py::handle x, py::handle scale, py::handle fmt, const rounding_args& r,
                       py::handle out, const py::function& empty, std::int64_t threads,
                       std::uintptr_t stream) {
  const kernels::target t = to_target(fmt);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const array_arg qa = take(scale, "scale", stream, {{dtype::float32}, ""});
  // A multiplier that is not a positive finite number makes every code NaN, zero or
  // sign-flipped: refused where it can be read without synchronizing a device.
  if (qa.dev.type == kernels::device_type::cpu && qa.numel() == 1) {
    const float q = *static_cast<const float*>(qa.data);
    if (!(std::isfinite(q) && q > 0.0f))
      fail(errc::invalid_argument,
           "scale: expected a positive finite multiplier, got " + std::to_string(q));
  }
  const py::object codes = result_array(out, empty, xa.shape, t.code_dtype());
  const array_arg ca =
      take(codes, out.is_none() ? "codes" : "out", stream, {{t.code_dtype()}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), qv = view_of(qa), cv = view_of(ca);
  try {
    py::gil_scoped_release no_gil;
    kernels::cast_scaled(xv, cv, qv, t, pol, r.rng(), ex);
  } catch (const error& e) {
    rethrow_renamed(e, {{"target", "fmt"}, {"codes", out.is_none() ? "codes" : "out"}});
  }
  return codes;
}

std::string codes_refusal(const kernels::target& t) {
  return "does not hold codes of " + target_name(t) + "; expected " +
         kernels::dtype_name(t.code_dtype());
}

// Dequantization takes codes of any dtype the kernels know, so that the kernels refuse a wrong
// fmt before they look at the codes; their refusal of the codes' dtype is said in fmt's terms.
[[noreturn]] void rethrow_dequantize(const error& e, const array_arg& codes,
                                     const kernels::target& t) {
  const std::string what = e.what();
  if (e.code() == errc::invalid_type && what.rfind("codes: dtype ", 0) == 0)
    fail(errc::invalid_type,
         std::string("codes: dtype ") + kernels::dtype_name(codes.type) + " " + codes_refusal(t));
  rethrow_renamed(e, quant_names);
}

// What both dequantizations share: codes of fmt and scales taken, float32 values the shape of
// the codes allocated (or out checked), the kernel run without the GIL, its refusals in
// Python's terms.
template <class Run>
py::object dequantize_with(py::handle codes, py::handle scales, const dtype_rule& scales_rule,
                           const kernels::target& t, py::handle out, const py::function& empty,
                           std::uintptr_t stream, Run&& run) {
  const array_arg ca = take(codes, "codes", stream, {any_dtype, codes_refusal(t)});
  const array_arg sa = take(scales, "scales", stream, scales_rule);
  const py::object result = result_array(out, empty, ca.shape, dtype::float32);
  const array_arg oa = take(result, "out", stream, {{dtype::float32}, ""}, true);
  require_shape(oa, ca.shape, "the shape of codes");
  const kernels::tensor_view cv = view_of(ca), sv = view_of(sa), ov = view_of(oa);
  try {
    py::gil_scoped_release no_gil;
    run(cv, sv, ov);
  } catch (const error& e) {
    rethrow_dequantize(e, ca, t);
  }
  return result;
}

py::object dequantize(py::handle codes, py::handle scales, py::handle fmt, const std::string& kind,
                      std::int64_t rows, std::int64_t cols, py::handle out,
                      const py::function& empty, std::int64_t threads, std::uintptr_t stream) {
  const kernels::target t = to_target(fmt);
  const kernels::grouping g = make_grouping(kind, rows, cols);
  const kernels::exec ex = exec_of(threads, stream);
  return dequantize_with(codes, scales, {{dtype::float32}, ""}, t, out, empty, stream,
                         [&](const auto& cv, const auto& sv, const auto& ov) {
                           kernels::dequantize(cv, sv, ov, t, g, ex);
                         });
}

kernels::history_reduce parse_reduce(const std::string& s) {
  if (s == "max")
    return kernels::history_reduce::max;
  if (s == "most_recent")
    return kernels::history_reduce::most_recent;
  fail(errc::invalid_argument, "reduce '" + s + "': expected one of max, most_recent");
}

py::tuple quantize_delayed(py::handle x, py::handle history, py::handle fmt,
                           const std::string& reduce, std::int64_t margin, bool pow2,
                           const rounding_args& r, const py::function& empty, std::int64_t threads,
                           std::uintptr_t stream) {
  const kernels::target t = to_target(fmt);
  const kernels::history_reduce red = parse_reduce(reduce);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const array_arg ha = take(history, "history", stream, {{dtype::float32}, ""}, true);
  const py::object codes = result_array(py::none(), empty, xa.shape, t.code_dtype());
  const py::object pair = result_array(py::none(), empty, {2}, dtype::float32);
  const array_arg ca = take(codes, "codes", stream, {{t.code_dtype()}, ""}, true);
  const array_arg pa = take(pair, "scale_pair", stream, {{dtype::float32}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), hv = view_of(ha), cv = view_of(ca), pv = view_of(pa);
  try {
    py::gil_scoped_release no_gil;
    kernels::quantize_delayed(xv, cv, pv, hv, t, red, pol, make_scaling(margin, pow2), r.rng(), ex);
  } catch (const error& e) {
    rethrow_renamed(e, quant_names);
  }
  return py::make_tuple(codes, pair);
}

py::tuple quantize_mx(py::handle x, py::handle fmt, std::int64_t block, const rounding_args& r,
                      const py::function& empty, std::int64_t threads, std::uintptr_t stream) {
  const kernels::target t = to_target(fmt);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const matrix_dims d = dims_of(xa.shape);
  const py::object codes = result_array(py::none(), empty, xa.shape, t.code_dtype());
  const py::object scales =
      result_array(py::none(), empty, with_last(d.lead, ceil_div(d.cols, block)), dtype::uint8);
  const array_arg ca = take(codes, "codes", stream, {{t.code_dtype()}, ""}, true);
  const array_arg sa = take(scales, "scales", stream, {{dtype::uint8}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), cv = view_of(ca), sv = view_of(sa);
  try {
    py::gil_scoped_release no_gil;
    kernels::quantize_mx(xv, cv, sv, t, pol, block, r.rng(), ex);
  } catch (const error& e) {
    rethrow_renamed(e, quant_names);
  }
  return py::make_tuple(codes, scales);
}

py::object dequantize_mx(py::handle codes, py::handle scales, py::handle fmt, std::int64_t block,
                         py::handle out, const py::function& empty, std::int64_t threads,
                         std::uintptr_t stream) {
  const kernels::target t = to_target(fmt);
  const kernels::exec ex = exec_of(threads, stream);
  return dequantize_with(codes, scales,
                         {{dtype::uint8}, "does not hold E8M0 scale codes; expected uint8"}, t, out,
                         empty, stream, [&](const auto& cv, const auto& sv, const auto& ov) {
                           kernels::dequantize_mx(cv, sv, ov, t, block, ex);
                         });
}

} // namespace

void bind_quantize(py::module_& m) {
  // Each function allocates its results with `empty(shape, dtype)` (the Python layer's allocator
  // in the caller's array library) unless `out` is given; `stream` is the caller's current CUDA
  // stream (0: the default stream; ignored for CPU arrays).
  m.def("target_info", &target_info, py::arg("fmt"),
        "(name, code dtype, max, is_int) of a quantization target.");
  m.def("quantize", &quantize, py::arg("x"), py::arg("fmt"), py::arg("kind"), py::arg("tile_rows"),
        py::arg("tile_cols"), py::arg("margin"), py::arg("pow2"), py::arg("transpose"),
        py::arg("rounding"), py::arg("empty"), py::arg("threads"), py::arg("stream"));
  m.def("cast_scaled", &cast_scaled, py::arg("x"), py::arg("scale"), py::arg("fmt"),
        py::arg("rounding"), py::arg("out"), py::arg("empty"), py::arg("threads"),
        py::arg("stream"));
  m.def("dequantize", &dequantize, py::arg("codes"), py::arg("scales"), py::arg("fmt"),
        py::arg("kind"), py::arg("tile_rows"), py::arg("tile_cols"), py::arg("out"),
        py::arg("empty"), py::arg("threads"), py::arg("stream"));
  m.def("quantize_delayed", &quantize_delayed, py::arg("x"), py::arg("history"), py::arg("fmt"),
        py::arg("reduce"), py::arg("margin"), py::arg("pow2"), py::arg("rounding"),
        py::arg("empty"), py::arg("threads"), py::arg("stream"));
  m.def("quantize_mx", &quantize_mx, py::arg("x"), py::arg("fmt"), py::arg("block"),
        py::arg("rounding"), py::arg("empty"), py::arg("threads"), py::arg("stream"));
  m.def("dequantize_mx", &dequantize_mx, py::arg("codes"), py::arg("scales"), py::arg("fmt"),
        py::arg("block"), py::arg("out"), py::arg("empty"), py::arg("threads"), py::arg("stream"));
}

} // namespace lowbit::python
