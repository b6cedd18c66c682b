// The one tensor-view type of lowbit's host APIs: a pointer, a dtype, a shape and strides (in
// elements), and the device that owns the memory. Views never own memory. Python hands numpy
// arrays and DLPack tensors in as views without copies.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <lowbit/emu/dtype.hpp>
#include <lowbit/emu/error.hpp>

namespace lowbit::kernels {

// The storage types (emu/dtype.hpp: the codes of emu's formats have one too).
using emu::dtype;
using emu::dtype_size;

const char* dtype_name(dtype t);

enum class device_type : std::uint8_t { cpu, cuda };

struct device {
  device_type type = device_type::cpu;
  int index = 0;
  friend constexpr bool operator==(const device&, const device&) = default;
};

std::string device_name(const device& d);

inline constexpr int max_dims = 8;

struct tensor_view {
  void* data = nullptr;
  dtype type = dtype::float32;
  int ndim = 0;
  std::array<std::int64_t, max_dims> shape{};
  std::array<std::int64_t, max_dims> strides{}; // in elements, may be negative or zero
  device dev{};

  // A row-major contiguous view.
  static tensor_view contiguous(void* data, dtype t, std::initializer_list<std::int64_t> shape,
                                device d = {});
  static tensor_view contiguous(const void* data, dtype t,
                                std::initializer_list<std::int64_t> shape, device d = {}) {
    return contiguous(const_cast<void*>(data), t, shape, d);
  }

  std::int64_t numel() const;
  bool is_contiguous() const;
  bool same_shape(const tensor_view& o) const;
  std::string shape_string() const;
  template <class T> T* ptr() const { return static_cast<T*>(data); }
};

// Argument checks shared by every host API; each throws lowbit::error naming `arg`.
void require_dtype(const tensor_view& v, const char* arg, std::initializer_list<dtype> allowed);
void require_same_shape(const tensor_view& a, const char* arg_a, const tensor_view& b,
                        const char* arg_b);
void require_same_device(const tensor_view& a, const char* arg_a, const tensor_view& b,
                         const char* arg_b);
void require_contiguous(const tensor_view& v, const char* arg);
void require_valid(const tensor_view& v, const char* arg); // ndim, shape >= 0, data if numel>0

// How a host API runs: CPU threads (0 = all cores) for CPU views, the CUDA stream for device
// views (nullptr = the default stream; passed as an opaque pointer so this header needs no CUDA).
struct exec {
  int threads = 0;
  void* stream = nullptr;
};

// True when this build has CUDA kernels and a device is present.
bool cuda_available();

// Number of CUDA devices this process can use (0 without CUDA kernels or devices).
int cuda_device_count();

} // namespace lowbit::kernels
