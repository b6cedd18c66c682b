// lowbit._core.verify: numpy arrays in, lowbit::verify::compare, the C++ report out (wrapped by
// lowbit.verify's Report). The comparison is entirely the C++ one; a Python bound function has
// already been evaluated into an array of allowed errors, which the C++ bound reads by index.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/tensor.hpp>
#include <lowbit/kernels/verify.hpp>

#include "bindings.hpp"

namespace py = pybind11;

namespace lowbit::python {
namespace {

namespace vf = lowbit::verify;
using kernels::dtype;

std::optional<emu::format> optional_format(py::handle fmt, const char* arg) {
  if (fmt.is_none())
    return std::nullopt;
  if (py::isinstance<py::str>(fmt)) {
    try {
      return emu::parse_format(fmt.cast<std::string>());
    } catch (const error& e) {
      throw error(e.code(), std::string(arg) + ": " + e.what());
    }
  }
  if (py::isinstance<emu::format>(fmt))
    return fmt.cast<emu::format>();
  throw error(errc::invalid_type, std::string(arg) +
                                      ": expected a format name (str), a "
                                      "lowbit.Format or None, got " +
                                      std::string(py::str(py::type::of(fmt).attr("__name__"))));
}

// A view of a numpy array (any strides) for lowbit::verify. Small and local on purpose: the
// module's general array intake (numpy and DLPack) will replace it.
kernels::tensor_view host_view(const py::array& a, const char* arg) {
  const py::dtype dt = a.dtype();
  const std::string name = py::str(dt.attr("name"));
  if (!dt.attr("isnative").cast<bool>() && dt.itemsize() > 1)
    throw error(errc::invalid_type, std::string(arg) + ": dtype " + std::string(py::str(dt)) +
                                        " is not in native byte order; convert it with "
                                        "x.astype(x.dtype.newbyteorder('='))");
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  dtype t;
  if (kind == 'f' && size == 4)
    t = dtype::float32;
  else if (kind == 'f' && size == 8)
    t = dtype::float64;
  else if (kind == 'f' && size == 2)
    t = dtype::float16;
  else if (name == "bfloat16" && size == 2)
    t = dtype::bfloat16;
  else if (kind == 'u' && size == 1)
    t = dtype::uint8;
  else if (kind == 'u' && size == 2)
    t = dtype::uint16;
  else if (kind == 'u' && size == 4)
    t = dtype::uint32;
  else if (kind == 'i' && size == 1)
    t = dtype::int8;
  else if (kind == 'i' && size == 2)
    t = dtype::int16;
  else if (kind == 'i' && size == 4)
    t = dtype::int32;
  else if (kind == 'i' && size == 8)
    t = dtype::int64; // refused by compare, with its message
  else
    throw error(errc::invalid_type,
                std::string(arg) + ": dtype " + name +
                    " is not supported; expected float32, float64, float16, bfloat16 "
                    "(ml_dtypes), int8, int16, int32, or uint8/uint16/uint32 codes of a format");
  if (a.ndim() > static_cast<py::ssize_t>(kernels::max_dims))
    throw error(errc::invalid_argument,
                std::string(arg) + ": at most " + std::to_string(kernels::max_dims) +
                    " dimensions, got " + std::to_string(a.ndim()) + "; reshape it");
  kernels::tensor_view v;
  v.data = const_cast<void*>(a.data());
  v.type = t;
  v.ndim = static_cast<int>(a.ndim());
  for (int k = 0; k < v.ndim; ++k) {
    v.shape[static_cast<std::size_t>(k)] = static_cast<std::int64_t>(a.shape(k));
    const auto stride = static_cast<std::int64_t>(a.strides(k));
    if (a.shape(k) <= 1)
      continue; // never followed
    if (stride % static_cast<std::int64_t>(size) != 0)
      throw error(errc::invalid_argument,
                  std::string(arg) + ": the stride of dimension " + std::to_string(k) +
                      " is not a multiple of the item size; pass np.ascontiguousarray(x)");
    v.strides[static_cast<std::size_t>(k)] = stride / static_cast<std::int64_t>(size);
  }
  return v;
}

vf::report verify(const py::array& candidate, const py::array& reference,
                  const std::optional<std::string>& policy_text, py::handle fmt_arg,
                  const std::optional<py::array>& inputs, py::handle input_fmt_arg, int worst,
                  const std::optional<py::array_t<double, py::array::c_style>>& bounds,
                  const std::string& bound_name) {
  const std::optional<emu::format> fmt = optional_format(fmt_arg, "format");
  vf::options opt;
  opt.input_format = optional_format(input_fmt_arg, "input_format");
  if (worst < 0)
    throw error(errc::invalid_argument,
                "worst: expected a count >= 0, got " + std::to_string(worst));
  opt.worst = static_cast<std::size_t>(worst);

  vf::policy pol;
  if (bounds) {
    if (static_cast<py::ssize_t>(bounds->size()) != candidate.size())
      throw error(errc::invalid_argument,
                  "bound: the allowed errors have " + std::to_string(bounds->size()) +
                      " elements, the arrays " + std::to_string(candidate.size()));
    const double* b = bounds->data();
    pol = vf::bound([b](const vf::bound_args& a) { return b[a.flat_index]; }, bound_name);
    pol.format = fmt;
  } else {
    pol = vf::parse_policy(policy_text.value_or("exact"), fmt);
  }
  const kernels::tensor_view c = host_view(candidate, "candidate");
  const kernels::tensor_view r = host_view(reference, "reference");
  std::optional<kernels::tensor_view> in;
  if (inputs)
    in = host_view(*inputs, "inputs");
  py::gil_scoped_release no_gil;
  return vf::compare(c, r, pol, in, opt);
}

} // namespace

void bind_verify(py::module_& m) {
  py::class_<vf::element>(m, "VerifyElement", "One element of a verify report's worst list.")
      .def_property_readonly("index",
                             [](const vf::element& e) { return py::tuple(py::cast(e.index)); })
      .def_readonly("flat_index", &vf::element::flat_index)
      .def_readonly("input", &vf::element::input)
      .def_property_readonly("input_hex",
                             [](const vf::element& e) -> std::optional<std::string> {
                               if (!e.input)
                                 return std::nullopt;
                               return e.input_hex;
                             })
      .def_readonly("candidate", &vf::element::candidate)
      .def_readonly("candidate_hex", &vf::element::candidate_hex)
      .def_readonly("reference", &vf::element::reference)
      .def_readonly("reference_hex", &vf::element::reference_hex)
      .def_readonly("abs_error", &vf::element::abs_error)
      .def_readonly("rel_error", &vf::element::rel_error)
      .def_readonly("ulp_error", &vf::element::ulp_error)
      .def_readonly("allowed", &vf::element::allowed)
      .def_readonly("failed", &vf::element::failed)
      .def_readonly("nan_mismatch", &vf::element::nan_mismatch);

  py::class_<vf::histogram_bucket>(m, "VerifyBucket", "A bucket of ulp distances (lo, hi].")
      .def_readonly("label", &vf::histogram_bucket::label)
      .def_readonly("lo", &vf::histogram_bucket::lo)
      .def_readonly("hi", &vf::histogram_bucket::hi)
      .def_readonly("count", &vf::histogram_bucket::count);

  py::class_<vf::report>(m, "VerifyReport", "The C++ lowbit::verify::report.")
      .def_readonly("policy", &vf::report::policy)
      .def_readonly("grid", &vf::report::grid)
      .def_readonly("candidate_dtype", &vf::report::candidate_dtype)
      .def_readonly("reference_dtype", &vf::report::reference_dtype)
      .def_property_readonly("input_dtype",
                             [](const vf::report& r) -> std::optional<std::string> {
                               if (r.input_dtype.empty())
                                 return std::nullopt;
                               return r.input_dtype;
                             })
      .def_property_readonly("shape",
                             [](const vf::report& r) { return py::tuple(py::cast(r.shape)); })
      .def_readonly("total", &vf::report::total)
      .def_readonly("checked", &vf::report::checked)
      .def_readonly("nan_matches", &vf::report::nan_matches)
      .def_readonly("nan_mismatches", &vf::report::nan_mismatches)
      .def_readonly("failed", &vf::report::failed)
      .def_readonly("max_abs_error", &vf::report::max_abs_error)
      .def_readonly("max_rel_error", &vf::report::max_rel_error)
      .def_readonly("max_ulp_error", &vf::report::max_ulp_error)
      .def_readonly("worst", &vf::report::worst)
      .def_readonly("histogram", &vf::report::histogram)
      .def_property_readonly("ok", &vf::report::ok)
      .def("to_string", &vf::report::to_string)
      .def("to_json", &vf::report::to_json);

  m.def("verify", &verify, py::arg("candidate"), py::arg("reference"), py::arg("policy"),
        py::arg("format"), py::arg("inputs"), py::arg("input_format"), py::arg("worst"),
        py::arg("bounds"), py::arg("bound_name"),
        "lowbit::verify::compare over numpy arrays (use lowbit.verify).");
}

} // namespace lowbit::python
