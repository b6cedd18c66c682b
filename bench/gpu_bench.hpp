// Shared by the source files of lowbit_bench_gpu: CUDA-event timing as Google Benchmark manual
// time, the GB/s counter, and `of_copy`, a result's bandwidth (bytes read + written once) as a
// fraction of the device-to-device copy bandwidth measured in the same process.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include <lowbit/kernels/tensor.hpp>

#include "gpu_fill.hpp"

namespace lowbit::bench {

inline void ok(cudaError_t e) {
  if (e != cudaSuccess)
    throw std::runtime_error(cudaGetErrorString(e));
}

// Copy bandwidth in bytes (read + written) per second: set by the copy benchmark (copy_d2d_f32),
// or by ensure_copy_bandwidth when a filter left that benchmark out; 0 until then.
inline double copy_bytes_per_s = 0.0;

// Measures a device-to-device copy of `bytes` bytes (src -> dst, both device memory) unless the
// copy bandwidth is known already, so that of_copy never compares against another process.
inline void ensure_copy_bandwidth(void* dst, const void* src, std::size_t bytes) {
  if (copy_bytes_per_s > 0)
    return;
  constexpr int reps = 10;
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a));
  ok(cudaEventCreate(&b));
  ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); // warm-up
  ok(cudaEventRecord(a));
  for (int r = 0; r < reps; ++r)
    ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  ok(cudaEventRecord(b));
  ok(cudaEventSynchronize(b));
  float ms = 0;
  ok(cudaEventElapsedTime(&ms, a, b));
  if (ms > 0)
    copy_bytes_per_s = 2.0 * static_cast<double>(bytes) * reps / (ms / 1e3);
  ok(cudaEventDestroy(a));
  ok(cudaEventDestroy(b));
}

inline kernels::tensor_view dev_view(void* p, kernels::dtype t,
                                     std::initializer_list<std::int64_t> shape) {
  return kernels::tensor_view::contiguous(p, t, shape, {kernels::device_type::cuda, 0});
}

// Times fn with events on the default stream as the benchmark's manual time (after one warm-up
// call); returns the mean milliseconds per call (0 without iterations).
inline double timed_ms(benchmark::State& state, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a));
  ok(cudaEventCreate(&b));
  fn(); // warm-up
  ok(cudaDeviceSynchronize());
  double total_ms = 0;
  for (auto _ : state) {
    ok(cudaEventRecord(a));
    fn();
    ok(cudaEventRecord(b));
    ok(cudaEventSynchronize(b));
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b));
    total_ms += ms;
    state.SetIterationTime(ms / 1e3);
  }
  ok(cudaEventDestroy(a));
  ok(cudaEventDestroy(b));
  return state.iterations() > 0 ? total_ms / state.iterations() : 0.0;
}

// timed_ms with `bytes` moved per call, reported as GB/s.
inline void timed(benchmark::State& state, double bytes, const std::function<void()>& fn) {
  timed_ms(state, fn);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * state.iterations()));
  state.counters["GB/s"] =
      benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// of_copy = (bytes / time) / copy bandwidth, both from this run.
inline void add_ratio(benchmark::State& state, double bytes) {
  if (copy_bytes_per_s > 0)
    state.counters["of_copy"] = benchmark::Counter(bytes * state.iterations() / copy_bytes_per_s,
                                                   benchmark::Counter::kIsRate);
}

// Every GPU benchmark: manual (event) time in milliseconds, at least 0.3 s of measurements.
template <class Fn> void register_gpu(const std::string& name, Fn fn) {
  benchmark::RegisterBenchmark(name.c_str(), fn)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.3);
}

// Registered after quantize_gpu.cpp's benchmarks, so after copy_d2d_f32 (blockwise_gpu.cpp).
void register_blockwise();

} // namespace lowbit::bench
