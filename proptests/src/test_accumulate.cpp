// The accumulation models of emu/accumulate.hpp against reference::accumulate_exactly (the same
// definition over rationals), bit for bit, on random and adversarial products: fp8 products,
// exponents spread over float32's range, float32 subnormals, cancellation, one large product
// among tiny ones at chosen gaps, sums near overflow, NaN and Inf, K up to 2000. Then the special
// cases that tie the block model to the float32 sum, and the GEMM twin's use of a model
// (kernels::gemm_options::accumulation) with its argument checks.
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <lowbit/emu/accumulate.hpp>
#include <lowbit/emu/emu.hpp>
#include <lowbit/kernels/gemm.hpp>
#include <lowbit/reference/accumulate.hpp>

#include "support.hpp"

namespace {

namespace emu = lowbit::emu;
namespace kn = lowbit::kernels;
namespace ref = lowbit::reference;
using lowbit::proptest::test::check_property;

std::uint32_t bits_of(float x) {
  std::uint32_t b = 0;
  std::memcpy(&b, &x, 4);
  return b;
}
float float_of(std::uint32_t b) {
  float x = 0;
  std::memcpy(&x, &b, 4);
  return x;
}

// One product of the chosen kind (rng drives the bulk; rapidcheck picks the kind and the seed).
float product(int kind, std::mt19937& rng, int gap) {
  auto u = [&](std::uint32_t lo, std::uint32_t hi) {
    return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng);
  };
  const std::uint32_t sign = u(0, 1) << 31;
  switch (kind) {
  case 0: { // an exact e4m3 x e5m2 product (finite codes)
    std::uint8_t ca = 0, cb = 0;
    do
      ca = static_cast<std::uint8_t>(u(0, 255));
    while ((ca & 0x7F) == 0x7F);
    do
      cb = static_cast<std::uint8_t>(u(0, 255));
    while ((cb & 0x7C) == 0x7C);
    return emu::decode<float>(emu::e4m3fn, ca) * emu::decode<float>(emu::e5m2, cb);
  }
  case 1: // any finite float32 whose exponent field is below 2^101 (sums cannot overflow)
    return float_of(sign | (u(0, 227) << 23) | u(0, 0x7FFFFF));
  case 2: // float32 subnormals and the smallest normals
    return float_of(sign | (u(0, 2) << 23) | u(0, 0x7FFFFF));
  case 3: // one large product (the first) among tiny ones gap binades below
    return float_of(sign |
                    (static_cast<std::uint32_t>(127 - gap - static_cast<int>(u(0, 2))) << 23) |
                    u(0, 0x7FFFFF));
  case 4: // near the overflow threshold, mostly one sign
    return float_of((u(0, 9) == 0 ? sign : 0) | (u(250, 254) << 23) | u(0, 0x7FFFFF));
  default: { // short significands (8 bits), exponents near each other: many exact cancellations
    const float v = std::ldexp(static_cast<float>(u(1, 255)), static_cast<int>(u(0, 12)) - 10);
    return sign ? -v : v;
  }
  }
}

std::vector<float> products(std::int64_t k) {
  const int kind = *rc::gen::inRange(0, 6);
  const int gap = *rc::gen::inRange(0, 46);
  const bool specials = *rc::gen::inRange(0, 8) == 0;
  std::mt19937 rng(*rc::gen::arbitrary<std::uint32_t>());
  std::vector<float> p(static_cast<std::size_t>(k));
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = i == 0 && kind == 3 ? 1.0f : product(kind, rng, gap);
    if (kind == 5 && i % 2 == 1 && rng() % 2 == 0)
      p[i] = -p[i - 1]; // exact cancellation of the previous product
    if (specials && rng() % 64 == 0) {
      const float s[] = {INFINITY, -INFINITY, NAN};
      p[i] = s[rng() % 3];
    }
  }
  return p;
}

emu::accumulation model() {
  const int k = *rc::gen::oneOf(rc::gen::element(1, 2, 4, 8, 16, 32, 64), rc::gen::inRange(1, 65));
  const int f = *rc::gen::inRange(0, emu::accumulation_max_fraction_bits + 1);
  const bool align = *rc::gen::arbitrary<bool>();
  const auto t =
      *rc::gen::element(emu::term_rounding::toward_zero, emu::term_rounding::nearest_even);
  const auto r =
      *rc::gen::element(emu::register_rounding::nearest_even, emu::register_rounding::toward_zero);
  const int n = *rc::gen::oneOf(rc::gen::just(0), rc::gen::inRange(1, 9));
  // A float32 register half of the time, else a narrower one (Hopper's is 14 bits).
  const int rb = *rc::gen::oneOf(rc::gen::just(24), rc::gen::inRange(1, 25));
  const auto e =
      *rc::gen::element(emu::product_exponent::of_product, emu::product_exponent::of_operands,
                        emu::product_exponent::of_operand_fields);
  return emu::block_fixed_point(k, f, align, t, r, n, rb, e);
}

// Operands whose products are exact in float32: e4m3 codes times e4m3 or e5m2 codes (finite),
// with runs of the formats' subnormals; and the formats' minimum exponents.
struct operand_pair {
  std::vector<float> a, b;
  int emin_a, emin_b;
};
operand_pair operands(std::int64_t k) {
  const bool e5m2 = *rc::gen::arbitrary<bool>();
  const bool subnormals = *rc::gen::inRange(0, 4) == 0;
  std::mt19937 rng(*rc::gen::arbitrary<std::uint32_t>());
  std::vector<float> a(static_cast<std::size_t>(k)), b(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::uint8_t ca = 0, cb = 0;
    do
      ca = static_cast<std::uint8_t>(rng() & (subnormals && rng() % 2 ? 0x87u : 0xFFu));
    while ((ca & 0x7F) == 0x7F);
    do
      cb = static_cast<std::uint8_t>(rng() & (subnormals && rng() % 2 ? 0x83u : 0xFFu));
    while (e5m2 ? (cb & 0x7C) == 0x7C : (cb & 0x7F) == 0x7F);
    a[i] = emu::decode<float>(emu::e4m3fn, ca);
    b[i] = emu::decode<float>(e5m2 ? emu::e5m2 : emu::e4m3fn, cb);
  }
  return {a, b, emu::e4m3fn.emin(), (e5m2 ? emu::e5m2 : emu::e4m3fn).emin()};
}

std::int64_t length() {
  return *rc::gen::oneOf(rc::gen::inRange(0, 100), rc::gen::inRange(100, 2001));
}

void expect_same(float got, float want) {
  if (std::isnan(want))
    RC_ASSERT(std::isnan(got));
  else
    RC_ASSERT(bits_of(got) == bits_of(want));
}

TEST(accumulate, block_model_equals_its_rational_definition) {
  check_property("accumulate.block_vs_rational", 400, [] {
    const emu::accumulation m = model();
    const std::vector<float> p = products(length());
    const float got = emu::accumulate(m, p.data(), static_cast<std::int64_t>(p.size()));
    RC_TAG(m.block, m.fraction_bits);
    expect_same(got, ref::accumulate_exactly(m, p));
  });
}

// The operands' form (add(a, b)), both exponent rules and narrow registers included.
TEST(accumulate, operand_form_equals_its_rational_definition) {
  check_property("accumulate.operands_vs_rational", 300, [] {
    const emu::accumulation m = model();
    const auto [a, b, emin_a, emin_b] = operands(length());
    emu::accumulator acc(m, emin_a, emin_b);
    for (std::size_t i = 0; i < a.size(); ++i)
      acc.add(a[i], b[i]);
    RC_TAG(m.block, m.register_bits);
    expect_same(acc.finish(), ref::accumulate_exactly(m, a, b, emin_a, emin_b));
  });
}

TEST(accumulate, fp32_sequential_equals_its_rational_definition) {
  check_property("accumulate.sequential_vs_rational", 200, [] {
    const std::vector<float> p = products(length());
    expect_same(emu::accumulate(emu::fp32_sequential_accumulation, p.data(),
                                static_cast<std::int64_t>(p.size())),
                ref::accumulate_exactly(emu::fp32_sequential_accumulation, p));
  });
}

// Blocks of one product with f >= 23 keep each product whole, and promoting every block adds it
// to the float32 accumulator: the float32 sequential sum, whatever the products.
TEST(accumulate, one_product_blocks_at_full_precision_are_the_float32_sum) {
  check_property("accumulate.k1_is_sequential", 300, [] {
    const int f = *rc::gen::inRange(23, emu::accumulation_max_fraction_bits + 1);
    const auto t =
        *rc::gen::element(emu::term_rounding::toward_zero, emu::term_rounding::nearest_even);
    const emu::accumulation m =
        emu::block_fixed_point(1, f, false, t, emu::register_rounding::nearest_even, 1);
    const std::vector<float> p = products(length());
    const auto n = static_cast<std::int64_t>(p.size());
    expect_same(emu::accumulate(m, p.data(), n),
                emu::accumulate(emu::fp32_sequential_accumulation, p.data(), n));
  });
}

// With f = 40 and promotion after every block, a block of small integers is summed exactly and
// rounded once; where the float32 sequential sum is exact (integers below 2^24) both equal it.
TEST(accumulate, full_precision_blocks_equal_an_exact_float32_sum) {
  check_property("accumulate.exact_where_sequential_is", 300, [] {
    const int k = *rc::gen::inRange(1, 65);
    const bool align = *rc::gen::arbitrary<bool>();
    const emu::accumulation m = emu::block_fixed_point(
        k, 40, align, emu::term_rounding::toward_zero, emu::register_rounding::toward_zero, 1);
    const auto v = *rc::gen::container<std::vector<int>>(rc::gen::inRange(-4096, 4097));
    std::vector<float> p(v.begin(), v.end());
    const auto n = static_cast<std::int64_t>(p.size());
    const float seq = emu::accumulate(emu::fp32_sequential_accumulation, p.data(), n);
    long long exact = 0;
    for (const int x : v)
      exact += x;
    RC_ASSERT(static_cast<double>(seq) == static_cast<double>(exact));
    RC_ASSERT(emu::accumulate(m, p.data(), n) == seq);
  });
}

// The mechanism the model stands for: with truncation a product more than f bits below the
// block's largest vanishes, and one within f bits survives.
TEST(accumulate, truncation_drops_products_below_the_grid) {
  for (int f = 0; f <= 30; ++f)
    for (int g = 1; g <= 40; ++g) {
      const float p[2] = {1.0f, std::ldexp(1.0f, -g)};
      const emu::accumulation m = emu::block_fixed_point(
          2, f, false, emu::term_rounding::toward_zero, emu::register_rounding::nearest_even, 0);
      const float want = g <= f && g <= 23 ? 1.0f + std::ldexp(1.0f, -g) : 1.0f;
      EXPECT_EQ(emu::accumulate(m, p, 2), want) << "f " << f << " gap " << g;
      // In blocks of one the small product is aligned on its own: kept (a float32 add).
      const emu::accumulation m1 = emu::block_fixed_point(
          1, f, false, emu::term_rounding::toward_zero, emu::register_rounding::nearest_even, 0);
      EXPECT_EQ(emu::accumulate(m1, p, 2), 1.0f + std::ldexp(1.0f, -g)) << "f " << f;
    }
}

// A narrow register written toward zero just below a power of two lands on the finer grid of
// the binade below: 1 - 2^-60 in a 4-bit register is 15/16, in float32 1 - 2^-24.
TEST(accumulate, narrow_register_below_a_power_of_two) {
  const float p[2] = {1.0f, -std::ldexp(1.0f, -60)};
  for (const int bits : {4, 14, 24}) {
    const emu::accumulation m = emu::block_fixed_point(
        1, 40, false, emu::term_rounding::toward_zero, emu::register_rounding::toward_zero, 0, bits,
        emu::product_exponent::of_product);
    const float want = 1.0f - std::ldexp(1.0f, -bits);
    EXPECT_EQ(emu::accumulate(m, p, 2), want) << "bits " << bits;
    EXPECT_EQ(ref::accumulate_exactly(m, {p[0], p[1]}), want) << "bits " << bits;
  }
}

TEST(accumulate, validity) {
  EXPECT_TRUE(emu::is_valid(emu::fp32_sequential_accumulation));
  EXPECT_TRUE(emu::is_valid(emu::exact_accumulation));
  using emu::register_rounding, emu::term_rounding;
  EXPECT_FALSE(emu::is_valid(emu::block_fixed_point(0, 10, false, term_rounding::toward_zero,
                                                    register_rounding::nearest_even, 0)));
  EXPECT_FALSE(emu::is_valid(emu::block_fixed_point(65, 10, false, term_rounding::toward_zero,
                                                    register_rounding::nearest_even, 0)));
  EXPECT_FALSE(emu::is_valid(emu::block_fixed_point(4, 41, false, term_rounding::toward_zero,
                                                    register_rounding::nearest_even, 0)));
  EXPECT_FALSE(emu::is_valid(emu::block_fixed_point(4, 10, false, term_rounding::toward_zero,
                                                    register_rounding::nearest_even, -1)));
  EXPECT_FALSE(emu::is_valid(emu::block_fixed_point(4, 10, false, term_rounding::toward_zero,
                                                    register_rounding::nearest_even, 0, 0,
                                                    emu::product_exponent::of_product)));
  EXPECT_FALSE(emu::is_valid(emu::block_fixed_point(4, 10, false, term_rounding::toward_zero,
                                                    register_rounding::nearest_even, 0, 25,
                                                    emu::product_exponent::of_product)));
  EXPECT_TRUE(emu::is_valid(emu::hopper_fp8_accumulation(true)));
  EXPECT_TRUE(emu::is_valid(emu::hopper_fp8_accumulation(false)));
  EXPECT_TRUE(std::isnan(emu::accumulate(emu::exact_accumulation, nullptr, 0)));
  EXPECT_THROW(ref::accumulate_exactly(emu::exact_accumulation, {}), lowbit::error);
}

// ---- the GEMM twin with a model ----------------------------------------------------------------

kn::tensor_view matrix(void* data, kn::dtype t, std::int64_t rows, std::int64_t cols) {
  kn::tensor_view v;
  v.data = data;
  v.type = t;
  v.ndim = 2;
  v.shape = {rows, cols};
  v.strides = {cols, 1};
  return v;
}

// Runs the twin under model m on A (M x K codes of fa) and B (N x K codes of fb), stored as t,
// and asserts that each output is the model's accumulate over its exact products in k order
// (unit scales, no bias, float32 out: the sum itself; every NaN the positive quiet NaN).
template <class Code>
void assert_twin_sums_are_the_model(const emu::accumulation& m, emu::format fa, emu::format fb,
                                    kn::dtype t, std::vector<Code> a, std::vector<Code> b,
                                    std::int64_t M, std::int64_t N, std::int64_t K) {
  std::vector<float> out(static_cast<std::size_t>(M * N));
  kn::gemm_operand oa{matrix(a.data(), t, M, K), emu::target(fa), {}};
  kn::gemm_operand ob{matrix(b.data(), t, N, K), emu::target(fb), {}};
  kn::gemm_options opt;
  opt.accumulation = m;
  kn::scaled_matmul(oa, ob, kn::tensor_view{}, matrix(out.data(), kn::dtype::float32, M, N), opt);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      std::vector<float> x(static_cast<std::size_t>(K)), y(x.size());
      for (std::int64_t q = 0; q < K; ++q) {
        x[static_cast<std::size_t>(q)] =
            emu::decode<float>(fa, a[static_cast<std::size_t>(i * K + q)]);
        y[static_cast<std::size_t>(q)] =
            emu::decode<float>(fb, b[static_cast<std::size_t>(j * K + q)]);
      }
      float want = emu::accumulate(m, x.data(), y.data(), K, fa.emin(), fb.emin());
      if (std::isnan(want))
        want = float_of(0x7FC00000u); // the GEMM writes every NaN as the positive quiet NaN
      RC_ASSERT(bits_of(out[static_cast<std::size_t>(i * N + j)]) == bits_of(want));
    }
}

// Each output of the twin is the model's accumulate over that output's exact products in k
// order, then the epilogue (unit scales, no bias, float32 out: the sum itself).
TEST(accumulate, gemm_twin_sums_with_the_model) {
  check_property("accumulate.gemm_twin", 200, [] {
    const emu::accumulation m =
        *rc::gen::oneOf(rc::gen::just(emu::fp32_sequential_accumulation), rc::gen::just(model()));
    // e4m3 x e5m2 codes, or bfloat16 / float16 values (every 16-bit pattern, NaN and Inf too).
    const int kind = *rc::gen::inRange(0, 3);
    const emu::format fa = kind == 0 ? emu::e4m3fn : (kind == 1 ? emu::bfloat16 : emu::float16);
    const emu::format fb = kind == 0 ? emu::e5m2 : fa;
    const kn::dtype t =
        kind == 0 ? kn::dtype::uint8 : (kind == 1 ? kn::dtype::bfloat16 : kn::dtype::float16);
    const std::int64_t M = *rc::gen::inRange(1, 4), N = *rc::gen::inRange(1, 4);
    const std::int64_t K = *rc::gen::inRange(0, 200);
    auto codes = [&](std::int64_t rows) {
      return *rc::gen::container<std::vector<std::uint16_t>>(
          static_cast<std::size_t>(rows * K),
          kind == 0 ? rc::gen::map(rc::gen::arbitrary<std::uint8_t>(),
                                   [](std::uint8_t c) { return std::uint16_t{c}; })
                    : rc::gen::arbitrary<std::uint16_t>());
    };
    const std::vector<std::uint16_t> a = codes(M), b = codes(N);
    if (kind == 0)
      assert_twin_sums_are_the_model(m, fa, fb, t, std::vector<std::uint8_t>(a.begin(), a.end()),
                                     std::vector<std::uint8_t>(b.begin(), b.end()), M, N, K);
    else
      assert_twin_sums_are_the_model(m, fa, fb, t, a, b, M, N, K);
  });
}

// The twin's float32 form of the register-aligned block models over fp8 operands (k dividing 32,
// (k + 1) 2^(f + 2) <= 2^24: the form simt's model kernel runs too) == the model's accumulate,
// output by output: the Hopper presets and every rounding, register width, promotion and exponent
// rule within the form, e4m3 and e5m2 codes drawn from every finite value, rows of mostly
// subnormal codes, rows that cancel, and NaN or Inf codes (their outputs take the accumulator).
TEST(accumulate, gemm_twin_float32_form_equals_the_model) {
  check_property("accumulate.gemm_float32_form", 300, [] {
    const int k = *rc::gen::element(1, 2, 4, 8, 16, 32);
    int f_max = 0;
    while ((std::int64_t{k} + 1) << (f_max + 3) <= (std::int64_t{1} << 24))
      ++f_max;
    const emu::accumulation m = *rc::gen::element(
        emu::hopper_fp8_accumulation(false), emu::hopper_fp8_accumulation(true),
        emu::block_fixed_point(
            k, *rc::gen::inRange(0, f_max + 1), true,
            *rc::gen::element(emu::term_rounding::toward_zero, emu::term_rounding::nearest_even),
            *rc::gen::element(emu::register_rounding::nearest_even,
                              emu::register_rounding::toward_zero),
            *rc::gen::inRange(0, 9), *rc::gen::inRange(1, 25),
            *rc::gen::element(emu::product_exponent::of_product, emu::product_exponent::of_operands,
                              emu::product_exponent::of_operand_fields)));
    const bool a_e4m3 = *rc::gen::arbitrary<bool>(), b_e4m3 = *rc::gen::arbitrary<bool>();
    const emu::format fa = a_e4m3 ? emu::e4m3fn : emu::e5m2, fb = b_e4m3 ? emu::e4m3fn : emu::e5m2;
    const std::int64_t M = *rc::gen::inRange(1, 5), N = *rc::gen::inRange(1, 5);
    const std::int64_t K = *rc::gen::inRange(1, 300);
    const int specials = *rc::gen::inRange(0, 4); // 0: a NaN or Inf code somewhere in B
    const auto finite = [](emu::format f) {
      return rc::gen::suchThat(rc::gen::arbitrary<std::uint8_t>(), [f](std::uint8_t c) {
        return !emu::is_nan_code(f, c) && !emu::is_inf_code(f, c);
      });
    };
    std::vector<std::uint8_t> a =
        *rc::gen::container<std::vector<std::uint8_t>>(static_cast<std::size_t>(M * K), finite(fa));
    std::vector<std::uint8_t> b =
        *rc::gen::container<std::vector<std::uint8_t>>(static_cast<std::size_t>(N * K), finite(fb));
    for (std::int64_t r = 0; r < M; ++r) {
      const int form = *rc::gen::inRange(0, 3);
      std::uint8_t* row = a.data() + r * K;
      if (form == 1) // mostly subnormal: exponent field 0
        for (std::int64_t c = 0; c < K; ++c)
          if (*rc::gen::inRange(0, 4) != 0)
            row[c] &= a_e4m3 ? 0x87 : 0x83;
      if (form == 2) { // the second half cancels the first against one row of B
        std::uint8_t* col = b.data() + *rc::gen::inRange<std::int64_t>(0, N) * K;
        for (std::int64_t c = 0; c < K / 2; ++c) {
          row[c + K / 2] = row[c] ^ 0x80;
          col[c + K / 2] = col[c];
        }
      }
    }
    if (specials == 0)
      b[static_cast<std::size_t>(*rc::gen::inRange<std::int64_t>(0, N * K))] =
          b_e4m3 ? 0x7F : *rc::gen::element<std::uint8_t>(0x7C, 0xFC, 0x7E);
    assert_twin_sums_are_the_model(m, fa, fb, kn::dtype::uint8, a, b, M, N, K);
  });
}

TEST(accumulate, gemm_refuses_models_it_cannot_run) {
  std::vector<std::uint8_t> a(8, 0x38), b(8, 0x3C);
  std::vector<std::int8_t> ia(8, 1), ib(8, 1);
  std::vector<float> out(4);
  const kn::tensor_view o = matrix(out.data(), kn::dtype::float32, 2, 2);
  kn::gemm_operand fa{matrix(a.data(), kn::dtype::uint8, 2, 4), emu::target(emu::e4m3fn), {}};
  kn::gemm_operand fb{matrix(b.data(), kn::dtype::uint8, 2, 4), emu::target(emu::e4m3fn), {}};
  kn::gemm_operand qa{matrix(ia.data(), kn::dtype::int8, 2, 4), emu::target(emu::int8), {}};
  kn::gemm_operand qb{matrix(ib.data(), kn::dtype::int8, 2, 4), emu::target(emu::int8), {}};
  auto code_of = [&](const kn::gemm_operand& x, const kn::gemm_operand& y,
                     emu::accumulation m) -> std::optional<lowbit::errc> {
    kn::gemm_options opt;
    opt.accumulation = m;
    try {
      kn::scaled_matmul(x, y, kn::tensor_view{}, o, opt);
    } catch (const lowbit::error& e) {
      EXPECT_NE(std::string(e.what()).find("opt.accumulation"), std::string::npos) << e.what();
      return e.code();
    }
    return std::nullopt;
  };
  EXPECT_EQ(code_of(fa, fb, emu::exact_accumulation), lowbit::errc::unsupported);
  EXPECT_EQ(code_of(qa, qb, emu::fp32_sequential_accumulation), lowbit::errc::invalid_argument);
  EXPECT_EQ(code_of(fa, fb,
                    emu::block_fixed_point(0, 10, false, emu::term_rounding::toward_zero,
                                           emu::register_rounding::nearest_even, 0)),
            lowbit::errc::invalid_argument);
  // And a valid model runs: 1.0 x 1.5 (codes 0x38, 0x3C) four times.
  EXPECT_EQ(code_of(fa, fb,
                    emu::block_fixed_point(4, 10, true, emu::term_rounding::toward_zero,
                                           emu::register_rounding::nearest_even, 0)),
            std::nullopt);
  EXPECT_EQ(out[0], 6.0f);
}

// A sample of the probes measured on an H200 (bench/probes/fp8_accum_probe.cu: cuBLASLt e4m3 x
// e4m3, K = 256, float32 out, CUDA 13.0; 36 of 9454 results, both modes): the random rows that
// separate the preset from its neighbours, and structured probes at the edges of f, k and N.
struct probe_result {
  bool fast;
  const char* family;
  std::uint32_t bits;
  const char* a; // e4m3 codes (e5m2 where a_e5m2), hex
  const char* b; // e4m3 codes, hex
  bool a_e5m2 = false;
};

const probe_result h200_probes[] = {
    {true, "random", 0xC4329C00u, "dc718c3ebe077771", "160b224b4ad9c40b"},
    {true, "random", 0x46E54400u, "cd5c88f8eb50ec77bec1", "0833359b7a063b771c32"},
    {true, "random", 0xC48DA000u, "70678403d4bb72c5b4942e", "318eb1abb3c43c7e8fbb30"},
    {true, "random", 0xC685D000u, "c4c65c9cb5054396ba210fbc75", "1eaa8afd464b37188026857bea"},
    {true, "random", 0x46742800u, "2c9c3ad716e5f007d4e75149ca", "ab0b9ffd91f31e4512c14259c0"},
    {true, "random", 0xC62AC800u, "f62aa2f325d654c542f643dceb2c0f",
     "ab5a60498401d9e5659a6b026f4336"},
    {true, "random", 0xC4B0C400u, "974c72a6e43030cfdaa6a7199accf7",
     "115bcf47ae26228ce04eda7e467398"},
    {true, "random", 0xC5F94C00u, "43374af41692edf4533d0ad4185ac0b5",
     "f073dd665b3cde891a220419cfc5efb7"},
    {true, "random", 0x41D01000u, "443f4bda30852693a199566937197afc93",
     "44addd8b32b0e75fe11c43ac71110f9102"},
    {true, "random", 0xC6A8B400u, "d479c099c80722194163dab7e02b2f3375c574",
     "172244b46dcd37b084e17a257c87124301c8ca"},
    {true, "pair", 0x47800400u, "7850", "7838"},
    {true, "pair", 0x47800000u, "7848", "7838"},
    {true, "pair_negative", 0x477FF800u, "78d0", "7838"},
    {true, "pair_negative", 0x47800000u, "78c8", "7838"},
    {true, "cancel", 0x00000000u, "78f848", "787838"},
    {true, "single", 0x47800000u,
     "7800000000000000000000000000000000000000000000000000000000000048",
     "7800000000000000000000000000000000000000000000000000000000000038"},
    {true, "single", 0x47800000u,
     "7800000000000000000000000000000000000000000000000000000000000000"
     "48",
     "7800000000000000000000000000000000000000000000000000000000000000"
     "38"},
    {true, "many", 0x47800000u,
     "7848484848484848484848484848484848484848484848484848484848484848"
     "4848484848484848484848484848484848484848484848484848484848484848"
     "4848484848484848484848484848484848484848484848484848484848484848"
     "4848484848484848484848484848484848484848484848484848484848484848"
     "48",
     "7838383838383838383838383838383838383838383838383838383838383838"
     "3838383838383838383838383838383838383838383838383838383838383838"
     "3838383838383838383838383838383838383838383838383838383838383838"
     "3838383838383838383838383838383838383838383838383838383838383838"
     "38"},
    {false, "random", 0xC4329C00u, "dc718c3ebe077771", "160b224b4ad9c40b"},
    {false, "random", 0x46E54400u, "cd5c88f8eb50ec77bec1", "0833359b7a063b771c32"},
    {false, "random", 0xC48DA000u, "70678403d4bb72c5b4942e", "318eb1abb3c43c7e8fbb30"},
    {false, "random", 0xC685D000u, "c4c65c9cb5054396ba210fbc75", "1eaa8afd464b37188026857bea"},
    {false, "random", 0x46742800u, "2c9c3ad716e5f007d4e75149ca", "ab0b9ffd91f31e4512c14259c0"},
    {false, "random", 0xC62AC800u, "f62aa2f325d654c542f643dceb2c0f",
     "ab5a60498401d9e5659a6b026f4336"},
    {false, "random", 0x478650A8u,
     "3a2a7373e1e4384f6dcab3a87e7e831eb49e4751b0cba1e110a6306e75cd9398"
     "d40215ce835a430251fc03bbedf4e19af5e17c3d0b627445cd196952dca5fb04"
     "d9a5cafb62bb76d819869f399ca5e5bf8cbae80a8a6347ba3442a46f2cf69ec9"
     "101ed569815ce9ed204f7af68b96282464d3931749a55b6fdbab20cdbb8781cf"
     "87",
     "d033ece13d0ee67c4b3110701abd8cddcad278e27b91f6a14d182439608824ca"
     "e26c74c9a416565f8f4992b6e3cc47eec1c1952747469c81967d7b1ccf845418"
     "107d46957a8671b32dc1f4934a4cf153ef4987143dd6d6f65515fe1955251e9d"
     "5e2558a29037cb480c7997aff00ddbf75d11b94073a750aa53edc0551b052961"
     "ec"},
    {false, "random", 0xC8156FFFu,
     "b3335c8b7cf356506ec589b6aac715dd4e1b19e57bdfb7ee51350e18f13b3e83"
     "7913674f0adba89cc5b5238ac8bff739341b44c929e7295ac845c80c2f5340e0"
     "33b153d9043b285be5fd9e26f819d55a24d5e84c1fd85e2d77408044ccadef30"
     "bebf4c90ed163506f9534c3182142fb028fa46b8cef37425fdb56c4405b84c34"
     "051c35",
     "bc54ef26a44b4f57a21f93b655705ce15cde4a7a5909fd1feb911571b1163311"
     "4d37f59d5e96fcb783d2e8fd5e8b59118e61ef91b2f44b1e6ce40b595bd1d01e"
     "5b3a555722e956a5c67d84a7e696805baeed1830dc067e95c340adac82bbc693"
     "3b97e76c0df4315518f2c4707bb2c1db5852258ba5dd2e4ab5e76d07ca3f8161"
     "848309"},
    {false, "random", 0x461D6810u,
     "662cb66fa52af5c1acd80d549c581e4896c948bdb84aaad323fd6651f885ded9"
     "65a0016f661889b19d8d1640a99f48bd29eebfc6bf1a1cfd0ac3fd00a9890370"
     "3e0cceee67ebfe18c6c83390fa420df4a2f92de5608d3104d39ebaef9acc6848"
     "57b7dbada9a41ee7a194492f397dd580c17ee2fb5bb990be254d1fcc4f0d5fb0"
     "a2a0fe",
     "cb75742fa585548ab4923931973cc3c6f02392e75ee746358027aaf7009b6255"
     "75691b5b7af0f52a314f10e3b8a88ca4311a898ebac527c175c8875e8045c783"
     "fd5b08510a2a6ae9c9d20d69597211f2d92c96a46b1fbca02d6ba304412f6bf1"
     "c58d3487dbb3bf2f44911f8b25136b5c44da454140864bdcb9b7ea415a4f9fcd"
     "29ac2a"},
    {false, "random", 0xC602B880u,
     "c8dd3e6b39f16e41cf7192d42bfe4cc4eb393bb1b0c0fe3b1a353702c93685a6"
     "5d6487c67660df04b5c82c3c66def523a00d0ce21b26f39bf747cc6d5491b578"
     "5224d0db12213bb8b2a6182e53d4855d15cca46518ac94657c95746434874c48"
     "33da3db1fe814b3f371e16920a56d7c9ca7c275472747040235cd1adfe569d7a"
     "e358ae2e",
     "ea281f5799947ba429894789ba28a5286c8fb3a05fdf9311b339649b88bb455d"
     "fe86587935babb0e4d7890b83e0d57206024ac8dcf109e9f2c70cdf615e6d933"
     "2c1162f40f9008da5f056b85bd0e2a95c74de7aa1f61416463e9d861a766d2e7"
     "03887e2ec7fca25614e0607c503e4a6eb66308aef2246adaa3231194686cbb21"
     "80608aad"},
    {false, "pair", 0x47800400u, "7850", "7838"},
    {false, "pair", 0x47800000u, "7848", "7838"},
    {false, "pair_negative", 0x477FF800u, "78d0", "7838"},
    {false, "pair_negative", 0x47800000u, "78c8", "7838"},
    {false, "cancel", 0x00000000u, "78f848", "787838"},
    {false, "single", 0x47800000u,
     "7800000000000000000000000000000000000000000000000000000000000048",
     "7800000000000000000000000000000000000000000000000000000000000038"},
    {false, "single", 0x47800000u,
     "7800000000000000000000000000000000000000000000000000000000000000"
     "48",
     "7800000000000000000000000000000000000000000000000000000000000000"
     "38"},
    {false, "many", 0x47800200u,
     "7848484848484848484848484848484848484848484848484848484848484848"
     "4848484848484848484848484848484848484848484848484848484848484848"
     "4848484848484848484848484848484848484848484848484848484848484848"
     "4848484848484848484848484848484848484848484848484848484848484848"
     "48",
     "7838383838383838383838383838383838383838383838383838383838383838"
     "3838383838383838383838383838383838383838383838383838383838383838"
     "3838383838383838383838383838383838383838383838383838383838383838"
     "3838383838383838383838383838383838383838383838383838383838383838"
     "38"},
    // The subnormal families (a subnormal operand in the block's largest product: it aligns at
    // its format's minimum exponent) and rows of a training step's matmuls replayed on the H200
    // (bench/probes/fp8_layer_replay.py: two forward rows, K = 384, whose sums the model with
    // floor(log2) exponents missed, and one e5m2 x e4m3 input-gradient row).
    {true, "subnormal", 0x3F004000u, "0101", "7830"},
    {true, "subnormal_seven", 0x3F604000u, "0701", "6830"},
    {true, "subnormal", 0x3F002000u, "0101", "7828"},
    {true, "subnormal_seven", 0x3F602000u, "0701", "6828"},
    {true, "subnormal", 0x3F000000u, "0101", "7820"},
    {true, "subnormal_seven", 0x3F601000u, "0701", "6820"},
    {true, "subnormal", 0x3F000000u, "0101", "7818"},
    {true, "subnormal_seven", 0x3F600800u, "0701", "6818"},
    {true, "subnormal", 0x3F000000u, "0101", "7810"},
    {true, "subnormal_seven", 0x3F600000u, "0701", "6810"},
    {true, "subnormal", 0x3F000000u, "0101", "7808"},
    {true, "subnormal_seven", 0x3F600000u, "0701", "6808"},
    {false, "subnormal", 0x3F004000u, "0101", "7830"},
    {false, "subnormal_seven", 0x3F604000u, "0701", "6830"},
    {false, "subnormal", 0x3F002000u, "0101", "7828"},
    {false, "subnormal_seven", 0x3F602000u, "0701", "6828"},
    {false, "subnormal", 0x3F000000u, "0101", "7820"},
    {false, "subnormal_seven", 0x3F601000u, "0701", "6820"},
    {false, "subnormal", 0x3F000000u, "0101", "7818"},
    {false, "subnormal_seven", 0x3F600800u, "0701", "6818"},
    {false, "subnormal", 0x3F000000u, "0101", "7810"},
    {false, "subnormal_seven", 0x3F600000u, "0701", "6810"},
    {false, "subnormal", 0x3F000000u, "0101", "7808"},
    {false, "subnormal_seven", 0x3F600000u, "0701", "6808"},
    {false, "layer_differ", 0xBE29CC00u,
     "aebaaf0131bdb834c2b93034ba2d32262daeb3b3a6113c311621b942a7b39939"
     "2d8ebba0a3b1b536b9aab59d33b0a4bdb1392ea332413bb632a4243f2f2eaaa7"
     "aeb12eac2a2ebc26303b3c2fc135993c2ab228262c1c9d3234c1b1a332b6b43c"
     "aa362cbab6b2b1ba31be1d3337b22c3a36b9b9bd39202e31b7be3d9abab0b539"
     "312c2425a02c01483bb82baabbb3b1943334c03fb93ca1333422a6a5bcc4402a"
     "2598bc1d24b4a73344aeb038b8b3b833b7bf362ebb333d9e35c0c13128233331"
     "362bb01a3037ae42bc2a1f369f313abab02f33bab732b93c36a2bba63bb828b9"
     "3b3a3fbd33a331b228b1bc9ba239b33eb43bb42eb11a2641b3a132bbbfc1b6be"
     "36a2ab34c19a3932beb93d3fabb43f37221c34a3258639b9b8b423c224173c2f"
     "26b7b7ad9eae2bb497bc26c2869b36b83e352f2831372bbaa4393c35362cbaba"
     "2ab11eaa24b320ba9321bb08bc2d3c37aa4032a03bb6b938b9b90b3129a4b02e"
     "be35ac3c3ca839b3b031ac3aab2e3b1e29342134b732acb8399ba9b4a2a9a229",
     "938b100a8408048e81929502870e09140702030a8b100e048793040612149483"
     "0e8a8e0c149194911586929303010b93818314110d8b02928d91900990911208"
     "8893098f9008119411120c0f08040c94940f8b868e1395830113141095941091"
     "0508858a1490858383158d8983068985950d950d100f108d80878c93840a0312"
     "8c8f070f8e0309818c0791098691888d07110e95958e939212099301800e8411"
     "82098d001486111583101293910c1215900a88141592070e828084071405088e"
     "10128183930a9592138d95108e02869082878b9314908110141002068d928788"
     "1580928a0b89068c81100a1293040a910a0710818a1182138e12948385821110"
     "8c949100018885048d08848b118d9384030d87108d8f0793010e84931412088a"
     "9093040f8e9015140c948a0d88871492879414900594108294110a02140d8284"
     "10929114040894129310140505930c820a0b9480080b930691810e1291901014"
     "0212858c12860785840d10910f079313858003150b0690081414138891041492"},
    {false, "layer_differ", 0xBE871200u,
     "ac36aab73b28b724393d313136bcb830bb3c3828b12fb7b8be0e2b133a362bb3"
     "c03a38302db0bdb7b4bb3fb4a83ead36c2b039af34b9b3b844b7ae2ea1263136"
     "3a32292c35b4a43ac8bf32b43c26b5993919113b33b4b1aabeb23c82a0261d83"
     "40aeba2b2e07b193aa3430b0303da1aebb38bb17222dba309932b3b63d932c2c"
     "be2d223c36bfb2a033293f9e35bc20c2a0bc38b9ae24a5c0b8343b20992b02bd"
     "a8a7aa3bbaa0baa9b23d35a830b2aeb033343030b4bb2eadb93a302c3c37b5bc"
     "b7bab7b497b923b82c3ab8c1b831b336173f2cb2a4bc28bdb29730b83e31a7af"
     "b3b9b0b92c423c409f1034a4ba32b5b034a940bc3bb437bdb4b2c3943434373c"
     "373f2c2e31b43bbd2e43abb0281f162c34b426a532b6b9b9403ab93bb136b9b1"
     "ab2a1993b938a43ab63935ae35bab1b7bd3f35b335b52a2d2c23b437aebe3cb6"
     "2fb0b32d39329d2bbe3d41ae38311d99b6b232b933301bb935b23924b8b2b237"
     "3f3036b2bfb729aea93cb829b3b4b0323aa3b730200828363b3029bb3221b1b9",
     "8f8186090107880a8b92900795109303938c121514030711040f148311829203"
     "881088100a12920011120e8781010f0d8f100c0a938f148f948c94129595118b"
     "9594958607890813068d9391048315861013828610140780000592890f959285"
     "050c1185861192948c8d11140c850982048994120a0b088686860a14898b9290"
     "120c8d8d03880307890c0f83070713139484130d019003908594081294130b8e"
     "0a93918e82080a87029091108909148904948c8506800c0207108306020a8c00"
     "9412118c0c068c86128491808e9301090d9284140790129504008f14948b8d94"
     "11878e9089911293920804069404848d8c011508099293078e818c0f82151311"
     "050d8110830585850e938d13891311859013050c0d0194858f0c11038e10078b"
     "04090d04141483821489840492141512028393958c9110908e858c851381948e"
     "938988141012880a8709919490818490118e94911282888d8584848693108511"
     "130185119289920c950f820c921015020d821294040a8a010d81830b0b129312"},
    {false, "layer_e5m2", 0x35200000u,
     "0100018181010080810080018201818002818100028180018101010181018180"
     "8101010102818101010181800081000201808181810001018281018181018081"
     "0080018181010101810080028000808081818101818181818101800000808100"
     "8180810101010001008281010001018001000101008101808081018180010101"
     "0000808081018081018201020181808101818081010081010100800082808101"
     "0181800000010080810080010101810181808281018102810081018181810181"
     "0101008281018180018181018081810101810180818081018101810181828000"
     "8000800101808181808101808180018080010100810200000180018101010000"
     "8081000081010181818081818181018181808200018101828181800000010002"
     "0181010001028100800080010180810181810001810182018181818080010181"
     "0101010201018001008181018201018080000101000181818081808180018101"
     "8181810182800181018081818101010080818081800181018101808181810101",
     "848b04078b0c0d82880b05860b8106030605080c010d06048602828505850a07"
     "0c0a88870a8689028c820a8c088c8c8301848407088881010b04858885030281"
     "8c08868c890d0688038303830d830c0c0482840a8c8b88020209868900848304"
     "010c81828308030a8d090200838982820381848b078a000405860a8c8b000082"
     "0a0b07098483880501018a0508020c0d050a8c028c048a848d0107810c088800"
     "0906898b8204030a04020288858002030802890807890207880c8a080d820408"
     "080b8c868281050486098502878b8d0603860a02010207048305888105830a01"
     "040787078b0c8307848c8a0206870988060c8c8703080b0b0c88048084828c09"
     "08850c840b00828a0d0508898302880784848a038108850184828c828802860c"
     "0b8a098805848a87818c078701818b818a0c050a840a0688030a068709078982"
     "8a0c0484068b8a8787830c870a898281838a8a8b86090206850a098203860309"
     "098906898a8d08820c848c8a0a0a0687800b83838409878a06000003060c0d09",
     true},
};

std::vector<float> code_values(const char* hex, const emu::format& f) {
  std::vector<float> v;
  for (const char* c = hex; c[0] != 0 && c[1] != 0; c += 2) {
    const std::uint8_t code = static_cast<std::uint8_t>(std::stoul(std::string(c, 2), nullptr, 16));
    v.push_back(emu::decode<float>(f, code));
  }
  return v;
}

const emu::format& a_format(const probe_result& p) {
  return p.a_e5m2 ? emu::e5m2 : emu::e4m3fn;
}

// The model's result for probe p, its operands' minimum exponents passed.
float replay_probe(const emu::accumulation& m, const probe_result& p) {
  const std::vector<float> a = code_values(p.a, a_format(p)), b = code_values(p.b, emu::e4m3fn);
  emu::accumulator acc(m, a_format(p).emin(), emu::e4m3fn.emin());
  for (std::size_t i = 0; i < a.size(); ++i)
    acc.add(a[i], b[i]);
  return acc.finish();
}

// The number of sampled probes whose result `m(fast)` does not reproduce.
template <class Model> int probe_mismatches(Model m) {
  int bad = 0;
  for (const probe_result& p : h200_probes)
    bad += bits_of(replay_probe(m(p.fast), p)) != p.bits ? 1 : 0;
  return bad;
}

TEST(accumulate, hopper_preset_reproduces_the_h200_probes) {
  EXPECT_EQ(probe_mismatches([](bool fast) { return emu::hopper_fp8_accumulation(fast); }), 0);
  for (const probe_result& p : h200_probes) {
    const emu::accumulation m = emu::hopper_fp8_accumulation(p.fast);
    EXPECT_EQ(bits_of(replay_probe(m, p)), p.bits)
        << p.family << " fast " << p.fast << " a " << p.a;
    // The rational definition agrees.
    const std::vector<float> a = code_values(p.a, a_format(p)), b = code_values(p.b, emu::e4m3fn);
    EXPECT_EQ(bits_of(ref::accumulate_exactly(m, a, b, a_format(p).emin(), emu::e4m3fn.emin())),
              p.bits)
        << p.family << " a " << p.a;
  }
  // Each parameter the random rows pinned is needed: a float32 register, the products' own
  // exponents, a nearest-even register or promotion every 2 or 8 blocks miss some probes.
  auto with = [](auto change) {
    return [change](bool fast) {
      emu::accumulation m = emu::hopper_fp8_accumulation(fast);
      change(m, fast);
      return m;
    };
  };
  EXPECT_GT(probe_mismatches(with([](emu::accumulation& m, bool) { m.register_bits = 24; })), 0);
  EXPECT_GT(probe_mismatches(with([](emu::accumulation& m, bool) {
              m.exponent = emu::product_exponent::of_product;
            })),
            0);
  // Subnormal operands by floor(log2 |x|) rather than their exponent fields: the subnormal
  // families and the replayed forward rows miss.
  EXPECT_GT(probe_mismatches(with([](emu::accumulation& m, bool) {
              m.exponent = emu::product_exponent::of_operands;
            })),
            0);
  EXPECT_GT(probe_mismatches(with(
                [](emu::accumulation& m, bool) { m.reg = emu::register_rounding::nearest_even; })),
            0);
  EXPECT_GT(probe_mismatches(
                with([](emu::accumulation& m, bool fast) { m.promote_every = fast ? 0 : 2; })),
            0);
  EXPECT_GT(probe_mismatches(
                with([](emu::accumulation& m, bool fast) { m.promote_every = fast ? 0 : 8; })),
            0);
  EXPECT_GT(probe_mismatches(with([](emu::accumulation& m, bool) { m.fraction_bits = 14; })), 0);
  EXPECT_GT(probe_mismatches(with([](emu::accumulation& m, bool) { m.block = 16; })), 0);
}

} // namespace
