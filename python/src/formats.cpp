// lowbit._core's formats and casts: lowbit.Format (emu's format as a Python class), format names,
// and the host API of kernels/include/lowbit/kernels/cast.hpp (cast, decode) over numpy arrays
// and DLPack tensors. lowbit/_api.py gives them their documented signatures.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"
#include "policy.hpp"

namespace lowbit::python {

namespace {
using code_range = std::pair<std::uint32_t, std::uint32_t>; // first, last (inclusive)
} // namespace

// ---- formats -----------------------------------------------------------------------------------

namespace {

emu::specials parse_specials(const std::string& s) {
  if (s == "ieee")
    return emu::specials::ieee;
  if (s == "fn")
    return emu::specials::fn;
  if (s == "fnuz")
    return emu::specials::fnuz;
  if (s == "none")
    return emu::specials::none;
  fail(errc::invalid_argument,
       "specials '" + s + "': expected one of ieee, fn, fnuz, none (see docs/rounding.md)");
}

emu::format make_format(int exp_bits, int man_bits, std::optional<int> bias,
                        const std::string& specials, bool is_signed, bool has_zero) {
  emu::format f;
  f.exp_bits = exp_bits;
  f.man_bits = man_bits;
  // The IEEE default; guarded because the shift is meaningless outside the valid range, which
  // check_format reports below.
  f.bias = bias ? *bias : (exp_bits >= 1 && exp_bits <= 8 ? (1 << (exp_bits - 1)) - 1 : 0);
  f.special = parse_specials(specials);
  f.is_signed = is_signed;
  f.has_zero = has_zero;
  if (const char* why = emu::check_format(f))
    fail(errc::invalid_argument,
         "Format(exp_bits=" + std::to_string(exp_bits) + ", man_bits=" + std::to_string(man_bits) +
             ", bias=" + (bias ? std::to_string(*bias) : std::string("None")) + ", specials='" +
             specials + "'): " + why);
  return f;
}

} // namespace

// Every `fmt` argument takes a name or a Format.
emu::format to_format(py::handle fmt) {
  if (py::isinstance<py::str>(fmt)) {
    try {
      return emu::parse_format(fmt.cast<std::string>());
    } catch (const error& e) {
      fail(e.code(), std::string("fmt: ") + e.what());
    }
  }
  if (py::isinstance<emu::format>(fmt))
    return fmt.cast<emu::format>();
  fail(errc::invalid_type,
       "fmt: expected a format name (str) or a lowbit.Format, got " + type_name(fmt));
}

namespace {

const char* spec_of(const emu::format& f) {
  for (const auto& n : emu::named_formats)
    if (n.fmt == f)
      return n.spec;
  return nullptr;
}

// One range per sign: the NaN (or Inf) codes of every format are contiguous in the magnitude
// bits. The Python tests check these ranges against decode() over every code.
std::vector<code_range> nan_ranges(const emu::format& f) {
  std::vector<code_range> out;
  const std::uint32_t mag = f.mag_mask();
  const std::vector<std::uint32_t> signs =
      f.is_signed ? std::vector<std::uint32_t>{0u, f.sign_mask()} : std::vector<std::uint32_t>{0u};
  switch (f.special) {
  case emu::specials::ieee:
    for (std::uint32_t s : signs)
      out.push_back({s | (mag - f.man_mask() + 1u), s | mag});
    break;
  case emu::specials::fn:
    for (std::uint32_t s : signs)
      out.push_back({s | mag, s | mag});
    break;
  case emu::specials::fnuz: out.push_back({f.sign_mask(), f.sign_mask()}); break;
  case emu::specials::none: break;
  }
  return out;
}

std::vector<code_range> inf_ranges(const emu::format& f) {
  std::vector<code_range> out;
  if (!f.has_inf())
    return out;
  const std::uint32_t inf = f.mag_mask() - f.man_mask();
  out.push_back({inf, inf});
  if (f.is_signed)
    out.push_back({f.sign_mask() | inf, f.sign_mask() | inf});
  return out;
}

const char* code_dtype_name(const emu::format& f) {
  return kernels::dtype_name(kernels::code_dtype(f));
}

std::string format_repr(const emu::format& f) {
  return "lowbit.Format(exp_bits=" + std::to_string(f.exp_bits) +
         ", man_bits=" + std::to_string(f.man_bits) + ", bias=" + std::to_string(f.bias) +
         ", specials='" + emu::special_name(f.special) +
         "', signed=" + (f.is_signed ? "True" : "False") +
         ", has_zero=" + (f.has_zero ? "True" : "False") + ")";
}

// ---- cast and decode ---------------------------------------------------------------------------

py::object cast(py::handle x, py::handle fmt_arg, const rounding_args& r, py::handle out,
                const py::function& empty, std::int64_t threads, std::uintptr_t stream) {
  const emu::format fmt = to_format(fmt_arg);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg in = take(x, "x", stream, {real_dtypes, ""});
  const dtype code = kernels::code_dtype(fmt);
  const py::object result = result_array(out, empty, in.shape, code);
  const array_arg o = take(result, "out", stream, {{code}, ""}, true);
  require_shape(o, in.shape, "the shape of x");
  // A fresh result is C-contiguous: both views are flat when the input is too.
  const bool flat = in.contiguous() && o.contiguous();
  const kernels::tensor_view iv = view_of(in, flat);
  const kernels::tensor_view ov = view_of(o, flat);
  {
    py::gil_scoped_release no_gil;
    kernels::cast(iv, ov, fmt, pol, r.rng(), ex);
  }
  return result;
}

// `dtype` is the Python layer's dtype name (None: float32, or out's dtype where out is given).
py::object decode(py::handle codes, py::handle fmt_arg, const std::optional<std::string>& dtype_arg,
                  py::handle out, const py::function& empty, std::int64_t threads,
                  std::uintptr_t stream) {
  const emu::format fmt = to_format(fmt_arg);
  const kernels::exec ex = exec_of(threads, stream);
  const dtype want = kernels::code_dtype(fmt);
  if (dtype_arg && *dtype_arg != "float32" && *dtype_arg != "float64")
    fail(errc::invalid_argument, "dtype '" + *dtype_arg + "': expected one of float32, float64");
  const array_arg in = take(codes, "codes", stream,
                            {{want},
                             "does not hold codes of " + emu::format_name(fmt) + "; expected " +
                                 kernels::dtype_name(want)});
  const dtype real = dtype_arg && *dtype_arg == "float64" ? dtype::float64 : dtype::float32;
  const py::object result = result_array(out, empty, in.shape, real);
  const array_arg o = take(result, "out", stream, {{dtype::float32, dtype::float64}, ""}, true);
  if (!out.is_none() && dtype_arg && o.type != real)
    fail(errc::invalid_argument, "out: dtype " + std::string(kernels::dtype_name(o.type)) +
                                     ", but dtype='" + *dtype_arg +
                                     "' (leave dtype out: out's dtype is the result's)");
  if (o.type == dtype::float32 && !fmt.fits_float())
    fail(errc::invalid_argument, std::string(out.is_none() ? "dtype" : "out") + ": the values of " +
                                     emu::format_name(fmt) +
                                     " do not all fit float32; use dtype='float64'");
  require_shape(o, in.shape, "the shape of codes");
  const bool flat = in.contiguous() && o.contiguous();
  const kernels::tensor_view iv = view_of(in, flat);
  const kernels::tensor_view ov = view_of(o, flat);
  {
    py::gil_scoped_release no_gil;
    kernels::decode(iv, ov, fmt, ex);
  }
  return result;
}

} // namespace

void bind_formats(py::module_& m) {
  using emu::format;
  py::class_<format>(m, "Format", R"doc(
A number format: exponent bits, mantissa bits, bias, how NaN/Inf are encoded, signedness.

Format(exp_bits, man_bits, bias=None, specials="ieee", signed=True, has_zero=True)

bias defaults to 2**(exp_bits-1) - 1. specials: "ieee" (Inf and NaNs at exponent all ones),
"fn" (no Inf; NaN at all ones), "fnuz" (no Inf, no -0; NaN at the -0 code), "none" (no NaN).
has_zero=False makes exponent field 0 an ordinary binade (E8M0). docs/rounding.md defines the
values of the codes.)doc")
      .def(py::init(&make_format), py::arg("exp_bits"), py::arg("man_bits"),
           py::arg("bias") = py::none(), py::arg("specials") = "ieee", py::arg("signed") = true,
           py::arg("has_zero") = true)
      .def_readonly("exp_bits", &format::exp_bits)
      .def_readonly("man_bits", &format::man_bits)
      .def_readonly("bias", &format::bias)
      .def_property_readonly("specials",
                             [](const format& f) { return emu::special_name(f.special); })
      .def_readonly("signed", &format::is_signed)
      .def_readonly("has_zero", &format::has_zero)
      .def_property_readonly("bits", &format::bits)
      .def_property_readonly("name", [](const format& f) { return emu::format_name(f); })
      .def_property_readonly("spec",
                             [](const format& f) -> std::optional<std::string> {
                               if (const char* s = spec_of(f))
                                 return std::string(s);
                               return std::nullopt;
                             })
      .def_property_readonly("has_inf", &format::has_inf)
      .def_property_readonly("has_nan", &format::has_nan)
      .def_property_readonly("has_negative_zero", &format::has_negative_zero)
      .def_property_readonly("has_subnormals", &format::has_subnormals)
      .def_property_readonly("emin", &format::emin)
      .def_property_readonly("emax", &format::emax)
      .def_property_readonly("fits_float", &format::fits_float)
      .def_property_readonly("max", [](const format& f) { return emu::max_value(f); })
      .def_property_readonly("min_normal", [](const format& f) { return emu::min_normal(f); })
      .def_property_readonly("min_subnormal", [](const format& f) { return emu::min_positive(f); })
      .def_property_readonly("epsilon", [](const format& f) { return emu::epsilon(f); })
      .def_property_readonly("code_dtype", &code_dtype_name)
      .def_property_readonly("nan_ranges", &nan_ranges)
      .def_property_readonly("inf_ranges", &inf_ranges)
      .def("__eq__",
           [](const format& a, py::object b) {
             return py::isinstance<format>(b) && a == b.cast<format>();
           })
      .def("__hash__",
           [](const format& f) {
             return py::hash(py::make_tuple(f.exp_bits, f.man_bits, f.bias,
                                            static_cast<int>(f.special), f.is_signed, f.has_zero));
           })
      .def("__repr__", &format_repr)
      .def("__str__", [](const format& f) { return emu::format_name(f); })
      .def(py::pickle(
          [](const format& f) {
            return py::make_tuple(f.exp_bits, f.man_bits, f.bias, emu::special_name(f.special),
                                  f.is_signed, f.has_zero);
          },
          [](const py::tuple& t) {
            return make_format(t[0].cast<int>(), t[1].cast<int>(), t[2].cast<int>(),
                               t[3].cast<std::string>(), t[4].cast<bool>(), t[5].cast<bool>());
          }));

  m.def(
      "parse_format", [](py::handle fmt) { return to_format(fmt); }, py::arg("fmt"),
      "A Format from a name (or a Format, returned as is).");
  m.def(
      "named_formats",
      [] {
        std::vector<format> out;
        for (const auto& n : emu::named_formats)
          out.push_back(n.fmt);
        return out;
      },
      "The named formats, in emu::named_formats order.");
  m.def("roundings", [] {
    std::vector<std::string> out;
    for (auto r : emu::all_roundings)
      out.push_back(emu::rounding_name(r));
    return out;
  });
  // The array functions below take their results as arguments (`out`, `codes`, `scales`, ...),
  // allocated by the Python layer in the caller's array library; `stream` is the caller's
  // current CUDA stream (0: the default stream; ignored for CPU arrays).
  py::class_<rounding_args>(m, "_Rounding", "The rounding arguments of a converting call.")
      .def(py::init([](std::string rounding, bool saturate, std::string subnormals,
                       std::string nan_sign, std::optional<std::int64_t> random_bits,
                       std::uint64_t seed, std::uint64_t offset) {
             return rounding_args{std::move(rounding),
                                  saturate,
                                  std::move(subnormals),
                                  std::move(nan_sign),
                                  random_bits,
                                  seed,
                                  offset};
           }),
           py::arg("rounding") = "nearest_even", py::arg("saturate") = false,
           py::arg("subnormals") = "keep", py::arg("nan_sign") = "preserve",
           py::arg("random_bits") = py::none(), py::arg("seed") = 0, py::arg("offset") = 0);
  m.def("cast", &cast, py::arg("x"), py::arg("fmt"), py::arg("rounding"), py::arg("out"),
        py::arg("empty"), py::arg("threads"), py::arg("stream"));
  m.def("decode", &decode, py::arg("codes"), py::arg("fmt"), py::arg("dtype"), py::arg("out"),
        py::arg("empty"), py::arg("threads"), py::arg("stream"));
}

} // namespace lowbit::python
