// The scaled matmul's CPU twin (lowbit::kernels::scaled_matmul on CPU views) against the rule of
// kernels/include/lowbit/kernels/gemm.hpp, written out here from emu's decode alone: the exact
// int32 sum for int8, the float32 sum acc = acc + a*b over k = 0..K-1 for fp8 and 16-bit values,
// then acc * (sa * sb) for scalar scales or (acc * sb) * sa for per-row ones, + bias, and
// nearest-even to out's dtype. Random shapes (including 0),
// strided rows, every code (NaN, Inf, subnormals, -128), scales none/tensor/rows with 0,
// denormals and huge values, bias none/float32/bf16/fp16, out float32/bf16/fp16, one thread
// against two; an independent bound against the exact sum; and the argument checks, each
// message naming its argument.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/kernels/gemm.hpp>
#include <lowbit/proptest/generators.hpp>

#include "../common/gemm_kinds.hpp"
#include "support.hpp"

namespace {

namespace emu = lowbit::emu;
namespace kn = lowbit::kernels;
namespace pt = lowbit::proptest;
using kn::dtype;
using pt::test::check_property;

using namespace lowbit::proptest::gemm_kinds;

kn::tensor_view matrix(void* data, dtype t, std::int64_t rows, std::int64_t cols,
                       std::int64_t stride) {
  kn::tensor_view v;
  v.data = data;
  v.type = t;
  v.ndim = 2;
  v.shape = {rows, cols};
  v.strides = {stride, 1};
  return v;
}
kn::tensor_view vec(void* data, dtype t, std::int64_t n) {
  kn::tensor_view v;
  v.data = data;
  v.type = t;
  v.ndim = 1;
  v.shape = {n};
  v.strides = {1};
  return v;
}

// One operand's storage: raw codes (element size 1 or 2) with a row stride, and its scales.
struct operand_data {
  kind k;
  std::int64_t rows, cols, stride;
  std::vector<std::uint16_t> codes; // one element per slot, stored at the dtype's width below
  std::vector<unsigned char> bytes;
  std::vector<float> scales;

  std::uint32_t code(std::int64_t r, std::int64_t c) const { return codes[r * stride + c]; }
  // The exact value of an element (fp8 and 16-bit), from emu alone.
  double value(std::int64_t r, std::int64_t c) const {
    const std::uint32_t x = code(r, c);
    switch (k) {
    case kind::e4m3: return emu::decode<double>(emu::e4m3fn, x);
    case kind::e5m2: return emu::decode<double>(emu::e5m2, x);
    case kind::bf16: return emu::decode<double>(emu::bfloat16, x);
    case kind::f16: return emu::decode<double>(emu::float16, x);
    default: return static_cast<std::int8_t>(x);
    }
  }
  float scale(std::int64_t r) const {
    return scales.empty() ? 1.0f : scales[scales.size() == 1 ? 0 : r];
  }
  void pack() {
    const std::size_t es = kn::dtype_size(dtype_of(k));
    bytes.assign(codes.size() * es + 1, 0);
    for (std::size_t i = 0; i < codes.size(); ++i)
      std::memcpy(bytes.data() + i * es, &codes[i], es); // little-endian low bytes
  }
  kn::gemm_operand op() {
    kn::gemm_operand o;
    o.codes = matrix(bytes.data(), dtype_of(k), rows, cols, stride);
    o.fmt = target_of(k);
    o.scales = vec(scales.data(), dtype::float32, static_cast<std::int64_t>(scales.size()));
    return o;
  }
};

rc::Gen<float> any_scale() {
  return rc::gen::oneOf(rc::gen::element(0.0f, -0.0f, 1.0f, 0.5f, -2.0f, 1e-40f, 3e38f, 127.0f),
                        rc::gen::map(pt::uniform<int>(-30, 30), [](int e) {
                          return std::ldexp(1.0f + static_cast<float>(e & 7) / 8.0f, e);
                        }));
}

std::uint16_t any_code(kind k) {
  switch (k) {
  case kind::int8: return static_cast<std::uint8_t>(*pt::uniform<int>(-128, 127));
  case kind::int8_sym: return static_cast<std::uint8_t>(*pt::uniform<int>(-127, 127));
  case kind::e4m3:
  case kind::e5m2: return static_cast<std::uint16_t>(*pt::uniform<int>(0, 255));
  case kind::bf16:
  case kind::f16: {
    // Mostly moderate magnitudes (sums of them stay finite); sometimes any pattern.
    if (*pt::uniform<int>(0, 9) == 0)
      return static_cast<std::uint16_t>(*pt::uniform<int>(0, 65535));
    const float v = static_cast<float>(*pt::uniform<int>(-4096, 4096)) / 256.0f;
    return static_cast<std::uint16_t>(
        emu::encode(k == kind::bf16 ? emu::bfloat16 : emu::float16, v, emu::rne));
  }
  }
  return 0;
}

operand_data make_operand(kind k, std::int64_t rows, std::int64_t cols, bool scaled) {
  operand_data d;
  d.k = k;
  d.rows = rows;
  d.cols = cols;
  d.stride = cols + *pt::uniform<int>(0, 3);
  d.codes.assign(static_cast<std::size_t>(std::max<std::int64_t>(rows, 1) * d.stride), 0x5A);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      d.codes[r * d.stride + c] = any_code(k);
  if (scaled) {
    const int mode = *pt::uniform<int>(0, 2);
    const std::int64_t ns = mode == 0 ? 0 : (mode == 1 ? 1 : rows);
    for (std::int64_t i = 0; i < ns; ++i)
      d.scales.push_back(*any_scale());
  }
  d.pack();
  return d;
}

// The rule's float32 accumulator of one output, written out directly.
float rule_acc(const operand_data& a, const operand_data& b, std::int64_t m, std::int64_t n) {
  if (is_int(a.k)) {
    std::int64_t s = 0;
    for (std::int64_t k = 0; k < a.cols; ++k)
      s += static_cast<std::int8_t>(a.code(m, k)) * static_cast<std::int8_t>(b.code(n, k));
    return static_cast<float>(s);
  }
  float acc = 0.0f;
  for (std::int64_t k = 0; k < a.cols; ++k) {
    const float x = static_cast<float>(a.value(m, k)), y = static_cast<float>(b.value(n, k));
    const float prod = x * y;
    acc = acc + prod;
  }
  return acc;
}

// Nearest-even to out's dtype; every NaN is the positive quiet NaN (gemm.hpp's rule).
std::uint32_t round_to(dtype t, float v) {
  if (std::isnan(v))
    return t == dtype::bfloat16 ? 0x7FC0u : (t == dtype::float16 ? 0x7E00u : 0x7FC00000u);
  if (t == dtype::bfloat16)
    return emu::encode(emu::bfloat16, v, emu::rne);
  if (t == dtype::float16)
    return emu::encode(emu::float16, v, emu::rne);
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

std::uint32_t out_bits(const std::vector<unsigned char>& out, dtype t, std::int64_t i) {
  if (t == dtype::float32) {
    std::uint32_t u;
    std::memcpy(&u, out.data() + 4 * i, 4);
    return u;
  }
  std::uint16_t u;
  std::memcpy(&u, out.data() + 2 * i, 2);
  return u;
}

struct bias_data {
  dtype t = dtype::float32;
  std::vector<unsigned char> bytes;
  std::int64_t n = 0;
  float value(std::int64_t i) const {
    if (n == 0)
      return 0.0f;
    if (t == dtype::float32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    std::uint16_t u;
    std::memcpy(&u, bytes.data() + 2 * i, 2);
    return static_cast<float>(
        emu::decode<double>(t == dtype::bfloat16 ? emu::bfloat16 : emu::float16, u));
  }
};

bias_data make_bias(std::int64_t n) {
  bias_data b;
  const int mode = *pt::uniform<int>(0, 3);
  if (mode == 0)
    return b;
  b.t = mode == 1 ? dtype::float32 : (mode == 2 ? dtype::bfloat16 : dtype::float16);
  b.n = n;
  b.bytes.resize(static_cast<std::size_t>(n) * kn::dtype_size(b.t) + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(*pt::uniform<int>(-1000, 1000)) / 64.0f;
    const std::uint32_t bits = round_to(b.t, v);
    std::memcpy(b.bytes.data() + i * kn::dtype_size(b.t), &bits, kn::dtype_size(b.t));
  }
  return b;
}

kind partner(kind k) {
  switch (k) {
  case kind::int8:
  case kind::int8_sym: return *rc::gen::element(kind::int8, kind::int8_sym);
  case kind::e4m3:
  case kind::e5m2: return *rc::gen::element(kind::e4m3, kind::e5m2);
  default: return k;
  }
}

// The whole rule against the twin, bitwise, for one random problem; one thread and two.
void twin_follows_rule() {
  const kind ka =
      *rc::gen::element(kind::int8, kind::int8_sym, kind::e4m3, kind::e5m2, kind::bf16, kind::f16);
  const kind kb = partner(ka);
  const std::int64_t m = *pt::uniform<int>(0, 9), n = *pt::uniform<int>(0, 9);
  const std::int64_t k = *rc::gen::element(0, 1, 2, 7, 16, 33, 100);
  operand_data a = make_operand(ka, m, k, true), b = make_operand(kb, n, k, true);
  bias_data bias = make_bias(n);
  const dtype ot = *rc::gen::element(dtype::float32, dtype::bfloat16, dtype::float16);
  const std::int64_t os = n + *pt::uniform<int>(0, 2);
  const std::size_t obytes =
      static_cast<std::size_t>(std::max<std::int64_t>(m, 1) * os) * kn::dtype_size(ot);
  for (int threads : {1, 2}) {
    std::vector<unsigned char> out(obytes, 0xEE);
    kn::exec ex;
    ex.threads = threads;
    kn::scaled_matmul(a.op(), b.op(), vec(bias.bytes.data(), bias.t, bias.n),
                      matrix(out.data(), ot, m, n, os), {}, ex);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        std::uint32_t want;
        if (k == 0) {
          want = round_to(ot, bias.value(j));
        } else {
          // Scalar scales (one or none each) as one factor, else B's scale first.
          const float acc = rule_acc(a, b, i, j);
          float v;
          if (a.scales.size() <= 1 && b.scales.size() <= 1) {
            const float s = a.scale(i) * b.scale(j);
            v = acc * s;
          } else {
            v = acc * b.scale(j);
            v = v * a.scale(i);
          }
          v = v + bias.value(j);
          want = round_to(ot, v);
        }
        const std::uint32_t got = out_bits(out, ot, i * os + j);
        RC_ASSERT(got == want);
      }
      // The padding between rows of out is never written.
      for (std::int64_t j = n; j < os; ++j)
        RC_ASSERT(out[static_cast<std::size_t>((i * os + j) * kn::dtype_size(ot))] == 0xEE);
    }
  }
}

TEST(gemm_twin, follows_the_rule_bitwise) {
  check_property("gemm_twin.rule", 400, twin_follows_rule);
}

// Independent of the order: with unit scales, no bias and float32 out, each output is within
// (K-1) u sum|a_k b_k| of the exact sum (u = 2^-24; products of fp8 values are exact in float32,
// and each of the K-1 additions errs by at most u times its result's magnitude, itself at most
// the running sum of magnitudes), for finite inputs whose sums stay in float's normal range.
TEST(gemm_twin, within_the_float32_sum_bound_of_the_exact_sum) {
  check_property("gemm_twin.bound", 200, [] {
    const kind ka = *rc::gen::element(kind::e4m3, kind::e5m2);
    const kind kb = partner(ka);
    const std::int64_t m = *pt::uniform<int>(1, 5), n = *pt::uniform<int>(1, 5);
    const std::int64_t k = *pt::uniform<int>(1, 300);
    operand_data a = make_operand(ka, m, k, false), b = make_operand(kb, n, k, false);
    // Finite codes only, no subnormal sums: clear NaN/Inf codes to 1.0.
    for (operand_data* d : {&a, &b}) {
      for (auto& c : d->codes) {
        const emu::format f = d->k == kind::e4m3 ? emu::e4m3fn : emu::e5m2;
        if (emu::is_nan_code(f, c) || emu::is_inf_code(f, c))
          c = static_cast<std::uint16_t>(emu::encode(f, 1.0, emu::rne));
      }
      d->pack();
    }
    std::vector<float> out(static_cast<std::size_t>(m * n));
    kn::scaled_matmul(a.op(), b.op(), vec(nullptr, dtype::float32, 0),
                      matrix(out.data(), dtype::float32, m, n, n));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double exact = 0, mag = 0; // exact: fp8 products have <= 8 significant bits, K <= 300
        for (std::int64_t t = 0; t < k; ++t) {
          exact += a.value(i, t) * b.value(j, t);
          mag += std::fabs(a.value(i, t) * b.value(j, t));
        }
        const double bound = static_cast<double>(k - 1) * std::ldexp(1.0, -24) * mag +
                             std::ldexp(1.0, -149) * static_cast<double>(k);
        RC_ASSERT(std::fabs(static_cast<double>(out[i * n + j]) - exact) <= bound);
      }
  });
}

// Exact cases whose value is known without the rule: int8 extremes at the K limit.
TEST(gemm_twin, int8_sums_at_the_k_limit_are_exact) {
  const std::int64_t k = 131071;
  std::vector<std::int8_t> a(k, -128), b(k, -128);
  float out = 0;
  kn::gemm_operand oa{vec(a.data(), dtype::int8, k), kn::target::of(emu::int8), {}};
  kn::gemm_operand ob{vec(b.data(), dtype::int8, k), kn::target::of(emu::int8), {}};
  kn::scaled_matmul(oa, ob, {}, matrix(&out, dtype::float32, 1, 1, 1));
  EXPECT_EQ(out, static_cast<float>(std::int64_t{k} * 16384));
  b.assign(k, 127);
  kn::scaled_matmul(oa, ob, {}, matrix(&out, dtype::float32, 1, 1, 1));
  EXPECT_EQ(out, static_cast<float>(-std::int64_t{k} * 16256));
}

TEST(gemm_twin, nan_and_inf_propagate) {
  // e4m3fn 0x7F is NaN, e5m2 0x7C is +Inf: NaN * x and Inf * 0 make NaN; Inf * 1 stays Inf.
  std::vector<std::uint8_t> a = {0x7F, 0x38}, b = {0x38, 0x38}; // NaN, 1.0 | 1.0, 1.0
  std::vector<std::uint8_t> c = {0x7C, 0x3C};                   // e5m2: Inf, 1.0
  float out[2] = {0, 0};
  kn::gemm_operand oa{matrix(a.data(), dtype::uint8, 1, 2, 2), kn::target::of(emu::e4m3fn), {}};
  kn::gemm_operand ob{matrix(b.data(), dtype::uint8, 1, 2, 2), kn::target::of(emu::e4m3fn), {}};
  kn::gemm_operand oc{matrix(c.data(), dtype::uint8, 1, 2, 2), kn::target::of(emu::e5m2), {}};
  kn::scaled_matmul(oa, ob, {}, matrix(out, dtype::float32, 1, 1, 1));
  EXPECT_TRUE(std::isnan(out[0]));
  std::vector<std::uint8_t> d = {0x38, 0x38};
  kn::gemm_operand od{matrix(d.data(), dtype::uint8, 1, 2, 2), kn::target::of(emu::e4m3fn), {}};
  kn::scaled_matmul(od, oc, {}, matrix(out, dtype::float32, 1, 1, 1));
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
  // A zero scale times an Inf sum is NaN (the epilogue's float operations, nothing special).
  float zero = 0.0f;
  od.scales = vec(&zero, dtype::float32, 1);
  kn::scaled_matmul(od, oc, {}, matrix(out, dtype::float32, 1, 1, 1));
  EXPECT_TRUE(std::isnan(out[0]));
}

// ---- argument checks ----------------------------------------------------------------------

struct checks : ::testing::Test {
  std::vector<std::int8_t> a = std::vector<std::int8_t>(4 * 32, 1);
  std::vector<std::int8_t> b = std::vector<std::int8_t>(3 * 32, 1);
  std::vector<float> sa = std::vector<float>(4, 1.0f), sb = std::vector<float>(3, 1.0f);
  std::vector<float> bias = std::vector<float>(3, 0.0f), out = std::vector<float>(4 * 3, 0.0f);
  kn::gemm_operand oa{matrix(a.data(), dtype::int8, 4, 32, 32), kn::target::of(emu::int8),
                      vec(sa.data(), dtype::float32, 4)};
  kn::gemm_operand ob{matrix(b.data(), dtype::int8, 3, 32, 32), kn::target::of(emu::int8_sym),
                      vec(sb.data(), dtype::float32, 3)};
  kn::tensor_view bv = vec(bias.data(), dtype::float32, 3);
  kn::tensor_view ov = matrix(out.data(), dtype::float32, 4, 3, 3);

  // Runs the call and returns its error's message ("" when it did not throw).
  std::string message(lowbit::errc want) {
    try {
      kn::scaled_matmul(oa, ob, bv, ov);
    } catch (const lowbit::error& e) {
      EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(want)) << e.what();
      return e.what();
    }
    return "";
  }
};

#define EXPECT_REFUSED(errc_value, arg)                                                            \
  do {                                                                                             \
    const std::string msg = message(lowbit::errc::errc_value);                                     \
    EXPECT_EQ(msg.rfind(arg, 0), 0u) << "message: '" << msg << "' should start with " << arg;      \
  } while (0)

TEST_F(checks, block_sizes_near_int64_max_are_one_block) {
  // ceil(K / block) was (K + block - 1) / block, which overflowed for such blocks: the check
  // then asked for no scales, and the empty ones reached the kernel as a null pointer.
  ob.block_rows = 1;
  ob.block_k = INT64_MAX;
  ob.scales = kn::tensor_view{};
  EXPECT_REFUSED(invalid_argument, "b.scales");
  ob.scales = matrix(sb.data(), dtype::float32, 3, 1, 1); // one block per row: K in one
  EXPECT_EQ(message(lowbit::errc::invalid_argument), "");
}

TEST_F(checks, the_good_call_runs) {
  EXPECT_EQ(message(lowbit::errc::invalid_argument), "");
  EXPECT_EQ(out[0], 32.0f);
}

TEST_F(checks, formats_and_dtypes) {
  oa.fmt = kn::target::of(emu::e4m3fnuz);
  EXPECT_REFUSED(invalid_argument, "a.fmt");
  oa.fmt = kn::target::of(emu::e4m3fn); // codes are int8, e4m3fn wants uint8
  EXPECT_REFUSED(invalid_type, "a.codes");
  oa.fmt = kn::target::of(emu::uint8);
  EXPECT_REFUSED(invalid_argument, "a.fmt");
}

TEST_F(checks, operands_of_one_kind) {
  std::vector<std::uint8_t> c(3 * 32, 0x38);
  ob.codes = matrix(c.data(), dtype::uint8, 3, 32, 32);
  ob.fmt = kn::target::of(emu::e4m3fn);
  EXPECT_REFUSED(invalid_argument, "b.fmt");
  std::vector<std::uint16_t> h(3 * 32, 0x3C00);
  ob.codes = matrix(h.data(), dtype::float16, 3, 32, 32);
  ob.fmt = kn::target::of(emu::float16);
  EXPECT_REFUSED(invalid_argument, "b.fmt");
  std::vector<std::uint16_t> g(4 * 32, 0x3F80);
  oa.codes = matrix(g.data(), dtype::bfloat16, 4, 32, 32);
  oa.fmt = kn::target::of(emu::bfloat16);
  EXPECT_REFUSED(invalid_argument, "b.fmt"); // bf16 with fp16: not one format
  oa.codes = matrix(g.data(), dtype::float16, 4, 32, 32);
  oa.fmt = kn::target::of(emu::float16);
  EXPECT_EQ(message(lowbit::errc::invalid_argument), ""); // the same 16-bit format: runs
  EXPECT_EQ(out[0], 32.0f * 1.875f);                      // fp16 0x3F80 is 1.875
}

TEST_F(checks, k_must_match) {
  ob.codes = matrix(b.data(), dtype::int8, 3, 31, 32);
  EXPECT_REFUSED(invalid_argument, "b.codes: K");
}

TEST_F(checks, scales) {
  oa.scales = vec(sa.data(), dtype::float32, 3);
  EXPECT_REFUSED(invalid_argument, "a.scales");
  oa.scales = vec(sa.data(), dtype::float16, 4);
  EXPECT_REFUSED(invalid_type, "a.scales");
  oa.scales = matrix(sa.data(), dtype::float32, 2, 2, 3); // 4 elements, not contiguous
  EXPECT_REFUSED(invalid_argument, "a.scales");
  oa.scales = vec(nullptr, dtype::float32, 4);
  EXPECT_REFUSED(invalid_argument, "a.scales");
  oa.scales = {}; // a default view: no scales
  ob.scales = vec(sb.data(), dtype::float32, 1);
  EXPECT_EQ(message(lowbit::errc::invalid_argument), "");
  ob.scales = vec(sb.data(), dtype::float32, 2);
  EXPECT_REFUSED(invalid_argument, "b.scales");
}

TEST_F(checks, bias) {
  bv = vec(bias.data(), dtype::float32, 2);
  EXPECT_REFUSED(invalid_argument, "bias");
  bv = vec(bias.data(), dtype::float64, 3);
  EXPECT_REFUSED(invalid_type, "bias");
  bv = matrix(bias.data(), dtype::float32, 3, 1, 2);
  EXPECT_REFUSED(invalid_argument, "bias");
  bv = {};
  EXPECT_EQ(message(lowbit::errc::invalid_argument), "");
}

TEST_F(checks, out) {
  ov = matrix(out.data(), dtype::float32, 3, 4, 4);
  EXPECT_REFUSED(invalid_argument, "out");
  ov = matrix(out.data(), dtype::int32, 4, 3, 3);
  EXPECT_REFUSED(invalid_type, "out");
  ov.type = dtype::float32;
  ov.strides = {1, 4}; // N not contiguous
  EXPECT_REFUSED(invalid_argument, "out");
  ov = matrix(nullptr, dtype::float32, 4, 3, 3);
  EXPECT_REFUSED(invalid_argument, "out");
}

TEST_F(checks, one_device) {
  ov.dev = {kn::device_type::cuda, 0};
  EXPECT_REFUSED(invalid_argument, "a.codes");
  ov.dev = {};
  ob.scales.dev = {kn::device_type::cuda, 0};
  EXPECT_REFUSED(invalid_argument, "b.codes");
}

TEST_F(checks, int8_k_limit_before_any_read) {
  // Null data: the K limit is refused before the data pointers are looked at.
  oa.codes = matrix(nullptr, dtype::int8, 4, 131072, 131072);
  ob.codes = matrix(nullptr, dtype::int8, 3, 131072, 131072);
  ob.fmt = kn::target::of(emu::int8);
  EXPECT_REFUSED(invalid_argument, "a.codes: K = 131072 exceeds 131071");
  // int8_sym too: its codes may hold -128 when made elsewhere (K = 131072 of them overflows).
  oa.fmt = ob.fmt = kn::target::of(emu::int8_sym);
  EXPECT_REFUSED(invalid_argument, "a.codes: K = 131072 exceeds 131071");
  oa.codes.shape[1] = ob.codes.shape[1] = 131071; // within the limit: the null data is refused
  EXPECT_REFUSED(invalid_argument, "a.codes: null data");
}

TEST_F(checks, empty_problems) {
  // K = 0: out = round(bias), scales not read (NaN scales change nothing).
  sa.assign(4, std::numeric_limits<float>::quiet_NaN());
  bias = {1.5f, -2.0f, 3.0f};
  oa.codes = matrix(a.data(), dtype::int8, 4, 0, 0);
  ob.codes = matrix(b.data(), dtype::int8, 3, 0, 0);
  EXPECT_EQ(message(lowbit::errc::invalid_argument), "");
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(out[i * 3 + j], bias[j]);
  bv = {};
  EXPECT_EQ(message(lowbit::errc::invalid_argument), "");
  for (float v : out)
    EXPECT_TRUE(v == 0.0f && !std::signbit(v));
  // M = 0: nothing written, nothing refused.
  oa.codes = matrix(a.data(), dtype::int8, 0, 32, 32);
  oa.scales = {};
  ov = matrix(out.data(), dtype::float32, 0, 3, 3);
  ob.codes = matrix(b.data(), dtype::int8, 3, 32, 32);
  EXPECT_EQ(message(lowbit::errc::invalid_argument), "");
}

TEST(gemm_twin, backend_names_and_cpu_choice) {
  EXPECT_STREQ(kn::gemm_backend_name(kn::gemm_backend::automatic), "automatic");
  EXPECT_STREQ(kn::gemm_backend_name(kn::gemm_backend::simt), "simt");
  EXPECT_STREQ(kn::gemm_backend_name(kn::gemm_backend::cublaslt), "cublaslt");
  EXPECT_STREQ(kn::gemm_backend_name(kn::gemm_backend::cutlass), "cutlass");
  EXPECT_STREQ(kn::gemm_backend_name(kn::gemm_backend::widened), "widened");
  std::vector<std::uint8_t> a(6, 0x38);
  float out[4];
  kn::gemm_operand o{matrix(a.data(), dtype::uint8, 2, 3, 3), kn::target::of(emu::e5m2), {}};
  EXPECT_EQ(kn::gemm_backend_for(o, o, matrix(out, dtype::float32, 2, 2, 2)),
            kn::gemm_backend::simt);
  // CPU views run the twin whatever the options ask.
  kn::gemm_options opt;
  opt.backend = kn::gemm_backend::cublaslt;
  kn::scaled_matmul(o, o, {}, matrix(out, dtype::float32, 2, 2, 2), opt);
  EXPECT_EQ(out[0], 0.75f); // e5m2 0x38 is 0.5: three products of 0.25
}

} // namespace
