#include <lowbit/kernels/tensor.hpp>

#include <cstdint>
#include <string>

namespace lowbit::kernels {

const char* dtype_name(dtype t) {
  switch (t) {
  case dtype::float32: return "float32";
  case dtype::float64: return "float64";
  case dtype::float16: return "float16";
  case dtype::bfloat16: return "bfloat16";
  case dtype::uint8: return "uint8";
  case dtype::int8: return "int8";
  case dtype::uint16: return "uint16";
  case dtype::int16: return "int16";
  case dtype::uint32: return "uint32";
  case dtype::int32: return "int32";
  case dtype::int64: return "int64";
  }
  return "?";
}

std::string device_name(const device& d) {
  return d.type == device_type::cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

tensor_view tensor_view::contiguous(void* data, dtype t, std::initializer_list<std::int64_t> shape,
                                    device d) {
  tensor_view v;
  v.data = data;
  v.type = t;
  v.dev = d;
  require(shape.size() <= static_cast<std::size_t>(max_dims), errc::invalid_argument,
          "tensors have at most 8 dimensions");
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (auto s : shape)
    v.shape[i++] = s;
  std::int64_t stride = 1;
  for (int k = v.ndim - 1; k >= 0; --k) {
    v.strides[k] = stride;
    if (__builtin_mul_overflow(stride, v.shape[k], &stride)) // refused by require_valid
      stride = INT64_MAX;
  }
  return v;
}

std::int64_t tensor_view::numel() const {
  // Saturating at INT64_MAX (no count fits a view that require_valid lets through, and no
  // overflow is undefined here): an empty extent anywhere still gives 0.
  std::int64_t n = 1;
  bool over = false;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] == 0)
      return 0;
    over = over || __builtin_mul_overflow(n, shape[i], &n);
  }
  return over ? INT64_MAX : n;
}

bool tensor_view::is_contiguous() const {
  if (numel() == 0) // no element to address: any strides describe it (as in PyTorch)
    return true;
  std::int64_t stride = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    if (shape[k] != 1 && strides[k] != stride)
      return false;
    if (__builtin_mul_overflow(stride, shape[k], &stride))
      return k == 0; // only the outermost extent may carry the product past 64 bits
  }
  return true;
}

bool tensor_view::same_shape(const tensor_view& o) const {
  if (ndim != o.ndim)
    return false;
  for (int i = 0; i < ndim; ++i)
    if (shape[i] != o.shape[i])
      return false;
  return true;
}

std::string tensor_view::shape_string() const {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (ndim == 1 ? ",)" : ")");
}

void require_dtype(const tensor_view& v, const char* arg, std::initializer_list<dtype> allowed) {
  for (dtype t : allowed)
    if (v.type == t)
      return;
  std::string names;
  for (dtype t : allowed)
    names += std::string(names.empty() ? "" : ", ") + dtype_name(t);
  throw error(errc::invalid_type, std::string(arg) + ": dtype " + dtype_name(v.type) +
                                      " is not supported here; expected one of " + names);
}

void require_same_shape(const tensor_view& a, const char* arg_a, const tensor_view& b,
                        const char* arg_b) {
  require(a.same_shape(b), errc::invalid_argument, [&] {
    return std::string(arg_a) + " has shape " + a.shape_string() + " but " + arg_b + " has shape " +
           b.shape_string() + "; they must match";
  });
}

void require_same_device(const tensor_view& a, const char* arg_a, const tensor_view& b,
                         const char* arg_b) {
  require(a.dev == b.dev, errc::invalid_argument, [&] {
    return std::string(arg_a) + " is on " + device_name(a.dev) + " but " + arg_b + " is on " +
           device_name(b.dev);
  });
}

void require_contiguous(const tensor_view& v, const char* arg) {
  require(v.is_contiguous(), errc::invalid_argument,
          [&] { return std::string(arg) + " must be contiguous (row-major) here"; });
}

void require_valid(const tensor_view& v, const char* arg) {
  require(v.ndim >= 0 && v.ndim <= max_dims, errc::invalid_argument,
          [&] { return std::string(arg) + ": at most 8 dimensions"; });
  require(v.dev.type == device_type::cpu || v.dev.type == device_type::cuda, errc::invalid_argument,
          [&] { return std::string(arg) + ": not a CPU or CUDA view"; });
  for (int i = 0; i < v.ndim; ++i)
    require(v.shape[i] >= 0, errc::invalid_argument,
            [&] { return std::string(arg) + ": negative extent in shape " + v.shape_string(); });
  bool empty = false;
  for (int i = 0; i < v.ndim; ++i)
    empty = empty || v.shape[i] == 0;
  if (!empty) {
    // The element count and the bytes the elements span must fit 64 bits: beyond, numel()
    // and the kernels' offsets would wrap around (a shape of 3 x 2^62 read as no element).
    std::int64_t n = 1, reach = 0, step = 0;
    bool fits = true;
    for (int i = 0; i < v.ndim && fits; ++i) {
      const std::int64_t st = v.strides[i];
      fits = !__builtin_mul_overflow(n, v.shape[i], &n) && st != INT64_MIN &&
             !__builtin_mul_overflow(v.shape[i] - 1, st < 0 ? -st : st, &step) &&
             !__builtin_add_overflow(reach, step, &reach);
    }
    std::int64_t bytes = 0;
    fits = fits && !__builtin_mul_overflow(reach + 1, static_cast<std::int64_t>(dtype_size(v.type)),
                                           &bytes);
    require(fits, errc::invalid_argument, [&] {
      return std::string(arg) + ": shape " + v.shape_string() +
             " (with its strides) spans more elements or bytes than 64 bits count";
    });
  }
  require(v.data != nullptr || v.numel() == 0, errc::invalid_argument,
          [&] { return std::string(arg) + ": null data pointer for a non-empty tensor"; });
}

} // namespace lowbit::kernels
