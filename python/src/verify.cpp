// lowbit._core.verify: host arrays in (numpy or DLPack, through the module's array intake,
// arrays.hpp), lowbit::verify::compare, the C++ report out (wrapped by lowbit.verify's Report).
// The comparison is entirely the C++ one; a Python bound function has already been evaluated
// into an array of allowed errors, which the C++ bound reads by index.
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
#include <lowbit/verify/verify.hpp>

#include "arrays.hpp"
#include "bindings.hpp"

namespace lowbit::python {
namespace {

namespace vf = lowbit::verify;

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

// What lowbit::verify reads: a numpy array or a DLPack producer in host memory (any strides, any
// dtype the kernels know; compare refuses the ones it cannot read, with its own message). The
// Python layer has copied CUDA arrays to the host already.
array_arg take_host(py::handle obj, const char* name) {
  return take(obj, name, 0,
              {{},
               "is not supported; expected float32, float64, float16, bfloat16 (ml_dtypes), "
               "int8, int16, int32, or uint8/uint16/uint32 codes of a format"});
}

kernels::tensor_view host_view(const array_arg& a) {
  if (a.dev.type != kernels::device_type::cpu)
    fail(errc::invalid_argument, std::string(a.name) + ": in " + kernels::device_name(a.dev) +
                                     " memory; lowbit.verify compares host memory");
  if (a.shape.size() > static_cast<std::size_t>(kernels::max_dims))
    fail(errc::invalid_argument, std::string(a.name) + ": at most " +
                                     std::to_string(kernels::max_dims) + " dimensions, got " +
                                     std::to_string(a.shape.size()) + "; reshape it");
  return view_of(a);
}

vf::report verify(py::handle candidate, py::handle reference,
                  const std::optional<std::string>& policy_text, py::handle fmt_arg,
                  py::handle inputs, py::handle input_fmt_arg, std::int64_t worst,
                  const std::optional<py::array_t<double, py::array::c_style>>& bounds,
                  const std::string& bound_name) {
  const std::optional<emu::format> fmt = optional_format(fmt_arg, "fmt");
  vf::options opt;
  opt.input_format = optional_format(input_fmt_arg, "input_fmt");
  if (worst < 0)
    throw error(errc::invalid_argument,
                "worst: expected a count >= 0, got " + std::to_string(worst));
  opt.worst = static_cast<std::size_t>(worst);

  vf::policy pol;
  if (!bounds)
    pol = vf::parse_policy(policy_text.value_or("exact"), fmt);
  // The arrays stay alive (their DLPack capsules taken) until the comparison returns.
  const array_arg ca = take_host(candidate, "candidate");
  const array_arg ra = take_host(reference, "reference");
  std::optional<array_arg> ia;
  if (!inputs.is_none())
    ia = take_host(inputs, "inputs");
  if (bounds) {
    if (static_cast<std::int64_t>(bounds->size()) != ca.numel())
      throw error(errc::invalid_argument,
                  "bound: the allowed errors have " + std::to_string(bounds->size()) +
                      " elements, the arrays " + std::to_string(ca.numel()));
    const double* b = bounds->data();
    pol = vf::bound([b](const vf::bound_args& a) { return b[a.flat_index]; }, bound_name);
    pol.format = fmt;
  }
  const kernels::tensor_view c = host_view(ca);
  const kernels::tensor_view r = host_view(ra);
  std::optional<kernels::tensor_view> in;
  if (ia)
    in = host_view(*ia);
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
        "lowbit::verify::compare over host arrays (use lowbit.verify).");
}

} // namespace lowbit::python
