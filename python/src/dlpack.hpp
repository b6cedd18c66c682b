// The DLPack exchange ABI (https://dmlc.github.io/dlpack/latest/, versions 0.x and 1.x) as far
// as lowbit consumes it, and an owner of one imported tensor. The structs are declared here from
// the published C ABI rather than taken from a dlpack.h, so that the module has no extra build
// dependency; their layout is fixed by the standard and checked by the static_asserts below.
//
// The Python protocol: a producer's __dlpack__() returns a capsule named "dltensor" (a
// DLManagedTensor) or "dltensor_versioned" (a DLManagedTensorVersioned, DLPack >= 1.0). The
// consumer renames the capsule to "used_dltensor" / "used_dltensor_versioned" as it takes the
// tensor, and from then on owns it: it calls the tensor's deleter exactly once when done (the
// capsule's own destructor then leaves the tensor alone).
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace lowbit::python::dlpack {

enum device_type : std::int32_t {
  cpu = 1,
  cuda = 2,
  cuda_host = 3, // page-locked host memory: CPU-addressable
  opencl = 4,
  vulkan = 7,
  metal = 8,
  vpi = 9,
  rocm = 10,
  rocm_host = 11,
  ext_dev = 12,
  cuda_managed = 13,
  oneapi = 14,
  webgpu = 15,
  hexagon = 16,
  maia = 17,
};

inline const char* device_type_name(std::int32_t t) {
  switch (t) {
  case cpu: return "CPU";
  case cuda: return "CUDA";
  case cuda_host: return "CUDAHost";
  case opencl: return "OpenCL";
  case vulkan: return "Vulkan";
  case metal: return "Metal";
  case vpi: return "VPI";
  case rocm: return "ROCm";
  case rocm_host: return "ROCmHost";
  case ext_dev: return "ExtDev";
  case cuda_managed: return "CUDAManaged";
  case oneapi: return "OneAPI";
  case webgpu: return "WebGPU";
  case hexagon: return "Hexagon";
  case maia: return "MAIA";
  }
  return "unknown";
}

enum type_code : std::uint8_t {
  int_code = 0,
  uint_code = 1,
  float_code = 2,
  opaque_handle_code = 3,
  bfloat_code = 4,
  complex_code = 5,
  bool_code = 6,
};

struct device {
  std::int32_t device_type;
  std::int32_t device_id;
};

struct data_type {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct tensor {
  void* data;
  device dev;
  std::int32_t ndim;
  data_type dtype;
  std::int64_t* shape;
  std::int64_t* strides; // in elements; NULL means row-major compact
  std::uint64_t byte_offset;
};

struct managed_tensor {
  tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(managed_tensor* self);
};

struct version {
  std::uint32_t major;
  std::uint32_t minor;
};

struct managed_tensor_versioned {
  version ver;
  void* manager_ctx;
  void (*deleter)(managed_tensor_versioned* self);
  std::uint64_t flags;
  tensor dl_tensor;
};

inline constexpr std::uint64_t flag_read_only = 1u << 0;
inline constexpr std::uint32_t supported_major = 1;

static_assert(sizeof(device) == 8 && sizeof(data_type) == 4);
static_assert(sizeof(tensor) == 48 && offsetof(tensor, shape) == 24);
static_assert(sizeof(managed_tensor) == 64);
static_assert(offsetof(managed_tensor_versioned, flags) == 24 &&
              offsetof(managed_tensor_versioned, dl_tensor) == 32);

inline constexpr const char* capsule_legacy = "dltensor";
inline constexpr const char* capsule_versioned = "dltensor_versioned";
inline constexpr const char* capsule_legacy_used = "used_dltensor";
inline constexpr const char* capsule_versioned_used = "used_dltensor_versioned";

// One tensor taken from a capsule: owns it until destruction, when it calls the deleter. The
// destructor must run with the GIL held (deleters of Python producers touch reference counts).
class owned_tensor {
public:
  owned_tensor() = default;
  owned_tensor(managed_tensor* legacy) : legacy_(legacy) {}
  owned_tensor(managed_tensor_versioned* versioned) : versioned_(versioned) {}
  owned_tensor(const owned_tensor&) = delete;
  owned_tensor& operator=(const owned_tensor&) = delete;
  owned_tensor(owned_tensor&& o) noexcept
      : legacy_(std::exchange(o.legacy_, nullptr)),
        versioned_(std::exchange(o.versioned_, nullptr)) {}
  owned_tensor& operator=(owned_tensor&& o) noexcept {
    if (this != &o) {
      release();
      legacy_ = std::exchange(o.legacy_, nullptr);
      versioned_ = std::exchange(o.versioned_, nullptr);
    }
    return *this;
  }
  ~owned_tensor() { release(); }

  explicit operator bool() const { return legacy_ != nullptr || versioned_ != nullptr; }
  bool versioned() const { return versioned_ != nullptr; }
  version ver() const { return versioned_ ? versioned_->ver : version{0, 0}; }
  bool read_only() const { return versioned_ && (versioned_->flags & flag_read_only) != 0; }
  // Only valid when the major version is supported (see ver()).
  const tensor& get() const { return versioned_ ? versioned_->dl_tensor : legacy_->dl_tensor; }

  void release() {
    if (legacy_) {
      managed_tensor* t = std::exchange(legacy_, nullptr);
      if (t->deleter)
        t->deleter(t);
    }
    if (versioned_) {
      managed_tensor_versioned* t = std::exchange(versioned_, nullptr);
      if (t->deleter)
        t->deleter(t);
    }
  }

private:
  managed_tensor* legacy_ = nullptr;
  managed_tensor_versioned* versioned_ = nullptr;
};

// Takes the tensor out of a capsule returned by __dlpack__(): checks the name, renames the
// capsule to its "used_" name and returns the owner. Returns an empty owner and sets no Python
// error when the object is not an unused DLPack capsule (the caller reports it).
inline owned_tensor take_capsule(PyObject* capsule) {
  if (!PyCapsule_CheckExact(capsule))
    return {};
  if (PyCapsule_IsValid(capsule, capsule_versioned)) {
    auto* t =
        static_cast<managed_tensor_versioned*>(PyCapsule_GetPointer(capsule, capsule_versioned));
    if (t == nullptr || PyCapsule_SetName(capsule, capsule_versioned_used) != 0) {
      PyErr_Clear();
      return {};
    }
    return owned_tensor(t);
  }
  if (PyCapsule_IsValid(capsule, capsule_legacy)) {
    auto* t = static_cast<managed_tensor*>(PyCapsule_GetPointer(capsule, capsule_legacy));
    if (t == nullptr || PyCapsule_SetName(capsule, capsule_legacy_used) != 0) {
      PyErr_Clear();
      return {};
    }
    return owned_tensor(t);
  }
  return {};
}

} // namespace lowbit::python::dlpack
