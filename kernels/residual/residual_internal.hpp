// The checked form of a residual split/join call, shared by the host API, the CPU twin and the
// CUDA launcher (everything here has passed validation in residual.cpp).
#pragma once

#include <cstdint>

#include <lowbit/kernels/residual.hpp>

#include "residual_ops.hpp"

namespace lowbit::kernels {

struct residual_problem {
  float* x = nullptr; // split: input; join: output
  std::uint16_t* w = nullptr;
  void* r = nullptr; // int8 or int16
  std::int64_t n = 0;
  residual_ops::weight_kind kind = residual_ops::weight_kind::bf16;
  int bits = 16;
};

namespace cpu {
void residual_split(const residual_problem& p, const exec& ex);
void residual_join(const residual_problem& p, const exec& ex);
} // namespace cpu
namespace cuda {
void residual_split(const residual_problem& p, const exec& ex);
void residual_join(const residual_problem& p, const exec& ex);
} // namespace cuda

} // namespace lowbit::kernels
