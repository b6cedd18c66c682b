// The checked form of a block-wise call, shared by the host API, the CPU twin and the CUDA
// launchers. Everything here has passed validation in blockwise.cpp.
#pragma once

#include <memory>

#include <lowbit/kernels/blockwise.hpp>

#include "blockwise_ops.hpp"

namespace lowbit::kernels {

struct blockwise_problem {
  tensor_view x, codes, absmax; // absmax: float32 per block (plain), or unused (nested)
  std::int64_t n = 0, block = 2048, blocks = 0;
  blockwise_ops::tables tb;
  std::uint32_t zero_code = 0;
  bool stochastic = false;
  emu::random_stream rng;
  bool nested = false;
  tensor_view codes2, absmax2; // nested: uint8 per block, float32 per nested block
  blockwise_ops::tables tb2;
  std::uint32_t zero_code2 = 0;
};

struct blockwise_dequant_problem {
  tensor_view codes, absmax, out;
  std::int64_t n = 0, block = 2048, blocks = 0;
  float value[256];
  bool nested = false;
  tensor_view codes2, absmax2;
  float value2[256];
};

struct quantile_problem {
  tensor_view x, out;
  std::int64_t n = 0, k = 256, chunks = 0;
};

namespace cpu {
// The bucket table of a codebook (blockwise_ops::bucket_entry of every bucket) for the CPU twins'
// nearest-entry search: built on first use (a fraction of a millisecond) and kept for the 16
// codebooks used last.
std::shared_ptr<const std::uint32_t[]> bucket_table(const blockwise_ops::tables& tb);

void quantize_blockwise(const blockwise_problem& p, const exec& ex);
void dequantize_blockwise(const blockwise_dequant_problem& p, const exec& ex);
void estimate_quantiles(const quantile_problem& p, const exec& ex);
} // namespace cpu

namespace cuda {
void quantize_blockwise(const blockwise_problem& p, const exec& ex);
void dequantize_blockwise(const blockwise_dequant_problem& p, const exec& ex);
void estimate_quantiles(const quantile_problem& p, const exec& ex);
} // namespace cuda

} // namespace lowbit::kernels
