// The array intake of lowbit._core (declared in arrays.hpp): numpy arrays through the buffer
// protocol, DLPack producers through their capsules, resolved into the kernels' tensor views
// without copies, every error naming the Python argument.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <lowbit/emu/error.hpp>
#include <lowbit/kernels/tensor.hpp>

#include "arrays.hpp"
#include "dlpack.hpp"

namespace lowbit::python {

[[noreturn]] void fail(errc code, const std::string& what) {
  throw error(code, what);
}

std::string type_name(py::handle h) {
  return py::str(py::type::of(h).attr("__name__"));
}
std::string str_of(py::handle h) {
  return py::str(h);
}

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
  // DLPack 1.1's narrow float types (codes 7 to 17), by their names: torch exports its float8
  // tensors so.
  static const char* const narrow[] = {"float8_e3m4",     "float8_e4m3",     "float8_e4m3b11fnuz",
                                       "float8_e4m3fn",   "float8_e4m3fnuz", "float8_e5m2",
                                       "float8_e5m2fnuz", "float8_e8m0fnu",  "float6_e2m3fn",
                                       "float6_e3m2fn",   "float4_e2m1fn"};
  std::string s;
  if (t.code < 7) {
    s = names[t.code] + std::to_string(t.bits);
  } else if (t.code <= 17) {
    s = narrow[t.code - 7];
  } else {
    s = "code" + std::to_string(t.code) + "_" + std::to_string(t.bits);
  }
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

// torch.Tensor and nn.Parameter themselves (subclasses, fake and distributed tensors among them,
// export through DLPack): the type is recognised by its name the first time and by its address
// after that.
bool is_torch_tensor(py::handle obj) {
  static PyTypeObject* known[2] = {nullptr, nullptr};
  PyTypeObject* t = Py_TYPE(obj.ptr());
  if (t == known[0] || t == known[1])
    return true;
  const std::string name = t->tp_name;
  const int slot = name == "Tensor" ? 0 : (name == "Parameter" ? 1 : -1);
  if (slot < 0 || known[slot] != nullptr)
    return false;
  const py::object mod =
      py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(t)).attr("__module__");
  const std::string m = py::str(mod);
  if ((slot == 0 && m != "torch") || (slot == 1 && m != "torch.nn.parameter"))
    return false;
  known[slot] = t;
  return true;
}

// A torch dtype (a singleton object) to lowbit's, and its name without "torch." (as DLPack's
// errors name dtypes), by its name the first time.
std::optional<dtype> torch_dtype(py::handle dt, std::string& name) {
  struct seen_dtype {
    PyObject* obj;
    std::optional<dtype> type;
    std::string name;
  };
  static std::vector<seen_dtype> seen;
  for (const seen_dtype& d : seen)
    if (d.obj == dt.ptr()) {
      name = d.name;
      return d.type;
    }
  name = py::str(dt);
  if (name.rfind("torch.", 0) == 0)
    name = name.substr(6);
  static const std::pair<const char*, dtype> names[] = {
      {"float32", dtype::float32},   {"float64", dtype::float64}, {"float16", dtype::float16},
      {"bfloat16", dtype::bfloat16}, {"uint8", dtype::uint8},     {"uint16", dtype::uint16},
      {"uint32", dtype::uint32},     {"int8", dtype::int8},       {"int16", dtype::int16},
      {"int32", dtype::int32},       {"int64", dtype::int64}};
  std::optional<dtype> t;
  for (const auto& [n, d] : names)
    if (name == n)
      t = d;
  seen.push_back({py::reinterpret_borrow<py::object>(dt).release().ptr(), t, name});
  return t;
}

// A torch tensor read through its own attributes, without a DLPack exchange (which costs about
// 20 microseconds a tensor on CUDA, a visible share of a layer's host time). The stream needs no
// ordering: every caller of the module passes torch's current stream for torch tensors (the
// Python layer's interop and lowbit.nn), and DLPack would order nothing on it either. Returns
// false, taking nothing, where DLPack must decide (tensors that need a gradient, negative views,
// devices other than CPU and CUDA, dtypes outside the table), so that errors stay DLPack's.
//
// The attribute names are interned Python strings made once (and never freed: the module may be
// called until the interpreter ends), so that no lookup builds a string from a C one.
struct tensor_attributes {
  py::handle requires_grad = PyUnicode_InternFromString("requires_grad");
  py::handle is_neg = PyUnicode_InternFromString("is_neg");
  py::handle is_cuda = PyUnicode_InternFromString("is_cuda");
  py::handle is_cpu = PyUnicode_InternFromString("is_cpu");
  py::handle dtype = PyUnicode_InternFromString("dtype");
  py::handle get_device = PyUnicode_InternFromString("get_device");
  py::handle shape = PyUnicode_InternFromString("shape");
  py::handle stride = PyUnicode_InternFromString("stride");
  py::handle data_ptr = PyUnicode_InternFromString("data_ptr");
};
const tensor_attributes& attribute_names() {
  static const tensor_attributes* names = new tensor_attributes;
  return *names;
}

bool take_torch(array_arg& a, py::handle obj, const dtype_rule& rule) {
  const tensor_attributes& at = attribute_names();
  if (obj.attr(at.requires_grad).cast<bool>() || obj.attr(at.is_neg)().cast<bool>())
    return false;
  const bool cuda = obj.attr(at.is_cuda).cast<bool>();
  if (!cuda && !obj.attr(at.is_cpu).cast<bool>())
    return false;
  std::string dt_name;
  const std::optional<dtype> t = torch_dtype(obj.attr(at.dtype), dt_name);
  if (!t)
    return false;
  rule.check(a.name, t, dt_name);
  a.dev = cuda ? dlpack_device(a.name, dlpack::cuda, obj.attr(at.get_device)().cast<std::int32_t>())
               : kernels::device{kernels::device_type::cpu, 0};
  a.type = *t;
  const py::tuple shape = obj.attr(at.shape);
  const py::tuple strides = obj.attr(at.stride)();
  a.shape.resize(shape.size());
  a.strides.resize(shape.size());
  for (std::size_t k = 0; k < shape.size(); ++k) {
    a.shape[k] = shape[k].cast<std::int64_t>();
    a.strides[k] = a.shape[k] <= 1 ? 0 : strides[k].cast<std::int64_t>();
  }
  a.data = reinterpret_cast<void*>(obj.attr(at.data_ptr)().cast<std::uintptr_t>());
  a.owner = py::reinterpret_borrow<py::object>(obj);
  finish(a, static_cast<std::int64_t>(kernels::dtype_size(a.type)));
  return true;
}

} // namespace

array_arg take(py::handle obj, const char* name, std::uintptr_t stream, const dtype_rule& rule,
               bool writable) {
  array_arg a;
  a.name = name;
  if (py::isinstance<py::array>(obj))
    take_numpy(a, py::reinterpret_borrow<py::array>(obj), rule, writable);
  else if (is_torch_tensor(obj) && take_torch(a, obj, rule))
    return a;
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

int check_threads(std::int64_t threads) {
  if (threads < 0 || threads > std::numeric_limits<int>::max())
    fail(errc::invalid_argument,
         "threads: expected 0 (all cores) or a positive count, got " + std::to_string(threads));
  return static_cast<int>(threads);
}

kernels::exec exec_of(std::int64_t threads, std::uintptr_t stream) {
  return kernels::exec{check_threads(threads), reinterpret_cast<void*>(stream)};
}

py::object result_array(py::handle out, const py::function& empty,
                        const std::vector<std::int64_t>& shape, dtype type) {
  if (!out.is_none())
    return py::reinterpret_borrow<py::object>(out);
  py::tuple dims(shape.size());
  for (std::size_t k = 0; k < shape.size(); ++k)
    dims[k] = py::int_(shape[k]);
  return empty(dims, kernels::dtype_name(type));
}

std::int64_t ceil_div(std::int64_t n, std::int64_t k) {
  if (k < 1)
    k = 1;
  return n / k + (n % k != 0 ? 1 : 0);
}

void rethrow_renamed(const error& e, std::initializer_list<rename> renames) {
  std::string what = e.what();
  // The second argument of kernels' require_same_shape ("a has shape (..) but b has shape (..)").
  for (const rename& r : renames) {
    const std::string second = std::string(" but ") + r.cpp + " has shape ";
    if (const std::size_t at = what.find(second); at != std::string::npos)
      what.replace(at + 5, std::strlen(r.cpp), r.py);
  }
  for (const rename& r : renames) {
    const std::size_t len = std::strlen(r.cpp);
    if (what.compare(0, len, r.cpp) == 0 && what.size() > len &&
        (what[len] == ':' || what[len] == ' '))
      throw error(e.code(), r.py + what.substr(len));
  }
  throw error(e.code(), what);
}
} // namespace lowbit::python
