// Scaled quantization at every granularity: per tensor (current and delayed scaling), per row,
// per column fused with a transpose, 1-D blocks along rows, 2-D tiles, and OCP MX blocks with
// E8M0 scales. Each runs as a CPU twin and a CUDA kernel that agree bit for bit; the equations
// and the NaN/zero rules are in docs/techniques/quantization.md.
//
// Tensors are read as matrices (matrix.hpp): leading dimensions form the rows, the last dimension
// the columns; rows may be strided, elements in a row are contiguous.
#pragma once

#include <cstdint>

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/emu/target.hpp>
#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

// What an element becomes: a code of a floating-point format (that fits float) or an integer
// (emu/target.hpp; kept under this name for the callers of the kernels).
using target = emu::target;

// How a group's scale follows from its absolute maximum `amax`:
//   q = max_value / amax / 2^margin, rounded down to a power of two when pow2;
//   code = encode(x * q); the dequantization factor stored per group is d = 1 / q.
// amax == 0 gives q = d = 1; a NaN or Inf anywhere in the group gives q = d = NaN.
struct scaling {
  int margin = 0;
  bool pow2 = false;
};

// The set of elements that share one scale, on the matrix reading of an (M x N) input.
struct grouping {
  enum class kind : std::uint8_t { tensor, rows, columns, blocks, tiles };
  kind k = kind::tensor;
  std::int64_t tile_rows = 1; // tiles
  std::int64_t tile_cols = 1; // tiles, and the block length of `blocks`

  static grouping per_tensor() { return {kind::tensor, 1, 1}; }
  static grouping per_row() { return {kind::rows, 1, 1}; }
  static grouping per_column() { return {kind::columns, 1, 1}; }
  static grouping blocks(std::int64_t k) { return {kind::blocks, 1, k}; }
  static grouping tiles(std::int64_t r, std::int64_t c) { return {kind::tiles, r, c}; }

  // Number of scale rows and columns for an (M x N) input: tensor (1, 1), rows (M, 1),
  // columns (1, N), blocks (M, ceil(N/k)), tiles (ceil(M/r), ceil(N/c)).
  std::int64_t scale_rows(std::int64_t m) const;
  std::int64_t scale_cols(std::int64_t n) const;
};

// codes = encode(x * q[g]) and scales[g] = d[g] for every group g (float32 scales, contiguous,
// scale_rows x scale_cols elements in any shape). x: float32, float16 or bfloat16. With
// `transpose` (columns only) codes is the N x M transpose and scales has N elements: codes of
// x^T with one scale per row, which dequantize() reads as per-row groups.
void quantize(const tensor_view& x, const tensor_view& codes, const tensor_view& scales,
              const target& t, const grouping& g, const emu::policy& pol, const scaling& sc = {},
              const emu::random_stream& rng = {}, bool transpose = false, const exec& ex = {});

// codes = encode(x * scale[0]) with a given scale (one float32 element, same device as x).
void cast_scaled(const tensor_view& x, const tensor_view& codes, const tensor_view& scale,
                 const target& t, const emu::policy& pol, const emu::random_stream& rng = {},
                 const exec& ex = {});

// out = decode(codes) * scales[g] (float32 out).
void dequantize(const tensor_view& codes, const tensor_view& scales, const tensor_view& out,
                const target& t, const grouping& g, const exec& ex = {});

// Delayed scaling (per tensor): the scale comes from the amax history of earlier steps, then
// this tensor's amax is pushed into the history. history: float32 [H], history[0] the newest.
// scale_pair: float32 [2] receives {q, d} used for this call.
enum class history_reduce : std::uint8_t { max, most_recent };
void quantize_delayed(const tensor_view& x, const tensor_view& codes, const tensor_view& scale_pair,
                      const tensor_view& history, const target& t, history_reduce reduce,
                      const emu::policy& pol, const scaling& sc = {},
                      const emu::random_stream& rng = {}, const exec& ex = {});

// OCP MX v1.0: blocks of `block` (32) consecutive elements along rows share the scale
// X = 2^(floor(log2(amax)) - emax_elem), stored as an E8M0 code (uint8, M x ceil(N/block));
// elements are encode(x / X) (exact division by a power of two). Element targets: e4m3fn, e5m2
// (MXFP8), e3m2fn, e2m3fn (MXFP6), e2m1fn (MXFP4), int8 (MXINT8: value = int8 * 2^-6); every
// other target (float16, bfloat16, the fnuz formats, int8_sym, ...) is refused.
void quantize_mx(const tensor_view& x, const tensor_view& codes, const tensor_view& scales,
                 const target& elem, const emu::policy& pol, std::int64_t block = 32,
                 const emu::random_stream& rng = {}, const exec& ex = {});
void dequantize_mx(const tensor_view& codes, const tensor_view& scales, const tensor_view& out,
                   const target& elem, std::int64_t block = 32, const exec& ex = {});

} // namespace lowbit::kernels
