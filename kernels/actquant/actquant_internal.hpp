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

// A checked actquant_layer_norm_backward call: codes [rows, cols] with groups of group_size
// columns; gy and gx of dtype `type`; null weight: 1; null gx, gw, gb: not wanted.
struct ln_backward_problem {
  const std::uint8_t* codes = nullptr;
  const float* alpha = nullptr;
  const float* beta = nullptr;
  std::int64_t rows = 0, cols = 0, group_size = 1;
  dtype type = dtype::float32;
  const void* gy = nullptr;
  const float* weight = nullptr;
  float eps = 0.0f;
  void* gx = nullptr;
  float* gw = nullptr;
  float* gb = nullptr;
  std::int64_t chunks() const {
    return (rows + actquant_ops::ln_chunk_rows - 1) / actquant_ops::ln_chunk_rows;
  }
};

// A checked actquant_activation_backward call: n codes with their grouping; dy, gx and value
// (null: not wanted) of dtype `type`.
struct act_backward_problem {
  const std::uint8_t* codes = nullptr;
  const float* alpha = nullptr;
  const float* beta = nullptr;
  std::int64_t n = 0;
  actquant_ops::group_of group;
  actquant_activation f = actquant_activation::gelu;
  dtype type = dtype::float32;
  const void* dy = nullptr;
  void* gx = nullptr;
  void* value = nullptr;
};

namespace cpu {
void actquant_quantize(const actquant_problem& p, const exec& ex);
void actquant_dequantize(const actquant_problem& p, const exec& ex);
void actquant_layer_norm_backward(const ln_backward_problem& p, const exec& ex);
void actquant_activation_backward(const act_backward_problem& p, const exec& ex);
} // namespace cpu

namespace cuda {
void actquant_quantize(const actquant_problem& p, const exec& ex);
void actquant_dequantize(const actquant_problem& p, const exec& ex);
void actquant_layer_norm_backward(const ln_backward_problem& p, const exec& ex);
void actquant_activation_backward(const act_backward_problem& p, const exec& ex);
} // namespace cuda

} // namespace lowbit::kernels
