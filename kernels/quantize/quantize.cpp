// Host API of the quantization technique: argument checks with precise messages, then the CPU
// twin or the CUDA kernels.
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/quantize.hpp>

#include <algorithm>
#include <string>

#include "../common/device_check.hpp"
#include "quantize_internal.hpp"

namespace lowbit::kernels {

std::int64_t grouping::scale_rows(std::int64_t m) const {
  switch (k) {
  case kind::tensor:
  case kind::columns: return 1;
  case kind::rows:
  case kind::blocks: return m;
  case kind::tiles: return m / tile_rows + (m % tile_rows != 0);
  }
  return 1;
}

std::int64_t grouping::scale_cols(std::int64_t n) const {
  switch (k) {
  case kind::tensor:
  case kind::rows: return 1;
  case kind::columns: return n;
  case kind::blocks:
  case kind::tiles: return n / tile_cols + (n % tile_cols != 0);
  }
  return 1;
}

namespace {

const std::initializer_list<dtype> real_inputs = {dtype::float32, dtype::float16, dtype::bfloat16};

void validate_target(const target& t, const char* arg) {
  if (t.is_int) {
    if (const char* why = emu::check_int_format(t.ifmt))
      throw error(errc::invalid_argument, std::string(arg) + ": " + why);
    require(t.ifmt.bits <= 8, errc::invalid_argument, [&] {
      return std::string(arg) + ": integer format " + emu::int_format_name(t.ifmt) +
             " cannot be a quantization target (integer targets have at most 8 bits, one "
             "code per byte)";
    });
    return;
  }
  if (const char* why = emu::check_format(t.fmt))
    throw error(errc::invalid_argument, std::string(arg) + ": " + why);
  require(t.fmt.fits_float() && t.fmt.bits() <= 16, errc::invalid_argument, [&] {
    return std::string(arg) + ": format " + emu::format_name(t.fmt) +
           " cannot be a quantization target (its values must fit float32 and its codes "
           "16 bits)";
  });
}

void validate_grouping(const grouping& g) {
  require(static_cast<int>(g.k) <= static_cast<int>(grouping::kind::tiles), errc::invalid_argument,
          "grouping: not one of tensor, rows, columns, blocks, tiles");
  if (g.k == grouping::kind::blocks)
    require(g.tile_cols >= 1, errc::invalid_argument, [&] {
      return "grouping: the block length must be >= 1, got " + std::to_string(g.tile_cols);
    });
  if (g.k == grouping::kind::tiles)
    require(g.tile_rows >= 1 && g.tile_cols >= 1, errc::invalid_argument, [&] {
      return "grouping: tile sizes must be >= 1, got (" + std::to_string(g.tile_rows) + ", " +
             std::to_string(g.tile_cols) + ")";
    });
}

// A block or tile that reaches past the matrix is one group of its whole extent. Clamping the
// sizes to the extent changes no group and keeps the kernels' index arithmetic (end = (i + 1) *
// size, ceil(n / size) as (n + size - 1) / size) from overflowing for sizes near 2^63.
std::int64_t clamp_size(std::int64_t size, std::int64_t extent) {
  return std::min(size, std::max<std::int64_t>(extent, 1));
}

grouping clamp_to(grouping g, const matrix_shape& m) {
  if (g.k == grouping::kind::blocks || g.k == grouping::kind::tiles) {
    g.tile_rows = clamp_size(g.tile_rows, m.rows);
    g.tile_cols = clamp_size(g.tile_cols, m.cols);
  }
  return g;
}

void require_numel(const tensor_view& v, const char* arg, std::int64_t n, const char* what) {
  require(v.numel() == n, errc::invalid_argument, [&] {
    return std::string(arg) + ": expected " + std::to_string(n) + " elements (" + what +
           ") but got shape " + v.shape_string();
  });
}

// Common checks of x and codes; returns the matrix readings.
void check_x_codes(const tensor_view& x, const tensor_view& codes, const target& t, bool transpose,
                   matrix_shape& xm, matrix_shape& cm) {
  require_valid(x, "x");
  require_valid(codes, "codes");
  require_dtype(x, "x", real_inputs);
  require_dtype(codes, "codes", {t.code_dtype()});
  require_same_device(x, "x", codes, "codes");
  xm = as_matrix(x, "x");
  cm = as_matrix(codes, "codes");
  if (transpose) {
    require(cm.rows == xm.cols && cm.cols == xm.rows, errc::invalid_argument, [&] {
      return "codes: with transpose, codes must be the " + std::to_string(xm.cols) + " x " +
             std::to_string(xm.rows) + " transpose of x (got shape " + codes.shape_string() + ")";
    });
  } else {
    require_same_shape(x, "x", codes, "codes");
  }
}

// An empty matrix of many rows (shape (2^30, 2^30, 0)) has nothing to read or write in its
// rows: where the scales do not depend on them (one per tensor, or none for MX blocks of empty
// rows), the CPU loops see no rows instead of walking 2^60 empty ones.
void drop_empty_rows(matrix_shape& x, matrix_shape& codes) {
  if (x.cols == 0)
    x.rows = codes.rows = 0;
}

void check_float_vector(const tensor_view& v, const char* arg, const tensor_view& x) {
  require_valid(v, arg);
  require_dtype(v, arg, {dtype::float32});
  require_contiguous(v, arg);
  require_same_device(x, "x", v, arg);
}

} // namespace

void quantize(const tensor_view& x, const tensor_view& codes, const tensor_view& scales,
              const target& t, const grouping& g, const emu::policy& pol, const scaling& sc,
              const emu::random_stream& rng, bool transpose, const exec& ex) {
  validate_target(t, "target");
  validate_grouping(g);
  emu::validate(pol);
  require(sc.margin >= -126 && sc.margin <= 126, errc::invalid_argument,
          "margin: must be an integer in -126..126");
  require(!transpose || g.k == grouping::kind::columns, errc::invalid_argument,
          "transpose: only per-column quantization can write transposed codes");
  quant_problem p;
  check_x_codes(x, codes, t, transpose, p.xm, p.cm);
  check_float_vector(scales, "scales", x);
  require_numel(scales, "scales", g.scale_rows(p.xm.rows) * g.scale_cols(p.xm.cols),
                "one per group");
  p.x = x;
  p.codes = codes;
  p.scales = scales;
  p.t = t;
  p.g = clamp_to(g, p.xm);
  p.pol = pol;
  p.sc = sc;
  p.rng = rng;
  p.transpose = transpose;
  p.target_max = static_cast<float>(t.max_value());
  if (x.dev.type == device_type::cuda) {
    require_device_memory({&x, &codes, &scales}, {"x", "codes", "scales"});
    return cuda::quantize(p, ex);
  }
  if (g.k == grouping::kind::tensor)
    drop_empty_rows(p.xm, p.cm);
  cpu::quantize(p, ex);
}

void cast_scaled(const tensor_view& x, const tensor_view& codes, const tensor_view& scale,
                 const target& t, const emu::policy& pol, const emu::random_stream& rng,
                 const exec& ex) {
  validate_target(t, "target");
  emu::validate(pol);
  quant_problem p;
  check_x_codes(x, codes, t, false, p.xm, p.cm);
  check_float_vector(scale, "scale", x);
  require_numel(scale, "scale", 1, "the quantization multiplier");
  p.x = x;
  p.codes = codes;
  p.t = t;
  p.g = grouping::per_tensor();
  p.pol = pol;
  p.rng = rng;
  p.target_max = static_cast<float>(t.max_value());
  p.src = scale_source::given;
  p.scale_in = scale;
  if (x.dev.type == device_type::cuda) {
    require_device_memory({&x, &codes, &scale}, {"x", "codes", "scale"});
    return cuda::quantize(p, ex);
  }
  drop_empty_rows(p.xm, p.cm);
  cpu::quantize(p, ex);
}

void quantize_delayed(const tensor_view& x, const tensor_view& codes, const tensor_view& scale_pair,
                      const tensor_view& history, const target& t, history_reduce reduce,
                      const emu::policy& pol, const scaling& sc, const emu::random_stream& rng,
                      const exec& ex) {
  validate_target(t, "target");
  emu::validate(pol);
  require(sc.margin >= -126 && sc.margin <= 126, errc::invalid_argument,
          "margin: must be an integer in -126..126");
  quant_problem p;
  check_x_codes(x, codes, t, false, p.xm, p.cm);
  check_float_vector(scale_pair, "scale_pair", x);
  require_numel(scale_pair, "scale_pair", 2, "q and d");
  check_float_vector(history, "history", x);
  require(history.numel() >= 1 && history.numel() <= 4096, errc::invalid_argument,
          "history: the amax history needs 1..4096 entries");
  require(reduce == history_reduce::max || reduce == history_reduce::most_recent,
          errc::invalid_argument, "reduce: not max or most_recent");
  p.x = x;
  p.codes = codes;
  p.scales = scale_pair;
  p.t = t;
  p.g = grouping::per_tensor();
  p.pol = pol;
  p.sc = sc;
  p.rng = rng;
  p.target_max = static_cast<float>(t.max_value());
  p.src = scale_source::history;
  p.scale_in = history;
  p.reduce = reduce;
  if (x.dev.type == device_type::cuda) {
    require_device_memory({&x, &codes, &scale_pair, &history},
                          {"x", "codes", "scale_pair", "history"});
    return cuda::quantize(p, ex);
  }
  drop_empty_rows(p.xm, p.cm);
  cpu::quantize(p, ex);
}

void dequantize(const tensor_view& codes, const tensor_view& scales, const tensor_view& out,
                const target& t, const grouping& g, const exec& ex) {
  validate_target(t, "target");
  validate_grouping(g);
  dequant_problem p;
  require_valid(codes, "codes");
  require_valid(out, "out");
  require_dtype(codes, "codes", {t.code_dtype()});
  require_dtype(out, "out", {dtype::float32});
  require_same_shape(codes, "codes", out, "out");
  require_same_device(codes, "codes", out, "out");
  p.cm = as_matrix(codes, "codes");
  p.om = as_matrix(out, "out");
  check_float_vector(scales, "scales", codes);
  require_numel(scales, "scales", g.scale_rows(p.cm.rows) * g.scale_cols(p.cm.cols),
                "one per group");
  p.codes = codes;
  p.scales = scales;
  p.out = out;
  p.t = t;
  p.g = clamp_to(g, p.cm);
  if (codes.dev.type == device_type::cuda) {
    require_device_memory({&codes, &scales, &out}, {"codes", "scales", "out"});
    return cuda::dequantize(p, ex);
  }
  cpu::dequantize(p, ex);
}

namespace {
// OCP MX v1.0 defines exactly these element formats. Others are refused rather than extended:
// an MX block is 8-bit (or narrower) codes under one E8M0 scale, and a 16-bit element
// (float16, bfloat16) already carries more range than the shared scale adds, so no consumer
// reads such blocks; the kernels store and mask MX codes as single bytes.
bool is_mx_element(const target& t) {
  if (t.is_int)
    return t.ifmt == emu::int8;
  return t.fmt == emu::e4m3fn || t.fmt == emu::e5m2 || t.fmt == emu::e3m2fn ||
         t.fmt == emu::e2m3fn || t.fmt == emu::e2m1fn;
}

void check_mx_target(const target& t, std::int64_t block, const char* fn) {
  if (!is_mx_element(t)) {
    const std::string name = t.is_int ? emu::int_format_name(t.ifmt) : emu::format_name(t.fmt);
    throw error(errc::invalid_argument,
                std::string(fn) + ": element format " + name +
                    " is not an OCP MX element format (e4m3fn, e5m2, e3m2fn, e2m3fn, e2m1fn, "
                    "int8)");
  }
  require(block >= 1, errc::invalid_argument,
          [&] { return "block: must be >= 1 (OCP MX uses 32), got " + std::to_string(block); });
}
} // namespace

void quantize_mx(const tensor_view& x, const tensor_view& codes, const tensor_view& scales,
                 const target& elem, const emu::policy& pol, std::int64_t block,
                 const emu::random_stream& rng, const exec& ex) {
  check_mx_target(elem, block, "quantize_mx");
  emu::validate(pol);
  mx_problem p;
  check_x_codes(x, codes, elem, false, p.xm, p.cm);
  require_valid(scales, "scales");
  require_dtype(scales, "scales", {dtype::uint8});
  require_contiguous(scales, "scales");
  require_same_device(x, "x", scales, "scales");
  require_numel(scales, "scales", p.xm.rows * (p.xm.cols / block + (p.xm.cols % block != 0)),
                "one E8M0 code per block");
  p.x = x;
  p.codes = codes;
  p.scales = scales;
  p.t = elem;
  p.pol = pol;
  p.rng = rng;
  p.block = clamp_size(block, p.xm.cols);
  if (x.dev.type == device_type::cuda) {
    require_device_memory({&x, &codes, &scales}, {"x", "codes", "scales"});
    return cuda::quantize_mx(p, ex);
  }
  drop_empty_rows(p.xm, p.cm);
  cpu::quantize_mx(p, ex);
}

void dequantize_mx(const tensor_view& codes, const tensor_view& scales, const tensor_view& out,
                   const target& elem, std::int64_t block, const exec& ex) {
  check_mx_target(elem, block, "dequantize_mx");
  dequant_problem p;
  require_valid(codes, "codes");
  require_valid(out, "out");
  require_dtype(codes, "codes", {elem.code_dtype()});
  require_dtype(out, "out", {dtype::float32});
  require_same_shape(codes, "codes", out, "out");
  require_same_device(codes, "codes", out, "out");
  p.cm = as_matrix(codes, "codes");
  p.om = as_matrix(out, "out");
  require_valid(scales, "scales");
  require_dtype(scales, "scales", {dtype::uint8});
  require_contiguous(scales, "scales");
  require_same_device(codes, "codes", scales, "scales");
  require_numel(scales, "scales", p.cm.rows * (p.cm.cols / block + (p.cm.cols % block != 0)),
                "one E8M0 code per block");
  p.codes = codes;
  p.scales = scales;
  p.out = out;
  p.t = elem;
  p.block = clamp_size(block, p.cm.cols);
  if (codes.dev.type == device_type::cuda) {
    require_device_memory({&codes, &scales, &out}, {"codes", "scales", "out"});
    return cuda::dequantize_mx(p, ex);
  }
  cpu::dequantize_mx(p, ex);
}

} // namespace lowbit::kernels
