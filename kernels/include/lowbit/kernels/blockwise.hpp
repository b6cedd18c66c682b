// Block-wise codebook quantization and SRAM-quantiles (Dettmers et al., "8-bit Optimizers via
// Block-wise Quantization", ICLR 2022). A tensor is read flat and cut into blocks of 64..4096
// elements; each block is normalized by its absolute maximum and every element becomes the index
// of a codebook entry (256 sorted float32 values in [-1, 1]): the nearest one, or one of the two
// neighbours by stochastic rounding. The absmax values may themselves be quantized (nested).
// SRAM-quantiles estimate quantiles of a tensor from sorted chunks of 4096 values, for quantile
// codebooks. CPU twin and CUDA kernels agree bit for bit; equations, tie rule and NaN/zero rules
// are in docs/techniques/blockwise.md and docs/techniques/sram-quantiles.md.
#pragma once

#include <array>
#include <cstdint>

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

inline constexpr int codebook_size = 256;

// 256 finite float32 values, ascending (equal neighbours allowed), all in [-1, 1].
class codebook {
public:
  // The dynamic tree map of the 8-bit optimizers paper: per decade 10^-d (d = 6..0) a linear
  // fraction grid that doubles in size toward 1, plus 0 and 1. Signed: 127 positive values,
  // their negatives, 0 and +1 (no -1). Unsigned: 254 positive values, 0 and +1. The bits are
  // those of the implementation that published the map, which computes it step by step in
  // float32 with PyTorch (docs/techniques/blockwise.md): at most 2 ulps from the exact values
  // rounded once, and equal to proptests/data/dynamic_map_published.txt, which PyTorch reproduces.
  static codebook dynamic_tree(bool is_signed = true);
  // 256 evenly spaced values: (2k - 255) / 255 (signed, no 0) or k / 255 (unsigned).
  static codebook linear(bool is_signed = true);
  // Every distinct finite value of a format of at most 8 bits (+-0 counted once), divided by the
  // largest magnitude (float32 division), padded with zeros to 256 entries and sorted.
  static codebook from_format(const emu::format& f);
  // A quantile map: the k <= 255 given (finite) quantiles plus 0, divided by their largest
  // magnitude (float32 division), padded with zeros to 256 entries and sorted.
  static codebook from_quantiles(const float* q, std::int64_t k);
  // User values, validated: exactly 256 finite values in [-1, 1], ascending; throws
  // lowbit::error naming the first offending index otherwise.
  static codebook from_values(const float* v, std::int64_t n);

  const std::array<float, codebook_size>& values() const { return v_; }
  float operator[](int i) const { return v_[static_cast<std::size_t>(i)]; }
  friend bool operator==(const codebook&, const codebook&) = default;

private:
  std::array<float, codebook_size> v_{};
};

enum class codebook_rounding : std::uint8_t { nearest, stochastic };

// The block lengths of the technique: 64, 128, 256, 512, 1024, 2048, 4096.
bool is_blockwise_block(std::int64_t block);
// Number of blocks of a flat tensor of n elements: ceil(n / block).
inline std::int64_t blockwise_blocks(std::int64_t n, std::int64_t block) {
  return (n + block - 1) / block;
}

struct blockwise_config {
  std::int64_t block = 2048;
  codebook_rounding rounding = codebook_rounding::nearest;
  emu::random_stream rng{}; // stochastic rounding: element i draws rng.bits(i)
};

// codes[i] = index into cb of x[i] / absmax[b] (b = i / block), absmax[b] = max |x| over block b.
// x: float32, float16 or bfloat16, contiguous; codes: uint8 with as many elements; absmax:
// float32, contiguous, blockwise_blocks(n, block) elements. Any shapes; read flat.
void quantize_blockwise(const tensor_view& x, const tensor_view& codes, const tensor_view& absmax,
                        const codebook& cb, const blockwise_config& cfg = {}, const exec& ex = {});

// out[i] = cb[codes[i]] * absmax[i / block] (float32 out, contiguous).
void dequantize_blockwise(const tensor_view& codes, const tensor_view& absmax,
                          const tensor_view& out, const codebook& cb, std::int64_t block,
                          const exec& ex = {});

// Nested (double) quantization of the absmax values: the float32 absmax of every block is itself
// quantized block-wise, in blocks of nested_block, with codebook cb2 (nearest entry):
// absmax_codes (uint8, one per block) and absmax2 (float32, one per nested block).
inline constexpr std::int64_t nested_block = 256;
struct nested_absmax {
  tensor_view codes;  // uint8 [blockwise_blocks(n, block)]
  tensor_view absmax; // float32 [blockwise_blocks(that, nested_block)]
  codebook cb = codebook::dynamic_tree(false);
};

// Elements are quantized against their block's exact absmax; only the stored absmax is nested.
void quantize_blockwise_nested(const tensor_view& x, const tensor_view& codes,
                               const nested_absmax& nested, const codebook& cb,
                               const blockwise_config& cfg = {}, const exec& ex = {});
// out[i] = cb[codes[i]] * a[b], a[b] = cb2[absmax_codes[b]] * absmax2[b / nested_block].
void dequantize_blockwise_nested(const tensor_view& codes, const nested_absmax& nested,
                                 const tensor_view& out, const codebook& cb, std::int64_t block,
                                 const exec& ex = {});

// SRAM-quantiles: k = out.numel() (1..4096, 256 usual) quantile estimates of x (float32,
// float16 or bfloat16, contiguous, at least one element) into out (float32, contiguous, same
// device). x is cut into chunks of quantile_chunk elements (the last may be shorter); each chunk
// is sorted and gives its quantiles s[floor((2i + 1) m / (2k))] (m its length); estimate i is
// the average of the chunk quantiles weighted by m, summed in double in a fixed two-level order:
// the products m_c * Q_i(c) (exact) summed in chunk order within each group of quantile_group
// consecutive chunks, then the group sums added in group order, then divided by n (so that the
// GPU can sum the groups in parallel and still equal the CPU twin bit for bit).
inline constexpr std::int64_t quantile_chunk = 4096;
inline constexpr std::int64_t quantile_group = 256;
void estimate_quantiles(const tensor_view& x, const tensor_view& out, const exec& ex = {});

} // namespace lowbit::kernels
