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
  return emu::block_fixed_point(k, f, align, t, r, n);
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
    std::vector<std::uint8_t> a8(a.begin(), a.end()), b8(b.begin(), b.end());
    std::vector<std::uint16_t> a16 = a, b16 = b;
    void* da = kind == 0 ? static_cast<void*>(a8.data()) : a16.data();
    void* db = kind == 0 ? static_cast<void*>(b8.data()) : b16.data();
    std::vector<float> out(static_cast<std::size_t>(M * N));
    kn::gemm_operand oa{matrix(da, t, M, K), emu::target(fa), {}};
    kn::gemm_operand ob{matrix(db, t, N, K), emu::target(fb), {}};
    kn::gemm_options opt;
    opt.accumulation = m;
    kn::scaled_matmul(oa, ob, kn::tensor_view{}, matrix(out.data(), kn::dtype::float32, M, N), opt);
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        std::vector<float> p(static_cast<std::size_t>(K));
        for (std::int64_t q = 0; q < K; ++q)
          p[static_cast<std::size_t>(q)] =
              emu::decode<float>(fa, a[static_cast<std::size_t>(i * K + q)]) *
              emu::decode<float>(fb, b[static_cast<std::size_t>(j * K + q)]);
        float want = emu::accumulate(m, p.data(), K);
        if (std::isnan(want))
          want = float_of(0x7FC00000u); // the GEMM writes every NaN as the positive quiet NaN
        RC_ASSERT(bits_of(out[static_cast<std::size_t>(i * N + j)]) == bits_of(want));
      }
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

} // namespace
