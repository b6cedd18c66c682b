// GPU kernel == CPU twin, bit for bit, for every cast and quantization entry point: random
// shapes (empty, odd, larger than a block), strided rows, misaligned pointers, every policy, and
// data with outliers, NaN, Inf, zero rows, subnormals and values on rounding boundaries. Output
// buffers (with their padding) start poisoned identically, so a stray or missing write differs.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/quantize.hpp>

#include "gpu_harness.hpp"

namespace {

using namespace lowbit;
using gpu_test::mirrored;
using gpu_test::same_bytes;
using kernels::dtype;

// ---- generated parameters ----------------------------------------------------------------------

rc::Gen<emu::policy> any_policy() {
  return rc::gen::exec([] {
    emu::policy p;
    p.round = *rc::gen::elementOf(
        std::vector<emu::rounding>(std::begin(emu::all_roundings), std::end(emu::all_roundings)));
    p.over = *rc::gen::element(emu::overflow::saturate, emu::overflow::nonsaturating);
    p.sub = *rc::gen::element(emu::subnormals::keep, emu::subnormals::flush);
    p.nan = *rc::gen::element(emu::nan_sign::preserve, emu::nan_sign::positive);
    p.random_bits = p.round == emu::rounding::stochastic ? *rc::gen::inRange(1, 33) : 0;
    return p;
  });
}

struct shape2 {
  std::int64_t rows, cols, pad, offset;
};

rc::Gen<shape2> any_shape() {
  return rc::gen::exec([] {
    const int kind = *rc::gen::inRange(0, 10);
    shape2 s{};
    if (kind == 0) { // empty
      s.rows = *rc::gen::inRange(0, 3);
      s.cols = s.rows == 0 ? *rc::gen::inRange(0, 9) : 0;
    } else if (kind == 1) { // long rows
      s.rows = *rc::gen::inRange(1, 4);
      s.cols = *rc::gen::inRange(2000, 9000);
    } else {
      s.rows = *rc::gen::inRange(1, 80);
      s.cols = *rc::gen::inRange(1, 700);
    }
    s.pad = *rc::gen::element<std::int64_t>(0, 0, 1, 3, 8);
    s.offset = *rc::gen::element<std::int64_t>(0, 0, 0, 1, 3);
    return s;
  });
}

// Fills n floats with a mix of the cases that break quantizers.
std::vector<float> awkward_values(std::size_t n, std::int64_t cols, std::uint64_t seed,
                                  const emu::format& near) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(n);
  const float row_scale = std::ldexp(1.0f, static_cast<int>(g() % 40) - 20);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = pick(g);
    float x = gauss(g) * row_scale;
    if (k < 10) { // a value of the target format, or a midpoint between two
      const std::uint32_t c = static_cast<std::uint32_t>(g()) & near.mag_mask();
      const double a = emu::decode<double>(near, c), b = emu::decode<double>(near, c + 1);
      x = static_cast<float>((k & 1) && std::isfinite(b) ? (a + b) / 2 : a);
      if (g() & 1)
        x = -x;
    } else if (k < 12) { // a quiet NaN of either sign with a random payload
      const std::uint32_t bits =
          ((g() & 1) ? 0xFFC00000u : 0x7FC00000u) | (static_cast<std::uint32_t>(g()) & 0x3FFFFFu);
      std::memcpy(&x, &bits, 4);
    } else if (k < 14) {
      x = (g() & 1) ? std::numeric_limits<float>::infinity()
                    : -std::numeric_limits<float>::infinity();
    } else if (k < 17) {
      x = (g() & 1) ? 0.0f : -0.0f;
    } else if (k < 19) {
      x = std::ldexp(static_cast<float>(g() % 1000), -140); // float subnormals
    } else if (k < 21) {
      x *= 1e4f; // outliers
    }
    v[i] = x;
  }
  // Whole rows of zeros, and rows free of NaN/Inf, so that groups see every amax case.
  if (cols > 0)
    for (std::size_t r = 0; r * static_cast<std::size_t>(cols) < n; ++r) {
      const int k = pick(g);
      for (std::size_t c = 0; c < static_cast<std::size_t>(cols) && r * cols + c < n; ++c) {
        float& x = v[r * cols + c];
        if (k < 15)
          x = 0.0f;
        else if (k < 60 && !std::isfinite(x))
          x = 1.0f;
      }
    }
  return v;
}

// Writes `values` (rows x cols, dense) into a mirrored buffer as dtype t with the given stride.
void store_input(mirrored& m, dtype t, const shape2& s, const std::vector<float>& values) {
  const std::int64_t rs = s.cols + s.pad;
  for (std::int64_t r = 0; r < s.rows; ++r)
    for (std::int64_t c = 0; c < s.cols; ++c) {
      const float x = values[static_cast<std::size_t>(r * s.cols + c)];
      const std::size_t at = static_cast<std::size_t>(s.offset + r * rs + c);
      if (t == dtype::float32) {
        std::memcpy(m.host.data() + at * 4, &x, 4);
      } else {
        const emu::format f = t == dtype::float16 ? emu::float16 : emu::bfloat16;
        const auto h = static_cast<std::uint16_t>(emu::encode(f, x, emu::rne));
        std::memcpy(m.host.data() + at * 2, &h, 2);
      }
    }
  m.push();
}

// Half of the time, rows of whole groups of k without padding or offset (kept nonempty): one
// contiguous run of groups, which the GPU takes through its flat kernel when k is a power of two.
shape2 whole_groups(shape2 s, std::int64_t k) {
  if (s.rows == 0 || s.cols == 0 || *rc::gen::arbitrary<bool>())
    return s;
  s.cols = (s.cols + k - 1) / k * k;
  if (s.rows * s.cols > 200000)
    s.rows = std::max<std::int64_t>(1, 200000 / s.cols);
  s.pad = 0;
  s.offset = 0;
  return s;
}

std::size_t buffer_elems(const shape2& s) {
  return static_cast<std::size_t>(s.offset + s.rows * (s.cols + s.pad) + 8);
}

kernels::target any_target() {
  return *rc::gen::element(kernels::target::of(emu::e4m3fn), kernels::target::of(emu::e5m2),
                           kernels::target::of(emu::e4m3fnuz), kernels::target::of(emu::e3m2fn),
                           kernels::target::of(emu::e2m3fn), kernels::target::of(emu::e2m1fn),
                           kernels::target::of(emu::float16), kernels::target::of(emu::bfloat16),
                           kernels::target::of(emu::int8_sym), kernels::target::of(emu::int8),
                           kernels::target::of(emu::uint8), kernels::target::of(emu::int4_sym));
}

emu::format near_format(const kernels::target& t) {
  return t.is_int ? emu::e4m3fn : t.fmt;
}

// ---- cast / decode -----------------------------------------------------------------------------

TEST(gpu_vs_cpu, cast_and_decode) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.cast_and_decode", [] {
    std::vector<emu::format> formats;
    for (const auto& f : emu::named_formats)
      formats.push_back(f.fmt);
    formats.push_back(emu::format{5, 3, 10, emu::specials::ieee});
    formats.push_back(emu::format{4, 4, 7, emu::specials::fn, false});
    const emu::format fmt = *rc::gen::elementOf(formats);
    const emu::policy pol = *any_policy();
    const dtype in_t =
        *rc::gen::element(dtype::float32, dtype::float16, dtype::bfloat16, dtype::float64);
    const shape2 s = *any_shape();
    const auto values = awkward_values(static_cast<std::size_t>(s.rows * s.cols), s.cols,
                                       *rc::gen::arbitrary<std::uint64_t>(),
                                       fmt.bits() <= 16 && fmt.fits_float() ? fmt : emu::e4m3fn);
    const std::size_t in_size = kernels::dtype_size(in_t);
    mirrored in(buffer_elems(s) * in_size);
    if (in_t == dtype::float64) {
      for (std::int64_t r = 0; r < s.rows; ++r)
        for (std::int64_t c = 0; c < s.cols; ++c) {
          const double x = values[static_cast<std::size_t>(r * s.cols + c)];
          std::memcpy(in.host.data() + (s.offset + r * (s.cols + s.pad) + c) * 8, &x, 8);
        }
      in.push();
    } else {
      store_input(in, in_t, s, values);
    }
    const dtype code_t = kernels::code_dtype(fmt);
    const std::size_t code_size = kernels::dtype_size(code_t);
    mirrored codes(buffer_elems(s) * code_size);
    const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(),
                                 *rc::gen::inRange<std::uint64_t>(0, 5)};
    for (bool gpu : {false, true})
      kernels::cast(in.view(gpu, in_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                    codes.view(gpu, code_t, s.rows, s.cols, s.cols + s.pad, s.offset), fmt, pol,
                    rng);
    RC_ASSERT(same_bytes(codes.host, codes.pull(), "cast codes " + emu::format_name(fmt)));

    // decode the GPU's codes back on both sides
    codes.host = codes.pull();
    codes.push();
    const dtype out_t =
        fmt.fits_float() && (*rc::gen::arbitrary<bool>()) ? dtype::float32 : dtype::float64;
    mirrored out(buffer_elems(s) * kernels::dtype_size(out_t));
    for (bool gpu : {false, true})
      kernels::decode(codes.view(gpu, code_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                      out.view(gpu, out_t, s.rows, s.cols, s.cols + s.pad, s.offset), fmt);
    RC_ASSERT(same_bytes(out.host, out.pull(), "decoded values " + emu::format_name(fmt)));
  }));
}

// ---- quantize ----------------------------------------------------------------------------------

kernels::grouping any_grouping() {
  const int k = *rc::gen::inRange(0, 5);
  switch (k) {
  case 0: return kernels::grouping::per_tensor();
  case 1: return kernels::grouping::per_row();
  case 2: return kernels::grouping::per_column();
  case 3:
    return kernels::grouping::blocks(
        *rc::gen::element<std::int64_t>(1, 3, 8, 16, 32, 64, 100, 128, 256, 257, 1024));
  default: {
    const std::vector<std::pair<std::int64_t, std::int64_t>> tiles = {
        {1, 1}, {2, 3}, {16, 16}, {128, 128}, {7, 300}, {1, 64}};
    const auto t = *rc::gen::elementOf(tiles);
    return kernels::grouping::tiles(t.first, t.second);
  }
  }
}

TEST(gpu_vs_cpu, quantize_every_grouping) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.quantize_every_grouping", [] {
    const kernels::target t = any_target();
    const kernels::grouping g = any_grouping();
    const bool transpose = g.k == kernels::grouping::kind::columns && *rc::gen::arbitrary<bool>();
    const emu::policy pol = *any_policy();
    kernels::scaling sc;
    sc.margin = *rc::gen::inRange(-2, 4);
    sc.pow2 = *rc::gen::arbitrary<bool>();
    const dtype in_t = *rc::gen::element(dtype::float32, dtype::float16, dtype::bfloat16);
    shape2 s = *any_shape();
    if (g.k == kernels::grouping::kind::blocks)
      s = whole_groups(s, g.tile_cols);
    if (g.k == kernels::grouping::kind::rows)
      s = whole_groups(s, std::int64_t{1} << *rc::gen::inRange(2, 13));
    mirrored in(buffer_elems(s) * kernels::dtype_size(in_t));
    store_input(in, in_t, s,
                awkward_values(static_cast<std::size_t>(s.rows * s.cols), s.cols,
                               *rc::gen::arbitrary<std::uint64_t>(), near_format(t)));
    const dtype code_t = t.code_dtype();
    // codes: same layout as x, or the N x M transpose with its own padding
    const std::int64_t crows = transpose ? s.cols : s.rows, ccols = transpose ? s.rows : s.cols;
    const shape2 cs{crows, ccols, s.pad, s.offset};
    mirrored codes(buffer_elems(cs) * kernels::dtype_size(code_t));
    const std::int64_t nscales = g.scale_rows(s.rows) * g.scale_cols(s.cols);
    mirrored scales(static_cast<std::size_t>(nscales + 1) * 4);
    const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(), 7};
    for (bool gpu : {false, true})
      kernels::quantize(in.view(gpu, in_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                        codes.view(gpu, code_t, crows, ccols, ccols + s.pad, s.offset),
                        scales.flat(gpu, dtype::float32, nscales), t, g, pol, sc, rng, transpose);
    RC_ASSERT(same_bytes(codes.host, codes.pull(), "quantize codes"));
    RC_ASSERT(same_bytes(scales.host, scales.pull(), "quantize scales"));

    // dequantize what the GPU produced, on both sides; transposed codes are per-row groups of x^T
    codes.host = codes.pull();
    codes.push();
    scales.host = scales.pull();
    scales.push();
    const kernels::grouping dg = transpose ? kernels::grouping::per_row() : g;
    mirrored out(buffer_elems(cs) * 4);
    for (bool gpu : {false, true})
      kernels::dequantize(codes.view(gpu, code_t, crows, ccols, ccols + s.pad, s.offset),
                          scales.flat(gpu, dtype::float32, nscales),
                          out.view(gpu, dtype::float32, crows, ccols, ccols + s.pad, s.offset), t,
                          dg);
    RC_ASSERT(same_bytes(out.host, out.pull(), "dequantized values"));
  }));
}

// Row segments of the segment kernel (group_pass.cuh) for 16-bit and float32 inputs: rows and
// blocks longer than 4096 (up to the 8192 / 16384 of its eight chunks per thread, and past them,
// one block per group), lengths that are not multiples of 4 (element loads) or of 4 but not 8
// (16-bit chunks in 8-byte halves), partial last segments, padded rows, and pointers 2, 8 or 16
// bytes aligned; sometimes thousands of rows, so that every block walks several segments.
TEST(gpu_vs_cpu, quantize_long_row_segments) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.quantize_long_row_segments", [] {
    const kernels::target t =
        *rc::gen::element(kernels::target::of(emu::int8_sym), kernels::target::of(emu::e4m3fn),
                          kernels::target::of(emu::e5m2), kernels::target::of(emu::int8),
                          kernels::target::of(emu::bfloat16));
    const emu::policy pol = *rc::gen::arbitrary<bool>() ? emu::rne : *any_policy();
    kernels::scaling sc;
    sc.margin = *rc::gen::inRange(-1, 2);
    sc.pow2 = *rc::gen::arbitrary<bool>();
    const dtype in_t =
        *rc::gen::element(dtype::bfloat16, dtype::bfloat16, dtype::float16, dtype::float32);
    shape2 s{};
    s.cols = *rc::gen::oneOf(rc::gen::element<std::int64_t>(640, 1024, 1280, 1284, 2560, 4096, 4100,
                                                            5120, 5124, 5122, 8192, 8196, 8199,
                                                            12288, 16384, 16388),
                             rc::gen::inRange<std::int64_t>(1, 17000));
    const bool many = *rc::gen::inRange(0, 8) == 0;
    s.rows = many ? std::max<std::int64_t>(1, std::min<std::int64_t>(8000, 6000000 / s.cols))
                  : *rc::gen::inRange<std::int64_t>(1, 6);
    s.pad = *rc::gen::element<std::int64_t>(0, 0, 1, 4, 8);
    s.offset = *rc::gen::element<std::int64_t>(0, 0, 1, 4, 8);
    const kernels::grouping g =
        *rc::gen::arbitrary<bool>()
            ? kernels::grouping::per_row()
            : kernels::grouping::blocks(*rc::gen::element<std::int64_t>(
                  640, 1280, 1284, 3000, 4100, 5120, 6000, 8192, 9000, 16000));
    mirrored in(buffer_elems(s) * kernels::dtype_size(in_t));
    store_input(in, in_t, s,
                awkward_values(static_cast<std::size_t>(s.rows * s.cols), s.cols,
                               *rc::gen::arbitrary<std::uint64_t>(), near_format(t)));
    const dtype code_t = t.code_dtype();
    mirrored codes(buffer_elems(s) * kernels::dtype_size(code_t));
    const std::int64_t nscales = g.scale_rows(s.rows) * g.scale_cols(s.cols);
    mirrored scales(static_cast<std::size_t>(nscales + 1) * 4);
    const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(), 3};
    for (bool gpu : {false, true})
      kernels::quantize(in.view(gpu, in_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                        codes.view(gpu, code_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                        scales.flat(gpu, dtype::float32, nscales), t, g, pol, sc, rng);
    RC_ASSERT(same_bytes(codes.host, codes.pull(), "quantize codes"));
    RC_ASSERT(same_bytes(scales.host, scales.pull(), "quantize scales"));
  }));
}

TEST(gpu_vs_cpu, cast_scaled_and_delayed_scaling) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.cast_scaled_and_delayed_scaling", [] {
    const kernels::target t = any_target();
    const emu::policy pol = *any_policy();
    const dtype in_t = *rc::gen::element(dtype::float32, dtype::float16, dtype::bfloat16);
    const shape2 s = *any_shape();
    const dtype code_t = t.code_dtype();
    mirrored codes(buffer_elems(s) * kernels::dtype_size(code_t));
    const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(), 1};

    // a given scale, including the awkward ones
    mirrored scale(4);
    const float q =
        *rc::gen::element(1.0f, 0.0f, 3.5f, 1e-30f, 1e30f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity());
    std::memcpy(scale.host.data(), &q, 4);
    scale.push();
    mirrored in(buffer_elems(s) * kernels::dtype_size(in_t));
    store_input(in, in_t, s,
                awkward_values(static_cast<std::size_t>(s.rows * s.cols), s.cols,
                               *rc::gen::arbitrary<std::uint64_t>(), near_format(t)));
    for (bool gpu : {false, true})
      kernels::cast_scaled(in.view(gpu, in_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                           codes.view(gpu, code_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                           scale.flat(gpu, dtype::float32, 1), t, pol, rng);
    RC_ASSERT(same_bytes(codes.host, codes.pull(), "cast_scaled codes"));

    // three steps of delayed scaling with the same history on both sides
    const int h = *rc::gen::inRange(1, 17);
    mirrored hist(static_cast<std::size_t>(h) * 4, 0);
    mirrored pair(8);
    const auto reduce =
        *rc::gen::element(kernels::history_reduce::max, kernels::history_reduce::most_recent);
    for (int step = 0; step < 3; ++step) {
      store_input(in, in_t, s,
                  awkward_values(static_cast<std::size_t>(s.rows * s.cols), s.cols,
                                 *rc::gen::arbitrary<std::uint64_t>(), near_format(t)));
      for (bool gpu : {false, true})
        kernels::quantize_delayed(in.view(gpu, in_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                                  codes.view(gpu, code_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                                  pair.flat(gpu, dtype::float32, 2),
                                  hist.flat(gpu, dtype::float32, h), t, reduce, pol, {}, rng);
      RC_ASSERT(same_bytes(codes.host, codes.pull(), "delayed codes"));
      RC_ASSERT(same_bytes(pair.host, pair.pull(), "delayed scale pair"));
      RC_ASSERT(same_bytes(hist.host, hist.pull(), "amax history"));
    }
  }));
}

TEST(gpu_vs_cpu, mx_quantize_and_dequantize) {
  LOWBIT_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("gpu_vs_cpu.mx_quantize_and_dequantize", [] {
    const kernels::target t =
        *rc::gen::element(kernels::target::of(emu::e4m3fn), kernels::target::of(emu::e5m2),
                          kernels::target::of(emu::e3m2fn), kernels::target::of(emu::e2m3fn),
                          kernels::target::of(emu::e2m1fn), kernels::target::of(emu::int8));
    const std::int64_t block = *rc::gen::element<std::int64_t>(32, 32, 16, 64, 7, 256, 300);
    emu::policy pol = *any_policy();
    const dtype in_t = *rc::gen::element(dtype::float32, dtype::float16, dtype::bfloat16);
    const shape2 s = whole_groups(*any_shape(), block);
    mirrored in(buffer_elems(s) * kernels::dtype_size(in_t));
    store_input(in, in_t, s,
                awkward_values(static_cast<std::size_t>(s.rows * s.cols), s.cols,
                               *rc::gen::arbitrary<std::uint64_t>(), near_format(t)));
    const dtype code_t = t.code_dtype();
    mirrored codes(buffer_elems(s) * kernels::dtype_size(code_t));
    const std::int64_t nscales = s.rows * ((s.cols + block - 1) / block);
    mirrored scales(static_cast<std::size_t>(nscales + 4));
    const emu::random_stream rng{*rc::gen::arbitrary<std::uint64_t>(), 3};
    for (bool gpu : {false, true})
      kernels::quantize_mx(in.view(gpu, in_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                           codes.view(gpu, code_t, s.rows, s.cols, s.cols + s.pad, s.offset),
                           scales.flat(gpu, dtype::uint8, nscales), t, pol, block, rng);
    RC_ASSERT(same_bytes(codes.host, codes.pull(), "mx codes"));
    RC_ASSERT(same_bytes(scales.host, scales.pull(), "mx scales"));
    codes.host = codes.pull();
    codes.push();
    scales.host = scales.pull();
    scales.push();
    mirrored out(buffer_elems(s) * 4);
    for (bool gpu : {false, true})
      kernels::dequantize_mx(
          codes.view(gpu, code_t, s.rows, s.cols, s.cols + s.pad, s.offset),
          scales.flat(gpu, dtype::uint8, nscales),
          out.view(gpu, dtype::float32, s.rows, s.cols, s.cols + s.pad, s.offset), t, block);
    RC_ASSERT(same_bytes(out.host, out.pull(), "mx dequantized values"));
  }));
}

// Running a kernel twice gives the same bits (atomics here are maxima, which commute exactly).
TEST(gpu_determinism, repeated_runs_identical) {
  LOWBIT_REQUIRE_GPU();
  const shape2 s{1000, 1000, 0, 0};
  mirrored in(buffer_elems(s) * 4);
  store_input(in, dtype::float32, s, awkward_values(1000000, 1000, 5, emu::e4m3fn));
  for (auto g : {kernels::grouping::per_tensor(), kernels::grouping::per_column(),
                 kernels::grouping::tiles(128, 128)}) {
    mirrored c1(buffer_elems(s)), c2(buffer_elems(s));
    const std::int64_t ns = g.scale_rows(1000) * g.scale_cols(1000);
    mirrored s1(static_cast<std::size_t>(ns) * 4), s2(static_cast<std::size_t>(ns) * 4);
    kernels::quantize(in.view(true, dtype::float32, 1000, 1000, 1000),
                      c1.view(true, dtype::uint8, 1000, 1000, 1000),
                      s1.flat(true, dtype::float32, ns), kernels::target::of(emu::e4m3fn), g,
                      emu::rne_sat);
    kernels::quantize(in.view(true, dtype::float32, 1000, 1000, 1000),
                      c2.view(true, dtype::uint8, 1000, 1000, 1000),
                      s2.flat(true, dtype::float32, ns), kernels::target::of(emu::e4m3fn), g,
                      emu::rne_sat);
    EXPECT_TRUE(same_bytes(c1.pull(), c2.pull(), "codes of two runs"));
    EXPECT_TRUE(same_bytes(s1.pull(), s2.pull(), "scales of two runs"));
  }
}

// A host pointer inside a CUDA view is refused with a message, not a fault in a kernel.
TEST(gpu_bad_input, host_pointer_in_cuda_view) {
  LOWBIT_REQUIRE_GPU();
  std::vector<float> x(16, 1.0f);
  std::vector<std::uint8_t> c(16);
  auto in = kernels::tensor_view::contiguous(x.data(), dtype::float32, {16},
                                             {kernels::device_type::cuda, 0});
  auto out = kernels::tensor_view::contiguous(c.data(), dtype::uint8, {16},
                                              {kernels::device_type::cuda, 0});
  try {
    kernels::cast(in, out, emu::e4m3fn, emu::rne);
    FAIL() << "expected lowbit::error";
  } catch (const lowbit::error& e) {
    EXPECT_NE(std::string(e.what()).find("x:"), std::string::npos) << e.what();
  }
}

} // namespace
