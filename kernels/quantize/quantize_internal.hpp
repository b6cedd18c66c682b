// The checked form of a quantization call, shared by the host API, the CPU twin and the CUDA
// launchers. Everything here has passed validation in quantize.cpp.
#pragma once

#include <lowbit/kernels/quantize.hpp>

#include "../common/matrix.hpp"

namespace lowbit::kernels {

enum class scale_source : std::uint8_t {
  amax,    // from each group's amax (quantize)
  given,   // q = scale_in[0] for the whole tensor (cast_scaled)
  history, // from the amax history (quantize_delayed); scales receives {q, d}
};

struct quant_problem {
  tensor_view x, codes, scales;
  matrix_shape xm, cm; // cm is N x M when transposed
  target t;
  grouping g;
  emu::policy pol;
  scaling sc;
  emu::random_stream rng;
  bool transpose = false;
  float target_max = 0.0f;
  scale_source src = scale_source::amax;
  tensor_view scale_in; // given: [q]; history: the amax history
  history_reduce reduce = history_reduce::max;
};

struct dequant_problem {
  tensor_view codes, scales, out;
  matrix_shape cm, om;
  target t;
  grouping g;
  std::int64_t block = 32; // MX
};

struct mx_problem {
  tensor_view x, codes, scales;
  matrix_shape xm, cm;
  target t;
  emu::policy pol;
  emu::random_stream rng;
  std::int64_t block = 32;
};

// Group index of element (r, c) for an (M x N) input, row-major over the scale grid.
struct group_index {
  grouping::kind k;
  std::int64_t tr, tc, scale_cols;
  LOWBIT_HD std::int64_t operator()(std::int64_t r, std::int64_t c) const {
    switch (k) {
    case grouping::kind::tensor: return 0;
    case grouping::kind::rows: return r;
    case grouping::kind::columns: return c;
    case grouping::kind::blocks: return r * scale_cols + c / tc;
    case grouping::kind::tiles: return (r / tr) * scale_cols + c / tc;
    }
    return 0;
  }
};

inline group_index make_group_index(const grouping& g, std::int64_t n) {
  return group_index{g.k, g.tile_rows, g.tile_cols, g.scale_cols(n)};
}

namespace cpu {
void quantize(const quant_problem& p, const exec& ex);
void dequantize(const dequant_problem& p, const exec& ex);
void quantize_mx(const mx_problem& p, const exec& ex);
void dequantize_mx(const dequant_problem& p, const exec& ex);
} // namespace cpu

namespace cuda {
void quantize(const quant_problem& p, const exec& ex);
void dequantize(const dequant_problem& p, const exec& ex);
void quantize_mx(const mx_problem& p, const exec& ex);
void dequantize_mx(const dequant_problem& p, const exec& ex);
} // namespace cuda

} // namespace lowbit::kernels
