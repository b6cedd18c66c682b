// GPU test harness: device buffers, views of them, and the comparison "the same host API call on
// CPU views and on CUDA views writes the same bits". GPU tests skip, with a message, where no
// device is present, so the suite passes on CPU-only machines.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <lowbit/kernels/tensor.hpp>

#define LOWBIT_REQUIRE_GPU()                                                                       \
  do {                                                                                             \
    if (!::lowbit::kernels::cuda_available())                                                      \
      GTEST_SKIP() << "no CUDA device (or a build without CUDA): GPU test skipped";                \
  } while (0)

namespace lowbit::gpu_test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Untyped device allocation with host round trips; `pad` extra bytes allow misaligned views.
class device_buffer {
public:
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) {
    cuda_ok(cudaMalloc(&p_, bytes_ == 0 ? 1 : bytes_), "cudaMalloc");
  }
  ~device_buffer() { cudaFree(p_); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  void* get() const { return p_; }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* src, std::size_t n) {
    cuda_ok(cudaMemcpy(p_, src, n, cudaMemcpyHostToDevice), "upload");
  }
  void download(void* dst, std::size_t n) const {
    cuda_ok(cudaDeviceSynchronize(), "sync");
    cuda_ok(cudaMemcpy(dst, p_, n, cudaMemcpyDeviceToHost), "download");
  }
  void fill(int byte) { cuda_ok(cudaMemset(p_, byte, bytes_), "memset"); }

private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

// A host byte buffer and a device copy of it; views of both share shape, strides and offset.
struct mirrored {
  std::vector<unsigned char> host;
  device_buffer dev;
  explicit mirrored(std::size_t bytes, int poison = 0xA5)
      : host(bytes, static_cast<unsigned char>(poison)), dev(bytes) {
    dev.upload(host.data(), bytes);
  }
  void push() { dev.upload(host.data(), host.size()); }
  std::vector<unsigned char> pull() const {
    std::vector<unsigned char> out(host.size());
    dev.download(out.data(), out.size());
    return out;
  }
  // A view of (rows x cols) elements of type t with the given row stride (elements), starting
  // `offset` elements in, on the CPU or the GPU copy.
  kernels::tensor_view view(bool gpu, kernels::dtype t, std::int64_t rows, std::int64_t cols,
                            std::int64_t row_stride, std::int64_t offset = 0) {
    kernels::tensor_view v;
    auto* base = static_cast<unsigned char*>(gpu ? dev.get() : host.data());
    v.data = base + offset * static_cast<std::int64_t>(kernels::dtype_size(t));
    v.type = t;
    v.ndim = 2;
    v.shape = {rows, cols};
    v.strides = {row_stride, 1};
    v.dev = gpu ? kernels::device{kernels::device_type::cuda, 0} : kernels::device{};
    return v;
  }
  kernels::tensor_view flat(bool gpu, kernels::dtype t, std::int64_t n, std::int64_t offset = 0) {
    auto v = view(gpu, t, 1, n, n, offset);
    v.ndim = 1;
    v.shape = {n};
    v.strides = {1};
    return v;
  }
};

// Byte-exact comparison with a readable first difference.
inline ::testing::AssertionResult same_bytes(const std::vector<unsigned char>& cpu,
                                             const std::vector<unsigned char>& gpu,
                                             const std::string& what) {
  if (cpu.size() != gpu.size())
    return ::testing::AssertionFailure() << what << ": sizes differ";
  for (std::size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i] != gpu[i])
      return ::testing::AssertionFailure()
             << what << ": first difference at byte " << i << " (cpu 0x" << std::hex << int(cpu[i])
             << ", gpu 0x" << int(gpu[i]) << ")";
  return ::testing::AssertionSuccess();
}

} // namespace lowbit::gpu_test
