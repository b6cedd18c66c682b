// The format sweep (issue 15): every public host-API function that takes a format or a
// quantization target, called with every named format, a few user-defined ones and the integer
// targets. Each call either throws lowbit::error, and then the function's header claims to refuse
// that format (the table in ../common/format_sweep.hpp), writes nothing, and names the format; or
// it returns, and then its header claims that format, every output element is written and equals
// an independent computation from emu's per-value functions (encode, decode, quantize_int) and
// the equations of the headers and docs/techniques/quantization.md.
//
// "Every element written" is checked by running each accepted call twice, on outputs filled
// with the bytes 0xA5 and then 0x5A: an element the call skips keeps its fill, and the two runs
// then differ there (a single sentinel could be a legitimate code).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/blockwise.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/quantize.hpp>
#include <lowbit/verify/verify.hpp>

#include "../common/format_sweep.hpp"

namespace {

using namespace lowbit;
using kernels::dtype;
using sweep::fn;

constexpr std::int64_t rows = 3, cols = 37; // 37: MX blocks of 32 leave a short one
constexpr std::int64_t count = rows * cols;
constexpr int fills[2] = {0xA5, 0x5A};

// A host buffer of rows x cols elements (or n, 1-D) of one dtype.
struct buffer {
  dtype type;
  std::int64_t r, c;
  std::vector<unsigned char> bytes;
  buffer(dtype t, std::int64_t r_, std::int64_t c_, int fill = 0)
      : type(t), r(r_), c(c_), bytes(static_cast<std::size_t>(r_ * c_) * kernels::dtype_size(t),
                                     static_cast<unsigned char>(fill)) {}
  kernels::tensor_view view() {
    kernels::tensor_view v;
    v.data = bytes.data();
    v.type = type;
    v.ndim = 2;
    v.shape = {r, c};
    v.strides = {c, 1};
    return v;
  }
  kernels::tensor_view flat() {
    auto v = view();
    v.ndim = 1;
    v.shape = {r * c};
    v.strides = {1};
    return v;
  }
  std::uint32_t code(std::int64_t i) const { // an unsigned or int8 element as its low bits
    const unsigned char* p = bytes.data() + i * kernels::dtype_size(type);
    switch (kernels::dtype_size(type)) {
    case 1: return p[0];
    case 2: {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    default: {
      std::uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    }
  }
  void set_code(std::int64_t i, std::uint32_t v) {
    unsigned char* p = bytes.data() + i * kernels::dtype_size(type);
    std::memcpy(p, &v, kernels::dtype_size(type)); // little-endian low bytes
  }
  float f32(std::int64_t i) const {
    float v;
    std::memcpy(&v, bytes.data() + i * 4, 4);
    return v;
  }
  double f64(std::int64_t i) const {
    double v;
    std::memcpy(&v, bytes.data() + i * 8, 8);
    return v;
  }
  void set_f32(std::int64_t i, float v) { std::memcpy(bytes.data() + i * 4, &v, 4); }
};

// Deterministic inputs: magnitudes over 2^-20 .. 2^20 with both signs, exact zeros, and (when
// `specials`) NaN and Inf. Row 1 of a quantize input is all zeros (amax 0); row 2 holds a NaN
// in its first MX block (a poisoned group).
std::vector<float> inputs(bool specials) {
  std::vector<float> v(static_cast<std::size_t>(count));
  std::uint32_t s = 12345u;
  for (std::int64_t i = 0; i < count; ++i) {
    s = s * 1664525u + 1013904223u;
    const int e = static_cast<int>((s >> 8) % 41) - 20;
    const float m = 1.0f + static_cast<float>((s >> 16) & 0xFFu) / 256.0f;
    float x = std::ldexp(m, e) * ((s & 1u) ? -1.0f : 1.0f);
    if ((s >> 24) % 11 == 0)
      x = 0.0f;
    v[static_cast<std::size_t>(i)] = x;
  }
  if (specials) {
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[4] = -std::numeric_limits<float>::infinity();
    v[5] = std::numeric_limits<float>::infinity();
    v[6] = -0.0f;
  } else {
    for (std::int64_t c = 0; c < cols; ++c)
      v[static_cast<std::size_t>(cols + c)] = 0.0f;
    v[static_cast<std::size_t>(2 * cols + 5)] = std::numeric_limits<float>::quiet_NaN();
  }
  return v;
}

buffer input_buffer(bool specials) {
  buffer b(dtype::float32, rows, cols);
  const auto v = inputs(specials);
  for (std::int64_t i = 0; i < count; ++i)
    b.set_f32(i, v[static_cast<std::size_t>(i)]);
  return b;
}

bool same_value(double got, double want) {
  if (std::isnan(want))
    return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// Runs call(fill) once per fill. Returns "" when the call was accepted both times with
// identical outputs (outputs() gives their bytes), else a description; sets `refused` and
// `message` when the call threw lowbit::error.
struct outcome {
  bool refused = false;
  std::string message;
  bool differs = false; // accepted, but some output byte kept its fill
};

outcome run_twice(const std::function<void(int)>& call,
                  const std::function<std::vector<unsigned char>()>& outputs,
                  const std::function<bool()>& untouched) {
  outcome o;
  std::vector<unsigned char> first;
  for (int k = 0; k < 2; ++k) {
    try {
      call(fills[k]);
    } catch (const error& e) {
      o.refused = true;
      o.message = e.what();
      if (!untouched())
        o.differs = true; // a refusal wrote into an output
      return o;
    }
    if (k == 0)
      first = outputs();
    else if (outputs() != first)
      o.differs = true;
  }
  return o;
}

// The claim check common to every function: refused iff not claimed; a refusal names the
// format (where `names` says the message must) and leaves the outputs as they were.
void check_claim(fn f, const kernels::target& t, const outcome& o, bool names = true) {
  const std::string who = std::string(sweep::fn_name(f)) + "(" + sweep::target_name(t) + ")";
  const bool claimed = sweep::claims(f, t);
  if (o.refused) {
    EXPECT_FALSE(claimed) << who << " is claimed but refused: " << o.message;
    if (names) {
      EXPECT_NE(o.message.find(sweep::target_name(t)), std::string::npos)
          << who << ": the refusal does not name the format: " << o.message;
    }
    EXPECT_FALSE(o.differs) << who << ": refused after writing into an output";
  } else {
    EXPECT_TRUE(claimed) << who << " is accepted but its header does not claim it";
    EXPECT_FALSE(o.differs) << who << ": some output element is left unwritten";
  }
}

// ---- independent computations -----------------------------------------------------------

// The value of a target code (quantize.hpp: codes in two's complement low bits for integers).
double code_value(const kernels::target& t, std::uint32_t code) {
  if (t.is_int)
    return t.ifmt.is_signed ? static_cast<double>(static_cast<std::int8_t>(code & 0xFFu))
                            : static_cast<double>(code & 0xFFu);
  return emu::decode<double>(t.fmt, code);
}

// encode(target, y) as the code stored in the target's code dtype.
std::uint32_t target_code(const kernels::target& t, float y, const emu::policy& pol) {
  if (t.is_int)
    return static_cast<std::uint32_t>(emu::quantize_int(t.ifmt, y, pol)) & 0xFFu;
  return emu::encode(t.fmt, y, pol);
}

struct group_scale {
  float q, d;
};

// quantize.hpp's scale rule with margin 0 and no pow2.
group_scale scale_rule(float amax, float tmax) {
  if (std::isnan(amax) || std::isinf(amax)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {nan, nan};
  }
  if (amax == 0.0f)
    return {1.0f, 1.0f};
  float q = tmax / amax;
  if (std::isinf(q))
    q = std::numeric_limits<float>::max();
  return {q, amax / tmax};
}

float amax_of(const std::vector<float>& x, std::int64_t r, std::int64_t c0, std::int64_t c1) {
  float m = 0.0f;
  for (std::int64_t c = c0; c < c1; ++c) {
    const float a = std::fabs(x[static_cast<std::size_t>(r * cols + c)]);
    if (std::isnan(a))
      return a;
    m = std::max(m, a);
  }
  return m;
}

// encode(t, fl(x * q)), with the poisoned-group rule: under a NaN scale the product is +NaN.
std::uint32_t quantized(const kernels::target& t, float x, float q, const emu::policy& pol) {
  const float y = std::isnan(q) ? std::numeric_limits<float>::quiet_NaN() : x * q;
  return target_code(t, y, pol);
}

float dequantized(double v, float d) {
  if (std::isnan(v))
    return static_cast<float>(v);
  if (std::isnan(d))
    return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(v) * d;
}

// ---- cast and decode ---------------------------------------------------------------------

TEST(format_sweep, cast_every_format) {
  auto x = input_buffer(true);
  const auto xv = inputs(true);
  const emu::random_stream rng{7, 3};
  for (const auto& f : sweep::formats()) {
    for (const emu::policy& pol :
         {emu::rne, emu::rne_sat, emu::stochastic(8, emu::overflow::saturate)}) {
      SCOPED_TRACE(f.name + " " + emu::rounding_name(pol.round));
      buffer out(kernels::code_dtype(f.fmt), rows, cols);
      const auto o = run_twice(
          [&](int fill) {
            out.bytes.assign(out.bytes.size(), static_cast<unsigned char>(fill));
            kernels::cast(x.view(), out.view(), f.fmt, pol, rng);
          },
          [&] { return out.bytes; }, [&] { return true; });
      check_claim(fn::cast, kernels::target::of(f.fmt), o);
      if (o.refused)
        continue;
      for (std::int64_t i = 0; i < count; ++i) {
        const std::uint32_t rb =
            pol.round == emu::rounding::stochastic ? rng.bits(static_cast<std::uint64_t>(i)) : 0u;
        ASSERT_EQ(out.code(i), emu::encode(f.fmt, xv[static_cast<std::size_t>(i)], pol, rb))
            << "element " << i;
      }
    }
  }
}

TEST(format_sweep, decode_every_format) {
  for (const auto& f : sweep::formats()) {
    SCOPED_TRACE(f.name);
    // Every code for formats of up to 12 bits, else codes spread over the whole range.
    const std::int64_t n = f.fmt.bits() <= 12 ? (std::int64_t{1} << f.fmt.bits()) : 4096;
    buffer codes(kernels::code_dtype(f.fmt), 1, n);
    const std::uint64_t span = std::uint64_t{1} << f.fmt.bits();
    for (std::int64_t i = 0; i < n; ++i)
      codes.set_code(i, static_cast<std::uint32_t>(
                            f.fmt.bits() <= 12
                                ? static_cast<std::uint64_t>(i)
                                : (static_cast<std::uint64_t>(i) * (span / 4096) +
                                   static_cast<std::uint64_t>(i) * 2654435761u % (span / 4096))));
    for (const dtype out_t : {dtype::float32, dtype::float64}) {
      const fn which = out_t == dtype::float32 ? fn::decode_float32 : fn::decode_float64;
      buffer out(out_t, 1, n);
      const auto o = run_twice(
          [&](int fill) {
            out.bytes.assign(out.bytes.size(), static_cast<unsigned char>(fill));
            kernels::decode(codes.view(), out.view(), f.fmt);
          },
          [&] { return out.bytes; },
          [&] {
            for (unsigned char b : out.bytes)
              if (b != fills[0])
                return false;
            return true;
          });
      // A float32 output for a format beyond float32 is refused as a dtype, not by name.
      check_claim(which, kernels::target::of(f.fmt), o, /*names=*/false);
      if (o.refused)
        continue;
      for (std::int64_t i = 0; i < n; ++i) {
        const double want = emu::decode<double>(f.fmt, codes.code(i));
        const double got = out_t == dtype::float32 ? out.f32(i) : out.f64(i);
        ASSERT_TRUE(same_value(got, want))
            << "code 0x" << std::hex << codes.code(i) << std::dec << ": " << got << " vs " << want;
      }
    }
  }
}

// ---- scaled quantization -----------------------------------------------------------------

bool all_fill(const buffer& b, int fill) {
  for (unsigned char v : b.bytes)
    if (v != fill)
      return false;
  return true;
}

TEST(format_sweep, quantize_every_target) {
  auto x = input_buffer(false);
  const auto xv = inputs(false);
  const emu::policy pol = emu::rne_sat;
  for (const auto& t : sweep::all_targets()) {
    SCOPED_TRACE(sweep::target_name(t));
    for (const auto& g : {kernels::grouping::per_row(), kernels::grouping::blocks(16)}) {
      const std::int64_t sr = g.scale_rows(rows), sc = g.scale_cols(cols);
      buffer codes(t.code_dtype(), rows, cols), scales(dtype::float32, sr, sc);
      const auto o = run_twice(
          [&](int fill) {
            codes.bytes.assign(codes.bytes.size(), static_cast<unsigned char>(fill));
            scales.bytes.assign(scales.bytes.size(), static_cast<unsigned char>(fill));
            kernels::quantize(x.view(), codes.view(), scales.flat(), t, g, pol);
          },
          [&] {
            auto v = codes.bytes;
            v.insert(v.end(), scales.bytes.begin(), scales.bytes.end());
            return v;
          },
          [&] { return all_fill(codes, fills[0]) && all_fill(scales, fills[0]); });
      check_claim(fn::quantize, t, o);
      if (o.refused)
        continue;
      const float tmax = static_cast<float>(t.max_value());
      const std::int64_t gc = g.k == kernels::grouping::kind::rows ? cols : g.tile_cols;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < sc; ++j) {
          const std::int64_t c0 = j * gc, c1 = std::min(cols, c0 + gc);
          const auto s = scale_rule(amax_of(xv, r, c0, c1), tmax);
          ASSERT_TRUE(same_value(scales.f32(r * sc + j), s.d))
              << "scale of group " << r << "," << j;
          for (std::int64_t c = c0; c < c1; ++c)
            ASSERT_EQ(codes.code(r * cols + c) &
                          (t.code_dtype() == dtype::uint16 ? 0xFFFFu : 0xFFu),
                      quantized(t, xv[static_cast<std::size_t>(r * cols + c)], s.q, pol))
                << "element " << r << "," << c;
        }
    }
  }
}

TEST(format_sweep, cast_scaled_every_target) {
  auto x = input_buffer(false);
  const auto xv = inputs(false);
  const emu::policy pol = emu::rne_sat;
  buffer scale(dtype::float32, 1, 1);
  scale.set_f32(0, 0.75f);
  for (const auto& t : sweep::all_targets()) {
    SCOPED_TRACE(sweep::target_name(t));
    buffer codes(t.code_dtype(), rows, cols);
    const auto o = run_twice(
        [&](int fill) {
          codes.bytes.assign(codes.bytes.size(), static_cast<unsigned char>(fill));
          kernels::cast_scaled(x.view(), codes.view(), scale.flat(), t, pol);
        },
        [&] { return codes.bytes; }, [&] { return all_fill(codes, fills[0]); });
    check_claim(fn::cast_scaled, t, o);
    if (o.refused)
      continue;
    const std::uint32_t mask = t.code_dtype() == dtype::uint16 ? 0xFFFFu : 0xFFu;
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(codes.code(i) & mask, quantized(t, xv[static_cast<std::size_t>(i)], 0.75f, pol))
          << "element " << i;
  }
}

TEST(format_sweep, quantize_delayed_every_target) {
  auto x = input_buffer(false);
  const auto xv = inputs(false);
  const emu::policy pol = emu::rne_sat;
  for (const auto& t : sweep::all_targets()) {
    SCOPED_TRACE(sweep::target_name(t));
    buffer codes(t.code_dtype(), rows, cols), pair(dtype::float32, 1, 2),
        history(dtype::float32, 1, 2);
    const auto o = run_twice(
        [&](int fill) {
          codes.bytes.assign(codes.bytes.size(), static_cast<unsigned char>(fill));
          pair.bytes.assign(pair.bytes.size(), static_cast<unsigned char>(fill));
          history.set_f32(0, 2.0f);
          history.set_f32(1, 5.0f);
          kernels::quantize_delayed(x.view(), codes.view(), pair.flat(), history.flat(), t,
                                    kernels::history_reduce::max, pol);
        },
        [&] {
          auto v = codes.bytes;
          v.insert(v.end(), pair.bytes.begin(), pair.bytes.end());
          v.insert(v.end(), history.bytes.begin(), history.bytes.end());
          return v;
        },
        [&] { return all_fill(codes, fills[0]) && all_fill(pair, fills[0]); });
    check_claim(fn::quantize_delayed, t, o);
    if (o.refused) {
      EXPECT_EQ(history.f32(0), 2.0f) << "a refused call changed the history";
      continue;
    }
    const auto s = scale_rule(5.0f, static_cast<float>(t.max_value()));
    EXPECT_TRUE(same_value(pair.f32(0), s.q));
    EXPECT_TRUE(same_value(pair.f32(1), s.d));
    // The history now holds this tensor's amax (NaN: row 2 holds a NaN), then the older entry.
    EXPECT_TRUE(std::isnan(history.f32(0)));
    EXPECT_EQ(history.f32(1), 2.0f);
    const std::uint32_t mask = t.code_dtype() == dtype::uint16 ? 0xFFFFu : 0xFFu;
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(codes.code(i) & mask, quantized(t, xv[static_cast<std::size_t>(i)], s.q, pol))
          << "element " << i;
  }
}

TEST(format_sweep, dequantize_every_target) {
  const auto xv = inputs(false);
  const auto g = kernels::grouping::per_row();
  for (const auto& t : sweep::all_targets()) {
    SCOPED_TRACE(sweep::target_name(t));
    // Codes and scales made independently of the kernels: every code value the target has
    // (cycled), one scale per row, the last one NaN (a poisoned group).
    buffer codes(t.code_dtype(), rows, cols), scales(dtype::float32, rows, 1),
        out(dtype::float32, rows, cols);
    const std::uint32_t span = t.is_int
                                   ? 256u
                                   : static_cast<std::uint32_t>(std::min<std::uint64_t>(
                                         std::uint64_t{1} << std::min(t.fmt.bits(), 16), 65536));
    for (std::int64_t i = 0; i < count; ++i)
      codes.set_code(i, static_cast<std::uint32_t>(i * 977) % span);
    scales.set_f32(0, 0.375f);
    scales.set_f32(1, 3.0f);
    scales.set_f32(2, std::numeric_limits<float>::quiet_NaN());
    const auto o = run_twice(
        [&](int fill) {
          out.bytes.assign(out.bytes.size(), static_cast<unsigned char>(fill));
          kernels::dequantize(codes.view(), scales.flat(), out.view(), t, g);
        },
        [&] { return out.bytes; }, [&] { return all_fill(out, fills[0]); });
    check_claim(fn::dequantize, t, o);
    if (o.refused)
      continue;
    for (std::int64_t i = 0; i < count; ++i) {
      const float want = dequantized(code_value(t, codes.code(i)), scales.f32(i / cols));
      ASSERT_TRUE(same_value(out.f32(i), want))
          << "element " << i << " code 0x" << std::hex << codes.code(i);
    }
  }
}

// ---- OCP MX ------------------------------------------------------------------------------

constexpr std::int64_t mx_block = 32, mx_blocks = (cols + mx_block - 1) / mx_block;

// The E8M0 scale code of quantize.hpp: floor(log2(amax)) - emax_elem clamped to [-127, 127],
// 0 for amax 0, 0xFF for NaN/Inf.
std::uint32_t mx_scale(float amax, int emax) {
  if (!std::isfinite(amax))
    return 0xFFu;
  if (amax == 0.0f)
    return 0u;
  const int s = std::clamp(std::ilogb(amax) - emax, -127, 127);
  return static_cast<std::uint32_t>(s + 127);
}

TEST(format_sweep, quantize_mx_every_target) {
  auto x = input_buffer(false);
  const auto xv = inputs(false);
  const emu::random_stream rng{11, 0};
  for (const auto& t : sweep::all_targets()) {
    for (const emu::policy& pol : {emu::rne_sat, emu::stochastic(8, emu::overflow::saturate)}) {
      SCOPED_TRACE(sweep::target_name(t) + " " + emu::rounding_name(pol.round));
      buffer codes(t.code_dtype(), rows, cols), scales(dtype::uint8, rows, mx_blocks);
      const auto o = run_twice(
          [&](int fill) {
            codes.bytes.assign(codes.bytes.size(), static_cast<unsigned char>(fill));
            scales.bytes.assign(scales.bytes.size(), static_cast<unsigned char>(fill));
            kernels::quantize_mx(x.view(), codes.view(), scales.view(), t, pol, mx_block, rng);
          },
          [&] {
            auto v = codes.bytes;
            v.insert(v.end(), scales.bytes.begin(), scales.bytes.end());
            return v;
          },
          [&] { return all_fill(codes, fills[0]) && all_fill(scales, fills[0]); });
      check_claim(fn::quantize_mx, t, o);
      if (o.refused) {
        EXPECT_NE(o.message.find("quantize_mx: element format "), std::string::npos) << o.message;
        continue;
      }
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < mx_blocks; ++j) {
          const std::int64_t c0 = j * mx_block, c1 = std::min(cols, c0 + mx_block);
          const std::uint32_t sc = mx_scale(amax_of(xv, r, c0, c1), t.emax());
          ASSERT_EQ(scales.code(r * mx_blocks + j), sc) << "block " << r << "," << j;
          const int s = static_cast<int>(sc) - 127;
          for (std::int64_t c = c0; c < c1; ++c) {
            const std::int64_t i = r * cols + c;
            const std::uint32_t rb = pol.round == emu::rounding::stochastic
                                         ? rng.bits(static_cast<std::uint64_t>(i))
                                         : 0u;
            const double v = static_cast<double>(xv[static_cast<std::size_t>(i)]);
            std::uint32_t want;
            if (sc == 0xFFu)
              want =
                  t.is_int ? 0u : emu::encode(t.fmt, std::numeric_limits<double>::quiet_NaN(), pol);
            else if (t.is_int)
              want = static_cast<std::uint32_t>(
                         emu::quantize_int(t.ifmt, std::ldexp(v, 6 - s), pol, rb)) &
                     0xFFu;
            else
              want = emu::encode(t.fmt, std::ldexp(v, -s), pol, rb); // exact in double
            ASSERT_EQ(codes.code(i), want) << "element " << r << "," << c;
          }
        }
    }
  }
}

TEST(format_sweep, dequantize_mx_every_target) {
  for (const auto& t : sweep::all_targets()) {
    SCOPED_TRACE(sweep::target_name(t));
    buffer codes(t.code_dtype(), rows, cols), scales(dtype::uint8, rows, mx_blocks),
        out(dtype::float32, rows, cols);
    const std::uint32_t span = t.is_int ? 256u : (std::uint32_t{1} << std::min(t.fmt.bits(), 16));
    for (std::int64_t i = 0; i < count; ++i)
      codes.set_code(i, static_cast<std::uint32_t>(i * 977 + 13) % span);
    const std::uint32_t scale_codes[] = {0u, 120u, 127u, 140u, 254u, 0xFFu};
    for (std::int64_t b = 0; b < rows * mx_blocks; ++b)
      scales.set_code(b, scale_codes[b % 6]);
    const auto o = run_twice(
        [&](int fill) {
          out.bytes.assign(out.bytes.size(), static_cast<unsigned char>(fill));
          kernels::dequantize_mx(codes.view(), scales.view(), out.view(), t, mx_block);
        },
        [&] { return out.bytes; }, [&] { return all_fill(out, fills[0]); });
    check_claim(fn::dequantize_mx, t, o);
    if (o.refused) {
      EXPECT_NE(o.message.find("dequantize_mx: element format "), std::string::npos) << o.message;
      continue;
    }
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint32_t sc = scales.code((i / cols) * mx_blocks + (i % cols) / mx_block);
      const double v = code_value(t, codes.code(i));
      float want;
      if (sc == 0xFFu || std::isnan(v))
        want = std::numeric_limits<float>::quiet_NaN();
      else
        want = static_cast<float>(std::ldexp(v, static_cast<int>(sc) - 127 - (t.is_int ? 6 : 0)));
      ASSERT_TRUE(same_value(out.f32(i), want))
          << "element " << i << " code 0x" << std::hex << codes.code(i) << " scale 0x" << sc;
    }
  }
}

// The defect of issue 15 itself, spelled out: a 16-bit element format is refused with the
// message that names it, before anything is written.
TEST(format_sweep, mx_refuses_sixteen_bit_elements) {
  auto x = input_buffer(false);
  for (const auto& f : {emu::float16, emu::bfloat16}) {
    buffer codes(dtype::uint16, rows, cols, 0xA5), scales(dtype::uint8, rows, mx_blocks, 0xA5);
    try {
      kernels::quantize_mx(x.view(), codes.view(), scales.view(), kernels::target::of(f),
                           emu::rne_sat);
      ADD_FAILURE() << emu::format_name(f) << " accepted";
    } catch (const error& e) {
      EXPECT_EQ(std::string(e.what()),
                "quantize_mx: element format " + emu::format_name(f) +
                    " is not an OCP MX element format (e4m3fn, e5m2, e3m2fn, e2m3fn, e2m1fn, "
                    "int8)");
      EXPECT_EQ(e.code(), errc::invalid_argument);
    }
    EXPECT_TRUE(all_fill(codes, 0xA5) && all_fill(scales, 0xA5));
  }
}

// ---- host-only functions -----------------------------------------------------------------

TEST(format_sweep, codebook_from_every_format) {
  for (const auto& f : sweep::formats()) {
    SCOPED_TRACE(f.name);
    const kernels::target t = kernels::target::of(f.fmt);
    outcome o;
    kernels::codebook cb;
    try {
      cb = kernels::codebook::from_format(f.fmt);
    } catch (const error& e) {
      o.refused = true;
      o.message = e.what();
    }
    check_claim(fn::codebook_from_format, t, o);
    if (o.refused)
      continue;
    // The codebook holds exactly the distinct finite values over the largest magnitude, and 0.
    std::vector<float> want{0.0f};
    float m = 0.0f;
    for (std::uint32_t c = 0; c < (1u << f.fmt.bits()); ++c) {
      const double v = emu::decode<double>(f.fmt, c);
      if (std::isfinite(v))
        m = std::max(m, static_cast<float>(std::fabs(v)));
    }
    for (std::uint32_t c = 0; c < (1u << f.fmt.bits()); ++c) {
      const double v = emu::decode<double>(f.fmt, c);
      if (std::isfinite(v))
        want.push_back(static_cast<float>(v) / m);
    }
    const auto& got = cb.values();
    for (int i = 1; i < kernels::codebook_size; ++i)
      ASSERT_LE(got[i - 1], got[i]) << i;
    for (float w : want)
      EXPECT_TRUE(std::find(got.begin(), got.end(), w) != got.end()) << "missing " << w;
    for (float g : got)
      EXPECT_TRUE(std::find(want.begin(), want.end(), g) != want.end()) << "extra " << g;
  }
}

TEST(format_sweep, verify_codes_of_every_format) {
  const auto xv = inputs(true);
  for (const auto& f : sweep::formats()) {
    SCOPED_TRACE(f.name);
    buffer codes(kernels::code_dtype(f.fmt), rows, cols), values(dtype::float64, rows, cols);
    for (std::int64_t i = 0; i < count; ++i) {
      codes.set_code(i, emu::encode(f.fmt, xv[static_cast<std::size_t>(i)], emu::rne_sat));
      const double v = emu::decode<double>(f.fmt, codes.code(i));
      std::memcpy(values.bytes.data() + i * 8, &v, 8);
    }
    // verify.hpp: without a format, code arrays are refused (whatever the format).
    EXPECT_THROW(verify::compare(codes.view(), codes.view(), verify::exact()), error);
    outcome o;
    verify::policy p = verify::exact();
    p.format = f.fmt;
    verify::report same, vs_values, tampered;
    try {
      same = verify::compare(codes.view(), codes.view(), p);
      vs_values = verify::compare(codes.view(), values.view(), verify::ulp(0, f.fmt));
      buffer bad = codes;
      bad.set_code(0, f.fmt.max_code());
      buffer ref = codes;
      ref.set_code(0, 0u);
      tampered = verify::compare(bad.view(), ref.view(), p);
    } catch (const error& e) {
      o.refused = true;
      o.message = e.what();
    }
    check_claim(fn::verify_codes, kernels::target::of(f.fmt), o);
    if (o.refused)
      continue;
    EXPECT_TRUE(same.ok()) << same;
    EXPECT_EQ(same.total, count);
    EXPECT_TRUE(vs_values.ok()) << vs_values;
    EXPECT_EQ(vs_values.total, count);
    EXPECT_EQ(tampered.failed, 1) << tampered;
  }
}

// The table itself: every function refuses something or accepts everything for a reason the
// header states, and the MX claim is exactly the five OCP floating-point element formats.
TEST(format_sweep, claims_table) {
  int mx = 0;
  for (const auto& f : sweep::formats())
    mx += sweep::claims(fn::quantize_mx, f.fmt) ? 1 : 0;
  EXPECT_EQ(mx, 5);
  EXPECT_TRUE(sweep::claims(fn::quantize_mx, emu::int8));
  EXPECT_FALSE(sweep::claims(fn::quantize_mx, emu::int8_sym));
  EXPECT_FALSE(sweep::claims(fn::quantize, emu::tfloat32));
  EXPECT_TRUE(sweep::claims(fn::quantize, emu::bfloat16));
  EXPECT_FALSE(sweep::claims(fn::decode_float32, emu::parse_format("e8m23b0")));
}

} // namespace
