// The format sweep on the GPU (issue 15): every host-API function that takes a format or a
// quantization target, with every format of ../common/format_sweep.hpp, on CPU views and on CUDA
// views. Both refuse the same formats with the same message (the claims table says which), or
// both write the same bytes into identically poisoned outputs: the CPU sweep
// (proptests/src/test_format_sweep.cpp) checks the CPU twin's values, so GPU == CPU here carries
// those checks over to the kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/quantize.hpp>

#include "../common/format_sweep.hpp"
#include "gpu_harness.hpp"

namespace {

using namespace lowbit;
using gpu_test::mirrored;
using gpu_test::same_bytes;
using kernels::dtype;
using sweep::fn;

constexpr std::int64_t rows = 5, cols = 70; // MX blocks of 32 leave a short one
constexpr std::int64_t count = rows * cols;

// Magnitudes over 2^-30 .. 2^30 with both signs and zeros; row 1 all zeros; NaN, +-Inf and -0
// in row 2 (its first blocks are poisoned groups).
std::vector<float> inputs() {
  std::vector<float> v(static_cast<std::size_t>(count));
  std::uint32_t s = 2024u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    const int e = static_cast<int>((s >> 8) % 61) - 30;
    x = std::ldexp(1.0f + static_cast<float>((s >> 16) & 0xFFu) / 256.0f, e) *
        ((s & 1u) ? -1.0f : 1.0f);
    if ((s >> 24) % 9 == 0)
      x = 0.0f;
  }
  for (std::int64_t c = 0; c < cols; ++c)
    v[static_cast<std::size_t>(cols + c)] = 0.0f;
  v[2 * cols + 1] = std::numeric_limits<float>::quiet_NaN();
  v[2 * cols + 40] = -std::numeric_limits<float>::infinity();
  v[2 * cols + 3] = -0.0f;
  return v;
}

void load_inputs(mirrored& b) {
  const auto v = inputs();
  std::memcpy(b.host.data(), v.data(), v.size() * 4);
  b.push();
}

// Runs call(gpu) on CPU views then on CUDA views; both must refuse with the same message, or
// both succeed with the same bytes in every output.
void cpu_and_gpu(fn f, const kernels::target& t, const std::function<void(bool)>& call,
                 std::vector<mirrored*> outs) {
  const std::string who = std::string(sweep::fn_name(f)) + "(" + sweep::target_name(t) + ")";
  std::string refused[2];
  bool threw[2] = {false, false};
  for (bool gpu : {false, true}) {
    try {
      call(gpu);
    } catch (const error& e) {
      threw[gpu] = true;
      refused[gpu] = e.what();
    }
  }
  ASSERT_EQ(threw[0], threw[1]) << who << ": CPU " << (threw[0] ? refused[0] : "accepts")
                                << ", GPU " << (threw[1] ? refused[1] : "accepts");
  EXPECT_EQ(!threw[0], sweep::claims(f, t)) << who << ": the claims table disagrees";
  if (threw[0]) {
    EXPECT_EQ(refused[0], refused[1]) << who;
    return;
  }
  for (std::size_t k = 0; k < outs.size(); ++k)
    EXPECT_TRUE(same_bytes(outs[k]->host, outs[k]->pull(), who + " output " + std::to_string(k)));
}

TEST(gpu_format_sweep, cast_and_decode_every_format) {
  LOWBIT_REQUIRE_GPU();
  mirrored x(static_cast<std::size_t>(count) * 4);
  load_inputs(x);
  const emu::random_stream rng{5, 1};
  for (const auto& sf : sweep::formats()) {
    const emu::format& f = sf.fmt;
    const kernels::target t = kernels::target::of(f);
    const dtype code_t = kernels::code_dtype(f);
    for (const emu::policy& pol :
         {emu::rne, emu::rne_sat, emu::stochastic(8, emu::overflow::saturate)}) {
      mirrored codes(static_cast<std::size_t>(count) * kernels::dtype_size(code_t));
      cpu_and_gpu(fn::cast, t,
                  [&](bool gpu) {
                    kernels::cast(x.view(gpu, dtype::float32, rows, cols, cols),
                                  codes.view(gpu, code_t, rows, cols, cols), f, pol, rng);
                  },
                  {&codes});
    }
    // Codes spread over the whole code range, decoded into both output types.
    mirrored codes(static_cast<std::size_t>(count) * kernels::dtype_size(code_t));
    const std::uint64_t span = std::uint64_t{1} << f.bits();
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint32_t c =
          static_cast<std::uint32_t>((static_cast<std::uint64_t>(i) * 2654435761u) % span);
      std::memcpy(codes.host.data() + i * kernels::dtype_size(code_t), &c,
                  kernels::dtype_size(code_t));
    }
    codes.push();
    for (const dtype out_t : {dtype::float32, dtype::float64}) {
      mirrored out(static_cast<std::size_t>(count) * kernels::dtype_size(out_t));
      cpu_and_gpu(out_t == dtype::float32 ? fn::decode_float32 : fn::decode_float64, t,
                  [&](bool gpu) {
                    kernels::decode(codes.view(gpu, code_t, rows, cols, cols),
                                    out.view(gpu, out_t, rows, cols, cols), f);
                  },
                  {&out});
    }
  }
}

TEST(gpu_format_sweep, scaled_quantization_every_target) {
  LOWBIT_REQUIRE_GPU();
  mirrored x(static_cast<std::size_t>(count) * 4);
  load_inputs(x);
  const emu::policy pol = emu::rne_sat;
  for (const auto& t : sweep::all_targets()) {
    const dtype code_t = t.code_dtype();
    const std::size_t code_bytes = static_cast<std::size_t>(count) * kernels::dtype_size(code_t);
    for (const auto& g : {kernels::grouping::per_row(), kernels::grouping::blocks(16),
                          kernels::grouping::per_tensor()}) {
      const std::int64_t ns = g.scale_rows(rows) * g.scale_cols(cols);
      mirrored codes(code_bytes), scales(static_cast<std::size_t>(ns) * 4);
      cpu_and_gpu(fn::quantize, t,
                  [&](bool gpu) {
                    kernels::quantize(x.view(gpu, dtype::float32, rows, cols, cols),
                                      codes.view(gpu, code_t, rows, cols, cols),
                                      scales.flat(gpu, dtype::float32, ns), t, g, pol);
                  },
                  {&codes, &scales});
      // Dequantize what the CPU wrote (poison where it refused) on both sides.
      codes.push();
      scales.push();
      mirrored out(static_cast<std::size_t>(count) * 4);
      cpu_and_gpu(fn::dequantize, t,
                  [&](bool gpu) {
                    kernels::dequantize(codes.view(gpu, code_t, rows, cols, cols),
                                        scales.flat(gpu, dtype::float32, ns),
                                        out.view(gpu, dtype::float32, rows, cols, cols), t, g);
                  },
                  {&out});
    }
    mirrored scale(4), codes(code_bytes);
    const float q = 0.75f;
    std::memcpy(scale.host.data(), &q, 4);
    scale.push();
    cpu_and_gpu(fn::cast_scaled, t,
                [&](bool gpu) {
                  kernels::cast_scaled(x.view(gpu, dtype::float32, rows, cols, cols),
                                       codes.view(gpu, code_t, rows, cols, cols),
                                       scale.flat(gpu, dtype::float32, 1), t, pol);
                },
                {&codes});
    mirrored dcodes(code_bytes), pair(8), hist(8);
    // Both sides start from the same history, which the call updates.
    const float h[2] = {2.0f, 5.0f};
    std::memcpy(hist.host.data(), h, 8);
    hist.push();
    cpu_and_gpu(fn::quantize_delayed, t,
                [&](bool gpu) {
                  kernels::quantize_delayed(
                      x.view(gpu, dtype::float32, rows, cols, cols),
                      dcodes.view(gpu, code_t, rows, cols, cols), pair.flat(gpu, dtype::float32, 2),
                      hist.flat(gpu, dtype::float32, 2), t, kernels::history_reduce::max, pol);
                },
                {&dcodes, &pair, &hist});
  }
}

TEST(gpu_format_sweep, mx_every_target) {
  LOWBIT_REQUIRE_GPU();
  mirrored x(static_cast<std::size_t>(count) * 4);
  load_inputs(x);
  const std::int64_t block = 32, nb = (cols + block - 1) / block;
  const emu::random_stream rng{9, 2};
  for (const auto& t : sweep::all_targets()) {
    const dtype code_t = t.code_dtype();
    for (const emu::policy& pol : {emu::rne_sat, emu::stochastic(8, emu::overflow::saturate)}) {
      mirrored codes(static_cast<std::size_t>(count) * kernels::dtype_size(code_t)),
          scales(static_cast<std::size_t>(rows * nb));
      cpu_and_gpu(fn::quantize_mx, t,
                  [&](bool gpu) {
                    kernels::quantize_mx(x.view(gpu, dtype::float32, rows, cols, cols),
                                         codes.view(gpu, code_t, rows, cols, cols),
                                         scales.view(gpu, dtype::uint8, rows, nb, nb), t, pol,
                                         block, rng);
                  },
                  {&codes, &scales});
      codes.push();
      scales.push();
      mirrored out(static_cast<std::size_t>(count) * 4);
      cpu_and_gpu(fn::dequantize_mx, t,
                  [&](bool gpu) {
                    kernels::dequantize_mx(codes.view(gpu, code_t, rows, cols, cols),
                                           scales.view(gpu, dtype::uint8, rows, nb, nb),
                                           out.view(gpu, dtype::float32, rows, cols, cols), t,
                                           block);
                  },
                  {&out});
    }
  }
}

} // namespace
