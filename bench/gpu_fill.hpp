// Benchmark inputs generated on the device (gpu_fill.cu). Kept free of CUDA and Google Benchmark
// headers so that both the .cu file and the host benchmark files can include it.
#pragma once

#include <cstdint>

namespace lowbit::bench {

// x[i] = sigma * (a standard normal value drawn from Philox stream `seed`, element i), on the
// default stream; returns once the values are written. x: n floats of device memory.
void fill_normal(float* x, std::int64_t n, std::uint64_t seed, float sigma);

} // namespace lowbit::bench
