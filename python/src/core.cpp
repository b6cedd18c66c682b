// lowbit._core: the compiled half of the Python package. It binds emu's formats and the host
// APIs of the cast and quantization kernels over numpy arrays and DLPack tensors (views without
// copies; the C++ takes strides; dlpack.hpp has the exchange ABI; arrays.hpp declares the array
// intake defined here, which blockwise.cpp uses too). The public, documented functions live in
// the pure-Python package (lowbit/_api.py, lowbit/_quantize.py, lowbit/_blockwise.py), which
// normalizes inputs, allocates results in the caller's array library and forwards here; argument
// checking happens here so that both layers give the same messages.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
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
#include <lowbit/kernels/quantize.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "bindings.hpp"
#include "dlpack.hpp"

namespace py = pybind11;

namespace lowbit::python {

namespace {
using code_range = std::pair<std::uint32_t, std::uint32_t>; // first, last (inclusive)
} // namespace

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

} // namespace

// ---- arrays ------------------------------------------------------------------------------------
//
// Every array argument is a numpy array (read through the buffer protocol, bfloat16 from
// ml_dtypes included) or a DLPack producer (torch, cupy, jax, numpy via __dlpack__). Results are
// allocated by the Python layer in the caller's array library and passed down the same way, so
// the C++ never allocates and never copies.

const dtypes real_dtypes = {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16};
const dtypes quant_inputs = {dtype::float32, dtype::float16, dtype::bfloat16};
const dtypes any_dtype = {};

std::string dtype_list(const dtypes& allowed) {
  std::string out;
  std::size_t i = 0;
  for (dtype t : allowed) {
    if (i > 0)
      out += i + 1 == allowed.size() ? " or " : ", ";
    out += kernels::dtype_name(t);
    ++i;
  }
  return out;
}

namespace {

std::optional<dtype> numpy_dtype(const py::dtype& dt) {
  const auto size = dt.itemsize();
  switch (dt.kind()) {
  case 'f':
    if (size == 4)
      return dtype::float32;
    if (size == 8)
      return dtype::float64;
    if (size == 2)
      return dtype::float16;
    break;
  case 'u':
    if (size == 1)
      return dtype::uint8;
    if (size == 2)
      return dtype::uint16;
    if (size == 4)
      return dtype::uint32;
    break;
  case 'i':
    if (size == 1)
      return dtype::int8;
    if (size == 2)
      return dtype::int16;
    if (size == 4)
      return dtype::int32;
    if (size == 8)
      return dtype::int64;
    break;
  default:
    // ml_dtypes' bfloat16 is an extension type (kind 'V'), recognized by its name.
    if (size == 2 && str_of(dt.attr("name")) == "bfloat16")
      return dtype::bfloat16;
  }
  return std::nullopt;
}

std::optional<dtype> dlpack_dtype(const dlpack::data_type& t) {
  if (t.lanes != 1)
    return std::nullopt;
  switch (t.code) {
  case dlpack::float_code:
    if (t.bits == 32)
      return dtype::float32;
    if (t.bits == 64)
      return dtype::float64;
    if (t.bits == 16)
      return dtype::float16;
    break;
  case dlpack::bfloat_code:
    if (t.bits == 16)
      return dtype::bfloat16;
    break;
  case dlpack::uint_code:
    if (t.bits == 8)
      return dtype::uint8;
    if (t.bits == 16)
      return dtype::uint16;
    if (t.bits == 32)
      return dtype::uint32;
    break;
  case dlpack::int_code:
    if (t.bits == 8)
      return dtype::int8;
    if (t.bits == 16)
      return dtype::int16;
    if (t.bits == 32)
      return dtype::int32;
    if (t.bits == 64)
      return dtype::int64;
    break;
  default: break;
  }
  return std::nullopt;
}

std::string dlpack_dtype_name(const dlpack::data_type& t) {
  static const char* const names[] = {"int",    "uint",    "float", "opaque",
                                      "bfloat", "complex", "bool"};
  std::string s = t.code < 7 ? names[t.code] : "code" + std::to_string(t.code) + "_";
  s += std::to_string(t.bits);
  if (t.lanes != 1)
    s += "x" + std::to_string(t.lanes);
  return s;
}

void finish(array_arg& a, std::int64_t item) {
  if (a.numel() > 0 &&
      reinterpret_cast<std::uintptr_t>(a.data) % static_cast<std::uintptr_t>(item) != 0)
    fail(errc::invalid_argument, std::string(a.name) + ": the data is not aligned to its " +
                                     std::to_string(item) +
                                     "-byte items; pass a copy (x.copy()) instead");
}

void take_numpy(array_arg& a, const py::array& arr, const dtype_rule& rule, bool writable) {
  const py::dtype dt = arr.dtype();
  const std::string dt_name = str_of(dt.attr("name"));
  if (!dt.attr("isnative").cast<bool>())
    fail(errc::invalid_type, std::string(a.name) + ": dtype " + str_of(dt) +
                                 " is not in native byte order; convert it with "
                                 "x.astype(x.dtype.newbyteorder('='))");
  const std::optional<dtype> t = numpy_dtype(dt);
  rule.check(a.name, t, dt_name);
  if (writable && !arr.writeable())
    fail(errc::invalid_argument,
         std::string(a.name) + ": the array is read-only, but this function writes to it");
  a.owner = py::reinterpret_borrow<py::object>(arr);
  a.type = *t;
  a.data = const_cast<void*>(arr.data());
  a.read_only = !arr.writeable();
  const auto item = static_cast<std::int64_t>(arr.itemsize());
  for (py::ssize_t k = 0; k < arr.ndim(); ++k) {
    const auto extent = static_cast<std::int64_t>(arr.shape(k));
    const auto stride = static_cast<std::int64_t>(arr.strides(k));
    a.shape.push_back(extent);
    // The stride of an extent-1 (or empty) dimension is never followed.
    if (extent <= 1) {
      a.strides.push_back(0);
      continue;
    }
    if (stride % item != 0)
      fail(errc::invalid_argument,
           std::string(a.name) + ": the stride of dimension " + std::to_string(k) + " (" +
               std::to_string(stride) + " bytes) is not a multiple of the item size (" +
               std::to_string(item) + " bytes); pass np.ascontiguousarray(x)");
    a.strides.push_back(stride / item);
  }
  finish(a, item);
}

// The device of a DLPack tensor, or a TypeError naming the argument.
kernels::device dlpack_device(const char* name, std::int32_t type, std::int32_t id) {
  switch (type) {
  case dlpack::cpu:
  case dlpack::cuda_host: return {kernels::device_type::cpu, 0};
  case dlpack::cuda:
  case dlpack::cuda_managed:
#if !defined(LOWBIT_WITH_CUDA)
    fail(errc::unsupported,
         std::string(name) + ": a CUDA tensor (cuda:" + std::to_string(id) +
             "), but this lowbit build has no CUDA kernels; rebuild with LOWBIT_ENABLE_CUDA=ON "
             "or pass CPU tensors");
#else
    return {kernels::device_type::cuda, id};
#endif
  default: break;
  }
  fail(errc::invalid_type, std::string(name) + ": memory on " + dlpack::device_type_name(type) +
                               " (DLPack device type " + std::to_string(type) +
                               ") is not supported; expected CPU or CUDA memory");
}

// Calls obj.__dlpack__(), asking for a versioned capsule first (DLPack >= 1.0 producers) and
// falling back to the legacy call for producers that do not know max_version. CUDA producers are
// told the stream the work will run on, so that they order their pending work before it.
py::object call_dlpack(py::handle obj, const char* name, bool cuda, std::uintptr_t stream) {
  const py::object fn = obj.attr("__dlpack__");
  // DLPack's stream numbers: 1 is the legacy default stream (0 is reserved), 2 per-thread.
  const py::object s = cuda ? py::object(py::int_(stream == 0 ? 1 : stream)) : py::none();
  auto failed = [&](py::error_already_set& e) -> std::string {
    return std::string(name) + ": " + type_name(obj) + ".__dlpack__() failed: " + e.what();
  };
  try {
    if (cuda)
      return fn(py::arg("stream") = s, py::arg("max_version") = py::make_tuple(1, 0));
    return fn(py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError))
      fail(errc::invalid_type, failed(e));
  }
  try {
    if (cuda)
      return fn(py::arg("stream") = s);
    return fn();
  } catch (py::error_already_set& e) {
    fail(errc::invalid_type, failed(e));
  }
}

void take_dlpack(array_arg& a, py::handle obj, const dtype_rule& rule, bool writable,
                 std::uintptr_t stream) {
  std::int32_t dev_type = dlpack::cpu;
  std::int32_t dev_id = 0;
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple d;
    try {
      d = obj.attr("__dlpack_device__")().cast<py::tuple>();
      if (d.size() != 2)
        throw py::cast_error("not a pair");
      dev_type = py::int_(d[0]).cast<std::int32_t>();
      dev_id = py::int_(d[1]).cast<std::int32_t>();
    } catch (py::error_already_set& e) {
      fail(errc::invalid_type, std::string(a.name) + ": " + type_name(obj) +
                                   ".__dlpack_device__() failed: " + e.what());
    } catch (py::cast_error&) {
      fail(errc::invalid_type, std::string(a.name) + ": " + type_name(obj) +
                                   ".__dlpack_device__() did not return (device_type, id)");
    }
  }
  // Refuse before exporting: some producers cannot export to the CPU at all.
  const kernels::device want = dlpack_device(a.name, dev_type, dev_id);
  const py::object capsule =
      call_dlpack(obj, a.name, want.type == kernels::device_type::cuda, stream);
  a.dl = dlpack::take_capsule(capsule.ptr());
  if (!a.dl)
    fail(errc::invalid_type, std::string(a.name) + ": " + type_name(obj) +
                                 ".__dlpack__() returned " + type_name(capsule) +
                                 ", not an unused DLPack capsule");
  a.owner = py::reinterpret_borrow<py::object>(obj);
  if (a.dl.versioned() && a.dl.ver().major > dlpack::supported_major) {
    const dlpack::version v = a.dl.ver();
    a.dl.release();
    fail(errc::invalid_type, std::string(a.name) + ": the producer's DLPack " +
                                 std::to_string(v.major) + "." + std::to_string(v.minor) +
                                 " is newer than this lowbit understands (1.x)");
  }
  const dlpack::tensor& t = a.dl.get();
  a.dev = dlpack_device(a.name, t.dev.device_type, t.dev.device_id);
  rule.check(a.name, dlpack_dtype(t.dtype), dlpack_dtype_name(t.dtype));
  a.type = *dlpack_dtype(t.dtype);
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr))
    fail(errc::invalid_argument, std::string(a.name) + ": the DLPack tensor has no valid shape");
  a.read_only = a.dl.read_only();
  if (writable && a.read_only)
    fail(errc::invalid_argument,
         std::string(a.name) + ": the tensor is read-only, but this function writes to it");
  std::int64_t expect = 1;
  a.shape.assign(static_cast<std::size_t>(t.ndim), 0);
  a.strides.assign(static_cast<std::size_t>(t.ndim), 0);
  for (std::int32_t k = t.ndim; k-- > 0;) {
    const std::int64_t extent = t.shape[k];
    if (extent < 0)
      fail(errc::invalid_argument,
           std::string(a.name) + ": negative extent in the DLPack tensor's shape");
    a.shape[static_cast<std::size_t>(k)] = extent;
    // NULL strides: compact row-major.
    const std::int64_t stride = t.strides ? t.strides[k] : expect;
    a.strides[static_cast<std::size_t>(k)] = extent <= 1 ? 0 : stride;
    expect *= extent;
  }
  a.data = static_cast<char*>(t.data) + t.byte_offset;
  if (a.numel() == 0 && t.data == nullptr)
    a.data = nullptr;
  finish(a, static_cast<std::int64_t>(kernels::dtype_size(a.type)));
}

} // namespace

array_arg take(py::handle obj, const char* name, std::uintptr_t stream, const dtype_rule& rule,
               bool writable) {
  array_arg a;
  a.name = name;
  if (py::isinstance<py::array>(obj))
    take_numpy(a, py::reinterpret_borrow<py::array>(obj), rule, writable);
  else if (py::hasattr(obj, "__dlpack__"))
    take_dlpack(a, obj, rule, writable, stream);
  else
    fail(errc::invalid_type, std::string(name) +
                                 ": expected a numpy array or a DLPack tensor (torch, cupy, "
                                 "jax, ...), got " +
                                 type_name(obj));
  return a;
}

// The kernels' view of an argument. `flat` passes a C-contiguous array (of any rank) as one
// dimension: the element-wise kernels index elements in row-major logical order, so results,
// random bits included, are the same, and the limit of 8 dimensions does not apply. Otherwise a
// contiguous array of more than 8 dimensions is passed as its matrix reading (rows x last
// dimension), which is how the quantization kernels read every tensor anyway.
kernels::tensor_view view_of(const array_arg& a, bool flat) {
  kernels::tensor_view v;
  v.data = a.data;
  v.type = a.type;
  v.dev = a.dev;
  const auto ndim = static_cast<int>(a.shape.size());
  if (flat) {
    v.ndim = 1;
    v.shape[0] = a.numel();
    v.strides[0] = 1;
    return v;
  }
  if (ndim <= kernels::max_dims) {
    v.ndim = ndim;
    // Contiguous arrays (empty ones included) get their row-major strides, whatever the
    // producer wrote for extents of 0 and 1, so that the kernels see them as contiguous.
    const bool contiguous = a.contiguous();
    std::int64_t stride = 1;
    for (int k = ndim - 1; k >= 0; --k) {
      const auto u = static_cast<std::size_t>(k);
      v.shape[k] = a.shape[u];
      v.strides[k] = contiguous ? stride : a.strides[u];
      stride *= a.shape[u];
    }
    return v;
  }
  if (!a.contiguous())
    fail(errc::invalid_argument, std::string(a.name) + ": a non-contiguous array has at most " +
                                     std::to_string(kernels::max_dims) + " dimensions here, got " +
                                     std::to_string(ndim) +
                                     "; make it contiguous first (np.ascontiguousarray(x), "
                                     "x.contiguous())");
  v.ndim = 2;
  v.shape[0] = 1;
  for (int k = 0; k + 1 < ndim; ++k)
    v.shape[0] *= a.shape[static_cast<std::size_t>(k)];
  v.shape[1] = a.shape.back();
  v.strides[1] = 1;
  v.strides[0] = v.shape[1];
  return v;
}

void require_shape(const array_arg& a, const std::vector<std::int64_t>& shape, const char* of) {
  if (a.shape == shape)
    return;
  auto str = [](const std::vector<std::int64_t>& s) {
    std::string out = "(";
    for (std::size_t i = 0; i < s.size(); ++i)
      out += (i ? ", " : "") + std::to_string(s[i]);
    return out + (s.size() == 1 ? ",)" : ")");
  };
  fail(errc::invalid_argument, std::string(a.name) + ": expected shape " + str(shape) + " (" + of +
                                   ") but got " + str(a.shape));
}

int check_threads(int threads) {
  if (threads < 0)
    fail(errc::invalid_argument,
         "threads: expected 0 (all cores) or a positive count, got " + std::to_string(threads));
  return threads;
}

kernels::exec exec_of(int threads, std::uintptr_t stream) {
  return kernels::exec{check_threads(threads), reinterpret_cast<void*>(stream)};
}

namespace {

// ---- policies ----------------------------------------------------------------------------------

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

// The rounding arguments every converting function takes, as one Python-side bundle.
struct rounding_args {
  std::string rounding = "nearest_even";
  bool saturate = false;
  std::string subnormals = "keep";
  std::string nan_sign = "preserve";
  std::optional<int> random_bits;
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;

  emu::policy policy() const {
    return make_policy(rounding, saturate, subnormals, nan_sign, random_bits);
  }
  emu::random_stream rng() const { return emu::random_stream{seed, offset}; }
};

// ---- cast and decode ---------------------------------------------------------------------------

void cast(py::handle x, py::handle fmt_arg, const rounding_args& r, py::handle out, int threads,
          std::uintptr_t stream) {
  const emu::format fmt = to_format(fmt_arg);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg in = take(x, "x", stream, {real_dtypes, ""});
  const dtype code = kernels::code_dtype(fmt);
  const array_arg o = take(out, "out", stream, {{code}, ""}, true);
  require_shape(o, in.shape, "the shape of x");
  // The result is C-contiguous: both views are flat when the input is too.
  const bool flat = in.contiguous() && o.contiguous();
  const kernels::tensor_view iv = view_of(in, flat);
  const kernels::tensor_view ov = view_of(o, flat);
  py::gil_scoped_release no_gil;
  kernels::cast(iv, ov, fmt, pol, r.rng(), ex);
}

void decode(py::handle codes, py::handle fmt_arg, py::handle out, int threads,
            std::uintptr_t stream) {
  const emu::format fmt = to_format(fmt_arg);
  const kernels::exec ex = exec_of(threads, stream);
  const dtype want = kernels::code_dtype(fmt);
  const array_arg in = take(codes, "codes", stream,
                            {{want},
                             "does not hold codes of " + emu::format_name(fmt) + "; expected " +
                                 kernels::dtype_name(want)});
  const array_arg o = take(out, "out", stream, {{dtype::float32, dtype::float64}, ""}, true);
  if (o.type == dtype::float32 && !fmt.fits_float())
    fail(errc::invalid_argument, "dtype: the values of " + emu::format_name(fmt) +
                                     " do not all fit float32; use dtype='float64'");
  require_shape(o, in.shape, "the shape of codes");
  const bool flat = in.contiguous() && o.contiguous();
  const kernels::tensor_view iv = view_of(in, flat);
  const kernels::tensor_view ov = view_of(o, flat);
  py::gil_scoped_release no_gil;
  kernels::decode(iv, ov, fmt, ex);
}

// ---- quantization ------------------------------------------------------------------------------

// A target: a float format (name or Format) or an integer target by name.
kernels::target to_target(py::handle t, const char* arg) {
  if (py::isinstance<py::str>(t)) {
    const std::string name = t.cast<std::string>();
    try {
      if (name.rfind("int", 0) == 0 || name.rfind("uint", 0) == 0)
        return kernels::target::of(emu::parse_int_format(name));
      return kernels::target::of(emu::parse_format(name));
    } catch (const error& e) {
      const bool integer = name.rfind("int", 0) == 0 || name.rfind("uint", 0) == 0;
      fail(e.code(), std::string(arg) + ": " + e.what() +
                         (integer ? ""
                                  : " (or an integer target: int8, int8_sym, uint8, int4, "
                                    "int4_sym, uint4)"));
    }
  }
  if (py::isinstance<emu::format>(t))
    return kernels::target::of(t.cast<emu::format>());
  fail(errc::invalid_type, std::string(arg) +
                               ": expected a format name, a lowbit.Format or an integer target "
                               "name (int8, int8_sym, uint8, int4, int4_sym, uint4), got " +
                               type_name(t));
}

std::string target_name(const kernels::target& t) {
  return t.is_int ? emu::int_format_name(t.ifmt) : emu::format_name(t.fmt);
}

// (name, code dtype, largest finite value, is an integer) of a target; the Python layer
// allocates codes with it. Targets that no quantization function accepts are refused here with
// the kernels' message.
py::tuple target_info(py::handle t, const char* arg) {
  const kernels::target tg = to_target(t, arg);
  if (tg.is_int) {
    if (const char* why = emu::check_int_format(tg.ifmt))
      fail(errc::invalid_argument, std::string(arg) + ": " + why);
  } else if (!tg.fmt.fits_float() || tg.fmt.bits() > 16) {
    fail(errc::invalid_argument,
         std::string(arg) + ": format " + emu::format_name(tg.fmt) +
             " cannot be a quantization target (its values must fit float32 and its codes 16 "
             "bits)");
  }
  return py::make_tuple(target_name(tg), kernels::dtype_name(tg.code_dtype()), tg.max_value(),
                        tg.is_int);
}

kernels::grouping make_grouping(const std::string& kind, std::int64_t rows, std::int64_t cols) {
  using g = kernels::grouping;
  if (kind == "tensor")
    return g::per_tensor();
  if (kind == "rows")
    return g::per_row();
  if (kind == "columns")
    return g::per_column();
  if (kind == "blocks") {
    if (cols < 1)
      fail(errc::invalid_argument,
           "granularity: the block length must be >= 1, got " + std::to_string(cols));
    return g::blocks(cols);
  }
  if (kind == "tiles") {
    if (rows < 1 || cols < 1)
      fail(errc::invalid_argument, "granularity: tile sizes must be >= 1, got (" +
                                       std::to_string(rows) + ", " + std::to_string(cols) + ")");
    return g::tiles(rows, cols);
  }
  fail(errc::invalid_argument, "granularity '" + kind +
                                   "': expected tensor, rows, columns, ('blocks', k) or "
                                   "('tiles', r, c)");
}

kernels::scaling make_scaling(int margin, bool pow2) {
  if (margin < -126 || margin > 126)
    fail(errc::invalid_argument,
         "margin: expected an integer in -126..126, got " + std::to_string(margin));
  return kernels::scaling{margin, pow2};
}

void quantize(py::handle x, py::handle target_arg, const std::string& kind, std::int64_t rows,
              std::int64_t cols, int margin, bool pow2, bool transpose, const rounding_args& r,
              py::handle codes, py::handle scales, int threads, std::uintptr_t stream) {
  const kernels::target t = to_target(target_arg, "target");
  const kernels::grouping g = make_grouping(kind, rows, cols);
  const kernels::scaling sc = make_scaling(margin, pow2);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  if (transpose && g.k != kernels::grouping::kind::columns)
    fail(errc::invalid_argument,
         "transpose: only granularity='columns' can write transposed codes");
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const array_arg ca = take(codes, "codes", stream, {{t.code_dtype()}, ""}, true);
  const array_arg sa = take(scales, "scales", stream, {{dtype::float32}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), cv = view_of(ca), sv = view_of(sa);
  py::gil_scoped_release no_gil;
  kernels::quantize(xv, cv, sv, t, g, pol, sc, r.rng(), transpose, ex);
}

void cast_scaled(py::handle x, py::handle scale, py::handle target_arg, const rounding_args& r,
                 py::handle codes, int threads, std::uintptr_t stream) {
  const kernels::target t = to_target(target_arg, "target");
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
  const array_arg ca = take(codes, "codes", stream, {{t.code_dtype()}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), qv = view_of(qa), cv = view_of(ca);
  py::gil_scoped_release no_gil;
  kernels::cast_scaled(xv, cv, qv, t, pol, r.rng(), ex);
}

void dequantize(py::handle codes, py::handle scales, py::handle target_arg, const std::string& kind,
                std::int64_t rows, std::int64_t cols, py::handle out, int threads,
                std::uintptr_t stream) {
  const kernels::target t = to_target(target_arg, "target");
  const kernels::grouping g = make_grouping(kind, rows, cols);
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg ca = take(codes, "codes", stream,
                            {{t.code_dtype()},
                             std::string("does not hold codes of ") + target_name(t) +
                                 "; expected " + kernels::dtype_name(t.code_dtype())});
  const array_arg sa = take(scales, "scales", stream, {{dtype::float32}, ""});
  const array_arg oa = take(out, "out", stream, {{dtype::float32}, ""}, true);
  require_shape(oa, ca.shape, "the shape of codes");
  const kernels::tensor_view cv = view_of(ca), sv = view_of(sa), ov = view_of(oa);
  py::gil_scoped_release no_gil;
  kernels::dequantize(cv, sv, ov, t, g, ex);
}

kernels::history_reduce parse_reduce(const std::string& s) {
  if (s == "max")
    return kernels::history_reduce::max;
  if (s == "most_recent")
    return kernels::history_reduce::most_recent;
  fail(errc::invalid_argument, "reduce '" + s + "': expected one of max, most_recent");
}

void quantize_delayed(py::handle x, py::handle history, py::handle target_arg,
                      const std::string& reduce, int margin, bool pow2, const rounding_args& r,
                      py::handle codes, py::handle scale_pair, int threads, std::uintptr_t stream) {
  const kernels::target t = to_target(target_arg, "target");
  const kernels::history_reduce red = parse_reduce(reduce);
  const kernels::scaling sc = make_scaling(margin, pow2);
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const array_arg ha = take(history, "history", stream, {{dtype::float32}, ""}, true);
  const array_arg ca = take(codes, "codes", stream, {{t.code_dtype()}, ""}, true);
  const array_arg pa = take(scale_pair, "scale_pair", stream, {{dtype::float32}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), hv = view_of(ha), cv = view_of(ca), pv = view_of(pa);
  py::gil_scoped_release no_gil;
  kernels::quantize_delayed(xv, cv, pv, hv, t, red, pol, sc, r.rng(), ex);
}

void quantize_mx(py::handle x, py::handle elem_arg, std::int64_t block, const rounding_args& r,
                 py::handle codes, py::handle scales, int threads, std::uintptr_t stream) {
  const kernels::target t = to_target(elem_arg, "elem");
  const emu::policy pol = r.policy();
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg xa = take(x, "x", stream, {quant_inputs, ""});
  const array_arg ca = take(codes, "codes", stream, {{t.code_dtype()}, ""}, true);
  const array_arg sa = take(scales, "scales", stream, {{dtype::uint8}, ""}, true);
  const kernels::tensor_view xv = view_of(xa), cv = view_of(ca), sv = view_of(sa);
  py::gil_scoped_release no_gil;
  kernels::quantize_mx(xv, cv, sv, t, pol, block, r.rng(), ex);
}

void dequantize_mx(py::handle codes, py::handle scales, py::handle elem_arg, std::int64_t block,
                   py::handle out, int threads, std::uintptr_t stream) {
  const kernels::target t = to_target(elem_arg, "elem");
  const kernels::exec ex = exec_of(threads, stream);
  const array_arg ca = take(codes, "codes", stream,
                            {{t.code_dtype()},
                             std::string("does not hold codes of ") + target_name(t) +
                                 "; expected " + kernels::dtype_name(t.code_dtype())});
  const array_arg sa = take(scales, "scales", stream,
                            {{dtype::uint8}, "does not hold E8M0 scale codes; expected uint8"});
  const array_arg oa = take(out, "out", stream, {{dtype::float32}, ""}, true);
  require_shape(oa, ca.shape, "the shape of codes");
  const kernels::tensor_view cv = view_of(ca), sv = view_of(sa), ov = view_of(oa);
  py::gil_scoped_release no_gil;
  kernels::dequantize_mx(cv, sv, ov, t, block, ex);
}

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
  namespace emu = lowbit::emu;
  using emu::format;

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
  // The array functions below take their results as arguments (`out`, `codes`, `scales`, ...),
  // allocated by the Python layer in the caller's array library; `stream` is the caller's
  // current CUDA stream (0: the default stream; ignored for CPU arrays).
  py::class_<lp::rounding_args>(m, "_Rounding", "The rounding arguments of a converting call.")
      .def(py::init([](std::string rounding, bool saturate, std::string subnormals,
                       std::string nan_sign, std::optional<int> random_bits, std::uint64_t seed,
                       std::uint64_t offset) {
             return lp::rounding_args{std::move(rounding),
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
  m.def("cast", &lp::cast, py::arg("x"), py::arg("fmt"), py::arg("rounding"), py::arg("out"),
        py::arg("threads"), py::arg("stream"));
  m.def("decode", &lp::decode, py::arg("codes"), py::arg("fmt"), py::arg("out"), py::arg("threads"),
        py::arg("stream"));
  m.def(
      "target_info",
      [](py::handle t, const std::string& arg) { return lp::target_info(t, arg.c_str()); },
      py::arg("target"), py::arg("arg") = "target",
      "(name, code dtype, max, is_int) of a quantization target; `arg` names it in errors.");
  m.def("quantize", &lp::quantize, py::arg("x"), py::arg("target"), py::arg("kind"),
        py::arg("tile_rows"), py::arg("tile_cols"), py::arg("margin"), py::arg("pow2"),
        py::arg("transpose"), py::arg("rounding"), py::arg("codes"), py::arg("scales"),
        py::arg("threads"), py::arg("stream"));
  m.def("cast_scaled", &lp::cast_scaled, py::arg("x"), py::arg("scale"), py::arg("target"),
        py::arg("rounding"), py::arg("codes"), py::arg("threads"), py::arg("stream"));
  m.def("dequantize", &lp::dequantize, py::arg("codes"), py::arg("scales"), py::arg("target"),
        py::arg("kind"), py::arg("tile_rows"), py::arg("tile_cols"), py::arg("out"),
        py::arg("threads"), py::arg("stream"));
  m.def("quantize_delayed", &lp::quantize_delayed, py::arg("x"), py::arg("history"),
        py::arg("target"), py::arg("reduce"), py::arg("margin"), py::arg("pow2"),
        py::arg("rounding"), py::arg("codes"), py::arg("scale_pair"), py::arg("threads"),
        py::arg("stream"));
  m.def("quantize_mx", &lp::quantize_mx, py::arg("x"), py::arg("elem"), py::arg("block"),
        py::arg("rounding"), py::arg("codes"), py::arg("scales"), py::arg("threads"),
        py::arg("stream"));
  m.def("dequantize_mx", &lp::dequantize_mx, py::arg("codes"), py::arg("scales"), py::arg("elem"),
        py::arg("block"), py::arg("out"), py::arg("threads"), py::arg("stream"));
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
  lowbit::python::bind_verify(m);
  lowbit::python::bind_blockwise(m);
}
