// The checked form of an activation-quantization call, shared by the host API, the CPU twin and
// the CUDA launchers. Everything here has passed validation in actquant.cpp.
#pragma once

#include <lowbit/kernels/actquant.hpp>

#include "actquant_ops.hpp"

namespace lowbit::kernels {

struct actquant_problem {
  tensor_view x;     // quantize, update: the input
  tensor_view codes; // quantize: output; dequantize: input (data null: no codes)
  tensor_view out;   // dequantize: output
  float* alpha = nullptr;
  float* beta = nullptr;
  std::int64_t n = 0;
  actquant_ops::group_of group;
  emu::policy pol;
  emu::random_stream rng;
  bool quantize = false; // write codes
  bool update = false;   // update the estimates first
  bool lagged = false;   // quantize with the estimates as they are, then update them
  float momentum = 0.9f;
};

namespace cpu {
void actquant_quantize(const actquant_problem& p, const exec& ex);
void actquant_dequantize(const actquant_problem& p, const exec& ex);
} // namespace cpu

namespace cuda {
void actquant_quantize(const actquant_problem& p, const exec& ex);
void actquant_dequantize(const actquant_problem& p, const exec& ex);
} // namespace cuda

} // namespace lowbit::kernels
