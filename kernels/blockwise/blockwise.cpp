// Host API of block-wise codebook quantization and SRAM-quantiles: codebook construction and
// validation, argument checks with precise messages, then the CPU twin or the CUDA kernels.
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/blockwise.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../common/device_check.hpp"
#include "blockwise_internal.hpp"

namespace lowbit::kernels {

namespace {

// n / d correctly rounded to float32 (d > 0, 2^-90 < |n / d| < 2): the quotient in double is a
// candidate within one float ulp; the nearest float (ties to even) among it and its neighbours
// is chosen by exact integer comparison, so no double rounding can creep in.
float ratio_to_float(std::int64_t n, std::int64_t d) {
  if (n == 0)
    return 0.0f;
  const float c = static_cast<float>(static_cast<double>(n) / static_cast<double>(d));
  // |n/d - g| compared exactly: g = m * 2^e, so d * |n - d g| ~ |n * 2^-e - d * m| * 2^e.
  const auto err = [&](float g) {
    int e = 0;
    const double fr = std::frexp(static_cast<double>(g), &e); // g = fr * 2^e, 0.5 <= |fr| < 1
    const auto m = static_cast<__int128>(std::ldexp(fr, 24)); // g = m * 2^(e - 24)
    const int sh = 24 - e;                                    // 2^-(e-24)
    const __int128 lhs = static_cast<__int128>(n) << sh;
    const __int128 diff = lhs - static_cast<__int128>(d) * m;
    return diff < 0 ? -diff : diff;
  };
  float best = c;
  __int128 best_err = err(c);
  for (float g : {std::nextafter(c, -2.0f), std::nextafter(c, 2.0f)}) {
    if (g == 0.0f)
      continue;
    const __int128 e = err(g);
    const bool even = (emu::detail::bit_cast<std::uint32_t>(g) & 1u) == 0;
    if (e < best_err || (e == best_err && even)) {
      best = g;
      best_err = e;
    }
  }
  return best;
}

codebook sorted_padded(std::vector<float> v) {
  require(v.size() <= 256, errc::invalid_argument,
          "codebook construction produced too many values");
  while (v.size() < 256)
    v.push_back(0.0f);
  std::sort(v.begin(), v.end());
  for (auto& x : v)
    if (x == 0.0f)
      x = 0.0f; // -0 -> +0
  return codebook::from_values(v.data(), 256);
}

// torch.linspace(0.1, 1, n) in float32 as PyTorch computes it on the CPU (the first n/2 points
// from the start, the rest back from the end), the multiply-add of each point fused, as in its
// kernels built for AVX2 and AVX-512 (and its CUDA kernel): measurements in
// docs/techniques/blockwise.md. The ends are double scalars rounded to float32.
std::vector<float> published_linspace(std::int64_t n) {
  const float start = static_cast<float>(0.1);
  const float end = static_cast<float>(1.0);
  const float step = (end - start) / static_cast<float>(n - 1);
  std::vector<float> b(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k)
    b[static_cast<std::size_t>(k)] = k < n / 2
                                         ? std::fma(step, static_cast<float>(k), start)
                                         : std::fma(-step, static_cast<float>(n - 1 - k), end);
  return b;
}

} // namespace

codebook codebook::dynamic_tree(bool is_signed) {
  // The published construction, one float32 operation per step (docs/techniques/blockwise.md):
  // decade i = 0..6 (scale 10^(i-6)) holds the midpoints of 2^i + 1 (signed) or 2^(i+1) + 1
  // (unsigned) linspace boundaries on [0.1, 1], times the scale. Besides the fused linspace, each
  // step is a single rounded operation: this file is built with -ffp-contract=off, and no step
  // is a product feeding a sum, so nothing can be fused behind this code's back.
  static constexpr double scales[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> v;
  for (int i = 0; i < 7; ++i) {
    const std::int64_t n = (std::int64_t{1} << (is_signed ? i : i + 1)) + 1;
    const std::vector<float> b = published_linspace(n);
    const float scale = static_cast<float>(scales[i]); // a Python float rounded to float32
    for (std::size_t k = 0; k + 1 < b.size(); ++k) {
      const float sum = b[k] + b[k + 1];
      const float mid = sum / 2.0f;
      const float x = scale * mid;
      v.push_back(x);
      if (is_signed)
        v.push_back(-x); // (-scale) * mid rounds to exactly -x
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  return sorted_padded(std::move(v));
}

codebook codebook::linear(bool is_signed) {
  std::vector<float> v;
  for (std::int64_t k = 0; k < 256; ++k)
    v.push_back(is_signed ? ratio_to_float(2 * k - 255, 255) : ratio_to_float(k, 255));
  return from_values(v.data(), 256);
}

codebook codebook::from_format(const emu::format& f) {
  if (const char* why = emu::check_format(f))
    throw error(errc::invalid_argument, std::string("codebook::from_format: ") + why);
  require(f.bits() <= 8 && f.fits_float(), errc::invalid_argument, [&] {
    return "codebook::from_format: format " + emu::format_name(f) +
           " has more than 256 codes or values outside float32; use a format of at most 8 "
           "bits";
  });
  std::vector<float> v;
  for (std::uint32_t c = 0; c < (1u << f.bits()); ++c) {
    const float x = emu::decode<float>(f, c);
    if (std::isfinite(x))
      v.push_back(x == 0.0f ? 0.0f : x);
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  float m = 0.0f;
  for (float x : v)
    m = std::max(m, std::fabs(x));
  require(m > 0.0f, errc::invalid_argument, [&] {
    return "codebook::from_format: format " + emu::format_name(f) + " has no nonzero value";
  });
  for (auto& x : v)
    x = x / m;
  v.erase(std::unique(v.begin(), v.end()), v.end()); // tiny values may meet at 0 after division
  return sorted_padded(std::move(v));
}

codebook codebook::from_quantiles(const float* q, std::int64_t k) {
  require(k >= 1 && k <= 255, errc::invalid_argument, [&] {
    return "codebook::from_quantiles: expected 1..255 quantiles (one entry is kept for 0), got " +
           std::to_string(k);
  });
  require(q != nullptr, errc::invalid_argument, "codebook::from_quantiles: null pointer");
  std::vector<float> v(q, q + k);
  float m = 0.0f;
  for (std::int64_t i = 0; i < k; ++i) {
    require(std::isfinite(v[static_cast<std::size_t>(i)]), errc::invalid_argument, [&] {
      return "codebook::from_quantiles: quantile " + std::to_string(i) + " is not finite";
    });
    m = std::max(m, std::fabs(v[static_cast<std::size_t>(i)]));
  }
  require(m > 0.0f, errc::invalid_argument,
          "codebook::from_quantiles: every quantile is 0; the map would be all zeros");
  for (auto& x : v)
    x = x / m;
  v.push_back(0.0f);
  return sorted_padded(std::move(v));
}

codebook codebook::from_values(const float* v, std::int64_t n) {
  require(n == 256, errc::invalid_argument,
          [&] { return "codebook: expected exactly 256 values, got " + std::to_string(n); });
  require(v != nullptr, errc::invalid_argument, "codebook: null pointer");
  codebook cb;
  for (int i = 0; i < 256; ++i) {
    const float x = v[i];
    require(std::isfinite(x), errc::invalid_argument,
            [&] { return "codebook: entry " + std::to_string(i) + " is not finite"; });
    require(x >= -1.0f && x <= 1.0f, errc::invalid_argument, [&] {
      return "codebook: entry " + std::to_string(i) + " (" + std::to_string(x) +
             ") lies outside [-1, 1]";
    });
    // (An if, not require(): the message reads v[i - 1], which does not exist for i == 0.)
    if (i > 0 && !(v[i - 1] <= x))
      throw error(errc::invalid_argument, "codebook: entries must be ascending, but entry " +
                                              std::to_string(i) + " (" + std::to_string(x) +
                                              ") is below entry " + std::to_string(i - 1) + " (" +
                                              std::to_string(v[i - 1]) + ")");
    cb.v_[static_cast<std::size_t>(i)] = x;
  }
  return cb;
}

bool is_blockwise_block(std::int64_t block) {
  for (std::int64_t b = 64; b <= 4096; b *= 2)
    if (block == b)
      return true;
  return false;
}

namespace {

const std::initializer_list<dtype> real_inputs = {dtype::float32, dtype::float16, dtype::bfloat16};

void check_block(std::int64_t block) {
  require(is_blockwise_block(block), errc::invalid_argument, [&] {
    return "block: must be one of 64, 128, 256, 512, 1024, 2048, 4096 (got " +
           std::to_string(block) + ")";
  });
}

void check_flat(const tensor_view& v, const char* arg, std::initializer_list<dtype> types) {
  require_valid(v, arg);
  require_dtype(v, arg, types);
  require_contiguous(v, arg);
}

void require_numel(const tensor_view& v, const char* arg, std::int64_t n, const char* what) {
  require(v.numel() == n, errc::invalid_argument, [&] {
    return std::string(arg) + ": expected " + std::to_string(n) + " elements (" + what +
           ") but got shape " + v.shape_string();
  });
}

void prepare(const codebook& cb, blockwise_ops::tables& tb, std::uint32_t& zero_code) {
  blockwise_ops::prepare(cb.values().data(), tb);
  zero_code = blockwise_ops::nearest_index(tb.sum_hi, tb.sum_lo, 0.0f);
}

void check_nested(const nested_absmax& nested, std::int64_t blocks, const tensor_view& x) {
  check_flat(nested.codes, "nested.codes", {dtype::uint8});
  check_flat(nested.absmax, "nested.absmax", {dtype::float32});
  require_same_device(x, "codes", nested.codes, "nested.codes");
  require_same_device(x, "codes", nested.absmax, "nested.absmax");
  require_numel(nested.codes, "nested.codes", blocks, "one code per block");
  require_numel(nested.absmax, "nested.absmax", blockwise_blocks(blocks, nested_block),
                "one absmax per 256 blocks");
}

void quantize_impl(const tensor_view& x, const tensor_view& codes, const tensor_view* absmax,
                   const nested_absmax* nested, const codebook& cb, const blockwise_config& cfg,
                   const exec& ex) {
  check_block(cfg.block);
  check_flat(x, "x", real_inputs);
  check_flat(codes, "codes", {dtype::uint8});
  require_same_device(x, "x", codes, "codes");
  require_numel(codes, "codes", x.numel(), "one per element of x");
  blockwise_problem p;
  p.x = x;
  p.codes = codes;
  p.n = x.numel();
  p.block = cfg.block;
  p.blocks = blockwise_blocks(p.n, cfg.block);
  prepare(cb, p.tb, p.zero_code);
  require(cfg.rounding == codebook_rounding::nearest ||
              cfg.rounding == codebook_rounding::stochastic,
          errc::invalid_argument, "config.rounding: not nearest or stochastic");
  p.stochastic = cfg.rounding == codebook_rounding::stochastic;
  p.rng = cfg.rng;
  if (absmax != nullptr) {
    check_flat(*absmax, "absmax", {dtype::float32});
    require_same_device(x, "x", *absmax, "absmax");
    require_numel(*absmax, "absmax", p.blocks, "one per block");
    p.absmax = *absmax;
  } else {
    check_nested(*nested, p.blocks, x);
    p.nested = true;
    p.codes2 = nested->codes;
    p.absmax2 = nested->absmax;
    prepare(nested->cb, p.tb2, p.zero_code2);
  }
  if (x.dev.type == device_type::cuda) {
    if (absmax != nullptr)
      require_device_memory({&x, &codes, absmax}, {"x", "codes", "absmax"});
    else
      require_device_memory({&x, &codes, &nested->codes, &nested->absmax},
                            {"x", "codes", "nested.codes", "nested.absmax"});
    return cuda::quantize_blockwise(p, ex);
  }
  cpu::quantize_blockwise(p, ex);
}

void dequantize_impl(const tensor_view& codes, const tensor_view* absmax,
                     const nested_absmax* nested, const tensor_view& out, const codebook& cb,
                     std::int64_t block, const exec& ex) {
  check_block(block);
  check_flat(codes, "codes", {dtype::uint8});
  check_flat(out, "out", {dtype::float32});
  require_same_device(codes, "codes", out, "out");
  require_numel(out, "out", codes.numel(), "one per code");
  blockwise_dequant_problem p;
  p.codes = codes;
  p.out = out;
  p.n = codes.numel();
  p.block = block;
  p.blocks = blockwise_blocks(p.n, block);
  std::copy(cb.values().begin(), cb.values().end(), p.value);
  if (absmax != nullptr) {
    check_flat(*absmax, "absmax", {dtype::float32});
    require_same_device(codes, "codes", *absmax, "absmax");
    require_numel(*absmax, "absmax", p.blocks, "one per block");
    p.absmax = *absmax;
  } else {
    check_nested(*nested, p.blocks, codes);
    p.nested = true;
    p.codes2 = nested->codes;
    p.absmax2 = nested->absmax;
    std::copy(nested->cb.values().begin(), nested->cb.values().end(), p.value2);
  }
  if (codes.dev.type == device_type::cuda) {
    if (absmax != nullptr)
      require_device_memory({&codes, absmax, &out}, {"codes", "absmax", "out"});
    else
      require_device_memory({&codes, &nested->codes, &nested->absmax, &out},
                            {"codes", "nested.codes", "nested.absmax", "out"});
    return cuda::dequantize_blockwise(p, ex);
  }
  cpu::dequantize_blockwise(p, ex);
}

} // namespace

void quantize_blockwise(const tensor_view& x, const tensor_view& codes, const tensor_view& absmax,
                        const codebook& cb, const blockwise_config& cfg, const exec& ex) {
  quantize_impl(x, codes, &absmax, nullptr, cb, cfg, ex);
}

void dequantize_blockwise(const tensor_view& codes, const tensor_view& absmax,
                          const tensor_view& out, const codebook& cb, std::int64_t block,
                          const exec& ex) {
  dequantize_impl(codes, &absmax, nullptr, out, cb, block, ex);
}

void quantize_blockwise_nested(const tensor_view& x, const tensor_view& codes,
                               const nested_absmax& nested, const codebook& cb,
                               const blockwise_config& cfg, const exec& ex) {
  quantize_impl(x, codes, nullptr, &nested, cb, cfg, ex);
}

void dequantize_blockwise_nested(const tensor_view& codes, const nested_absmax& nested,
                                 const tensor_view& out, const codebook& cb, std::int64_t block,
                                 const exec& ex) {
  dequantize_impl(codes, nullptr, &nested, out, cb, block, ex);
}

void estimate_quantiles(const tensor_view& x, const tensor_view& out, const exec& ex) {
  check_flat(x, "x", real_inputs);
  check_flat(out, "out", {dtype::float32});
  require_same_device(x, "x", out, "out");
  require(x.numel() >= 1, errc::invalid_argument, "x: quantiles of an empty tensor are undefined");
  require(out.numel() >= 1 && out.numel() <= quantile_chunk, errc::invalid_argument, [&] {
    return "out: the number of quantiles (out.numel() = " + std::to_string(out.numel()) +
           ") must be in 1..4096";
  });
  quantile_problem p;
  p.x = x;
  p.out = out;
  p.n = x.numel();
  p.k = out.numel();
  p.chunks = (p.n + quantile_chunk - 1) / quantile_chunk;
  if (x.dev.type == device_type::cuda) {
    require_device_memory({&x, &out}, {"x", "out"});
    return cuda::estimate_quantiles(p, ex);
  }
  cpu::estimate_quantiles(p, ex);
}

} // namespace lowbit::kernels
