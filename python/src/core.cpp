// lowbit._core: the compiled half of the Python package. It binds emu's formats and the cast
// kernels' host API over numpy arrays (views without copies; the C++ takes strides). The public,
// documented functions live in the pure-Python package (lowbit/_api.py), which normalizes inputs
// and forwards here; argument checking happens here so that both layers give the same messages.
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
#include <lowbit/emu/philox.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/tensor.hpp>

namespace py = pybind11;

namespace lowbit::python {
namespace {

using kernels::dtype;
using code_range = std::pair<std::uint32_t, std::uint32_t>; // first, last (inclusive)

[[noreturn]] void fail(errc code, const std::string& what) {
  throw error(code, what);
}

std::string type_name(py::handle h) {
  return py::str(py::type::of(h).attr("__name__"));
}
std::string str_of(py::handle h) {
  return py::str(h);
}

// ---- formats -----------------------------------------------------------------------------------

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

// ---- arrays ------------------------------------------------------------------------------------

// The kernels' dtype of a numpy array of real numbers; bfloat16 is ml_dtypes' extension type
// (numpy kind 'V'), recognized by its name.
dtype float_dtype_of(const py::array& a, const char* arg) {
  const py::dtype dt = a.dtype();
  const std::string name = str_of(dt.attr("name"));
  if (!dt.attr("isnative").cast<bool>())
    fail(errc::invalid_type, std::string(arg) + ": dtype " + str_of(dt) +
                                 " is not in native byte order; convert it with "
                                 "x.astype(x.dtype.newbyteorder('='))");
  if (dt.kind() == 'f' && dt.itemsize() == 4)
    return dtype::float32;
  if (dt.kind() == 'f' && dt.itemsize() == 8)
    return dtype::float64;
  if (dt.kind() == 'f' && dt.itemsize() == 2)
    return dtype::float16;
  if (name == "bfloat16" && dt.itemsize() == 2)
    return dtype::bfloat16;
  fail(errc::invalid_type, std::string(arg) + ": dtype " + name +
                               " is not supported; expected float32, float64, float16 or "
                               "bfloat16 (ml_dtypes)");
}

bool is_c_contiguous(const py::array& a) {
  return (a.flags() & py::array::c_style) != 0;
}

// A view of a numpy array. With `flat`, a C-contiguous array (of any rank) is passed as one
// dimension: the kernels index elements in row-major logical order, so results, random bits
// included, are the same, and the kernels' limit of 8 dimensions does not apply.
kernels::tensor_view view_of(const py::array& a, dtype t, const char* arg, bool flat) {
  kernels::tensor_view v;
  v.data = const_cast<void*>(a.data());
  v.type = t;
  const auto item = static_cast<std::int64_t>(a.itemsize());
  if (reinterpret_cast<std::uintptr_t>(a.data()) % static_cast<std::uintptr_t>(item) != 0)
    fail(errc::invalid_argument, std::string(arg) + ": the data is not aligned to its " +
                                     std::to_string(item) +
                                     "-byte items; pass a copy (x.copy()) instead");
  if (flat) {
    v.ndim = 1;
    v.shape[0] = static_cast<std::int64_t>(a.size());
    v.strides[0] = 1;
    return v;
  }
  if (a.ndim() > static_cast<py::ssize_t>(kernels::max_dims))
    fail(errc::invalid_argument, std::string(arg) + ": a non-contiguous array has at most " +
                                     std::to_string(kernels::max_dims) + " dimensions here, got " +
                                     std::to_string(a.ndim()) + "; pass np.ascontiguousarray(x)");
  v.ndim = static_cast<int>(a.ndim());
  for (int k = 0; k < v.ndim; ++k) {
    const auto extent = static_cast<std::int64_t>(a.shape(k));
    const auto stride = static_cast<std::int64_t>(a.strides(k));
    v.shape[k] = extent;
    // The stride of an extent-1 (or empty) dimension is never followed.
    if (extent <= 1) {
      v.strides[k] = 0;
      continue;
    }
    if (stride % item != 0)
      fail(errc::invalid_argument,
           std::string(arg) + ": the stride of dimension " + std::to_string(k) + " (" +
               std::to_string(stride) + " bytes) is not a multiple of the item size (" +
               std::to_string(item) + " bytes); pass np.ascontiguousarray(x)");
    v.strides[k] = stride / item;
  }
  return v;
}

py::array empty_like_shape(const py::array& a, const char* numpy_dtype) {
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  return py::array(py::dtype(numpy_dtype), shape);
}

// ---- cast and decode ---------------------------------------------------------------------------

emu::subnormals parse_subnormals(const std::string& s) {
  if (s == "keep")
    return emu::subnormals::keep;
  if (s == "flush")
    return emu::subnormals::flush;
  fail(errc::invalid_argument, "subnormals '" + s + "': expected one of keep, flush");
}

emu::nan_sign parse_nan_sign(const std::string& s) {
  if (s == "preserve")
    return emu::nan_sign::preserve;
  if (s == "positive")
    return emu::nan_sign::positive;
  fail(errc::invalid_argument, "nan_sign '" + s + "': expected one of preserve, positive");
}

emu::policy make_policy(const std::string& rounding, bool saturate, const std::string& subnormals,
                        const std::string& nan_sign, std::optional<int> random_bits) {
  emu::policy p;
  p.round = emu::parse_rounding(rounding);
  p.over = saturate ? emu::overflow::saturate : emu::overflow::nonsaturating;
  p.sub = parse_subnormals(subnormals);
  p.nan = parse_nan_sign(nan_sign);
  if (p.round == emu::rounding::stochastic) {
    p.random_bits = random_bits.value_or(32);
    if (p.random_bits < 1 || p.random_bits > 32)
      fail(errc::invalid_argument,
           "random_bits: stochastic rounding takes 1..32 random bits, got " +
               std::to_string(p.random_bits));
  } else if (random_bits) {
    // Accepting and ignoring them would hide a mistaken rounding argument.
    fail(errc::invalid_argument, "random_bits: only rounding='stochastic' uses random bits (got "
                                 "rounding='" +
                                     rounding + "')");
  }
  emu::validate(p);
  return p;
}

py::array cast(const py::array& x, py::handle fmt_arg, const std::string& rounding, bool saturate,
               const std::string& subnormals, const std::string& nan_sign,
               std::optional<int> random_bits, std::uint64_t seed, std::uint64_t offset,
               int threads) {
  const emu::format fmt = to_format(fmt_arg);
  const emu::policy pol = make_policy(rounding, saturate, subnormals, nan_sign, random_bits);
  if (threads < 0)
    fail(errc::invalid_argument,
         "threads: expected 0 (all cores) or a positive count, got " + std::to_string(threads));
  const dtype in_type = float_dtype_of(x, "x");
  // The result is C-contiguous: both views are flat when the input is too.
  const bool flat = is_c_contiguous(x);
  const kernels::tensor_view in = view_of(x, in_type, "x", flat);
  py::array out = empty_like_shape(x, code_dtype_name(fmt));
  const kernels::tensor_view out_view = view_of(out, kernels::code_dtype(fmt), "out", flat);
  {
    py::gil_scoped_release no_gil;
    kernels::cast(in, out_view, fmt, pol, emu::random_stream{seed, offset}, kernels::exec{threads});
  }
  return out;
}

py::array decode(const py::array& codes, py::handle fmt_arg, const std::string& out_dtype,
                 int threads) {
  const emu::format fmt = to_format(fmt_arg);
  const dtype want = kernels::code_dtype(fmt);
  const py::dtype dt = codes.dtype();
  if (dt.kind() != 'u' || static_cast<std::size_t>(dt.itemsize()) != kernels::dtype_size(want) ||
      !dt.attr("isnative").cast<bool>())
    fail(errc::invalid_type, "codes: dtype " + str_of(dt) + " does not hold codes of " +
                                 emu::format_name(fmt) + "; expected " + kernels::dtype_name(want));
  dtype out_type;
  if (out_dtype == "float32")
    out_type = dtype::float32;
  else if (out_dtype == "float64")
    out_type = dtype::float64;
  else
    fail(errc::invalid_argument, "dtype '" + out_dtype + "': expected one of float32, float64");
  if (out_type == dtype::float32 && !fmt.fits_float())
    fail(errc::invalid_argument, "dtype: the values of " + emu::format_name(fmt) +
                                     " do not all fit float32; use dtype='float64'");
  if (threads < 0)
    fail(errc::invalid_argument,
         "threads: expected 0 (all cores) or a positive count, got " + std::to_string(threads));
  const bool flat = is_c_contiguous(codes);
  const kernels::tensor_view in = view_of(codes, want, "codes", flat);
  py::array out = empty_like_shape(codes, out_dtype.c_str());
  const kernels::tensor_view out_view = view_of(out, out_type, "out", flat);
  {
    py::gil_scoped_release no_gil;
    kernels::decode(in, out_view, fmt, kernels::exec{threads});
  }
  return out;
}

} // namespace
} // namespace lowbit::python

PYBIND11_MODULE(_core, m) {
  namespace lp = lowbit::python;
  namespace emu = lowbit::emu;
  using emu::format;

  m.doc() = "Compiled core of lowbit: formats, casts and decodes (use the lowbit package).";

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

  py::class_<format>(m, "Format", R"doc(
A number format: exponent bits, mantissa bits, bias, how NaN/Inf are encoded, signedness.

Format(exp_bits, man_bits, bias=None, specials="ieee", signed=True, has_zero=True)

bias defaults to 2**(exp_bits-1) - 1. specials: "ieee" (Inf and NaNs at exponent all ones),
"fn" (no Inf; NaN at all ones), "fnuz" (no Inf, no -0; NaN at the -0 code), "none" (no NaN).
has_zero=False makes exponent field 0 an ordinary binade (E8M0). docs/rounding.md defines the
values of the codes.)doc")
      .def(py::init(&lp::make_format), py::arg("exp_bits"), py::arg("man_bits"),
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
                               if (const char* s = lp::spec_of(f))
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
      .def_property_readonly("min_positive", [](const format& f) { return emu::min_positive(f); })
      .def_property_readonly("epsilon", [](const format& f) { return emu::epsilon(f); })
      .def_property_readonly("code_dtype", &lp::code_dtype_name)
      .def_property_readonly("nan_ranges", &lp::nan_ranges)
      .def_property_readonly("inf_ranges", &lp::inf_ranges)
      .def("__eq__",
           [](const format& a, py::object b) {
             return py::isinstance<format>(b) && a == b.cast<format>();
           })
      .def("__hash__",
           [](const format& f) {
             return py::hash(py::make_tuple(f.exp_bits, f.man_bits, f.bias,
                                            static_cast<int>(f.special), f.is_signed, f.has_zero));
           })
      .def("__repr__", &lp::format_repr)
      .def("__str__", [](const format& f) { return emu::format_name(f); })
      .def(py::pickle(
          [](const format& f) {
            return py::make_tuple(f.exp_bits, f.man_bits, f.bias, emu::special_name(f.special),
                                  f.is_signed, f.has_zero);
          },
          [](const py::tuple& t) {
            return lp::make_format(t[0].cast<int>(), t[1].cast<int>(), t[2].cast<int>(),
                                   t[3].cast<std::string>(), t[4].cast<bool>(), t[5].cast<bool>());
          }));

  m.def(
      "parse_format", [](py::handle fmt) { return lp::to_format(fmt); }, py::arg("fmt"),
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
  m.def("cast", &lp::cast, py::arg("x"), py::arg("fmt"), py::arg("rounding"), py::arg("saturate"),
        py::arg("subnormals"), py::arg("nan_sign"), py::arg("random_bits"), py::arg("seed"),
        py::arg("offset"), py::arg("threads"));
  m.def("decode", &lp::decode, py::arg("codes"), py::arg("fmt"), py::arg("dtype"),
        py::arg("threads"));
  // For the tests of the exception mapping: throws lowbit::error of the named kind.
  m.def("_throw", [](const std::string& kind, const std::string& what) {
    using lowbit::errc;
    const errc code = kind == "invalid_type"  ? errc::invalid_type
                      : kind == "unsupported" ? errc::unsupported
                      : kind == "device"      ? errc::device
                                              : errc::invalid_argument;
    throw lowbit::error(code, what);
  });
  m.def("cuda_available", &lowbit::kernels::cuda_available,
        "True when this build has CUDA kernels and a device is present.");
}
