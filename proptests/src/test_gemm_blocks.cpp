// Block scales of the scaled matmul (kernels/gemm.hpp's blocked rule) on the CPU twin:
//   - gemm_blocks.rule: the twin equals the rule written out here from emu's decode alone: each
//     K block's partial sum (exact int32 for int8; acc = acc + a*b in k order, or the
//     accumulation model's emu::accumulator started afresh, for fp8 and 16-bit values),
//     t_j = (acc_j * sb[n, j]) * sa[m, j], T = t_0 + t_1 + ... in block order, T + bias, the
//     rounding to out's dtype; every code (NaN, Inf, subnormals), float32 and E8M0 block scales
//     (0xFF among them), 1 x kb, r x kb and 128 x kb blocks, B blocked or per row / tensor / none.
//   - gemm_blocks.bound: the twin within the derived bound of the exact value of the blocked
//     specification (reference::exact_block_scaled_matmul), y* = sum_j S_j sa_j sb_j + bias:
//     a K block of kb products summed in float32 errs by gamma_{kb-1} sum |p|, the two scale
//     multiplications and the nb - 1 additions of the block terms by one rounding each, so
//       |T - sum_j S_j sa_j sb_j| <= gamma_{kb + nb} sum_j |sa_j sb_j| sum_{k in j} |a b|
//     (gamma_n = n u / (1 - n u), u = 2^-24), plus eta = 2^-149 for each of the 3 nb + 1
//     operations that may underflow, plus the bias addition's u |y*| (with u |y*| more for the
//     rounding of y* itself in the comparison).
//   - gemm_blocks.errors: the argument checks, each message naming its argument.
//   - the recipes of kernels/recipe.hpp: the named fp8 recipes, their checks, and a recipe's
//     operands quantized by kernels::quantize feeding the matmul as they come.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/kernels/gemm.hpp>
#include <lowbit/kernels/quantize.hpp>
#include <lowbit/kernels/recipe.hpp>
#include <lowbit/proptest/generators.hpp>
#include <lowbit/reference/gemm.hpp>

#include "../common/gemm_kinds.hpp"
#include "support.hpp"

namespace {

namespace emu = lowbit::emu;
namespace kn = lowbit::kernels;
namespace pt = lowbit::proptest;
namespace ref = lowbit::reference;
using kn::dtype;
using pt::test::check_property;

using namespace lowbit::proptest::gemm_kinds;

kn::tensor_view matrix(void* data, dtype t, std::int64_t rows, std::int64_t cols) {
  kn::tensor_view v;
  v.data = data;
  v.type = t;
  v.ndim = 2;
  v.shape = {rows, cols};
  v.strides = {cols, 1};
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

emu::format format_of(kind k) {
  switch (k) {
  case kind::e4m3: return emu::e4m3fn;
  case kind::e5m2: return emu::e5m2;
  case kind::bf16: return emu::bfloat16;
  default: return emu::float16;
  }
}

kind partner(kind k) {
  if (is_int(k))
    return *rc::gen::element(kind::int8, kind::int8_sym);
  if (is_fp8(k))
    return *rc::gen::element(kind::e4m3, kind::e5m2);
  return k;
}

std::uint16_t draw_code(kind k, bool finite) {
  if (is_int(k))
    return static_cast<std::uint8_t>(*pt::uniform<int>(k == kind::int8 ? -128 : -127, 127));
  const emu::format f = format_of(k);
  if (is_fp8(k)) {
    for (;;) {
      const auto c = static_cast<std::uint32_t>(*pt::uniform<int>(0, 255));
      if (!finite || (!emu::is_nan_code(f, c) && !emu::is_inf_code(f, c)))
        return static_cast<std::uint16_t>(c);
    }
  }
  if (!finite && *pt::uniform<int>(0, 9) == 0)
    return static_cast<std::uint16_t>(*pt::uniform<int>(0, 65535));
  const double v = std::ldexp(*pt::uniform<int>(-2048, 2048) / 1024.0, *pt::uniform<int>(-8, 8));
  return static_cast<std::uint16_t>(emu::encode(f, v, emu::rne));
}

struct operand {
  kind k = kind::e4m3;
  std::int64_t rows = 0, cols = 0;
  std::vector<std::uint16_t> codes;
  std::vector<unsigned char> bytes;
  // Scales: block (block_rows >= 1: [ceil(rows / block_rows), ceil(K / kb)]) or 0/1/rows.
  std::int64_t block_rows = 0, kb = 0;
  bool e8m0 = false;
  std::vector<float> scales; // float32 scales, or the E8M0 codes' values
  std::vector<std::uint8_t> e8m0_codes;

  double value(std::int64_t r, std::int64_t c) const {
    const std::uint32_t x = codes[static_cast<std::size_t>(r * cols + c)];
    if (is_int(k))
      return static_cast<std::int8_t>(x);
    return emu::decode<double>(format_of(k), x);
  }
  float scale(std::int64_t r, std::int64_t j) const {
    if (block_rows == 0)
      return scales.empty() ? 1.0f : scales[scales.size() == 1 ? 0 : static_cast<std::size_t>(r)];
    const std::int64_t cols_s = (cols + kb - 1) / kb;
    return scales[static_cast<std::size_t>((r / block_rows) * cols_s + j)];
  }
  kn::gemm_operand op() {
    const std::size_t es = kn::dtype_size(dtype_of(k));
    bytes.assign(codes.size() * es + 1, 0);
    for (std::size_t i = 0; i < codes.size(); ++i)
      std::memcpy(bytes.data() + i * es, &codes[i], es);
    kn::gemm_operand o;
    o.codes = matrix(bytes.data(), dtype_of(k), rows, cols);
    o.fmt = target_of(k);
    if (e8m0)
      o.scales = vec(e8m0_codes.data(), dtype::uint8, static_cast<std::int64_t>(e8m0_codes.size()));
    else
      o.scales = vec(scales.data(), dtype::float32, static_cast<std::int64_t>(scales.size()));
    o.block_rows = block_rows;
    o.block_k = block_rows > 0 ? kb : 0;
    return o;
  }
};

float e8m0_value(std::uint8_t c) {
  return c == 0xFF ? std::nanf("") : std::ldexp(1.0f, static_cast<int>(c) - 127);
}

// finite: finite codes and positive moderate scales (the bound property).
operand make_operand(kind k, std::int64_t rows, std::int64_t cols, std::int64_t kb, bool blocked,
                     bool e8m0, bool finite) {
  operand o;
  o.k = k;
  o.rows = rows;
  o.cols = cols;
  o.codes.resize(static_cast<std::size_t>(rows * cols));
  for (auto& c : o.codes)
    c = draw_code(k, finite);
  std::int64_t ns;
  if (blocked) {
    o.block_rows = *rc::gen::element<std::int64_t>(1, 1, 2, 3, 128);
    o.kb = kb;
    ns = ((rows + o.block_rows - 1) / o.block_rows) * ((cols + kb - 1) / kb);
    o.e8m0 = e8m0;
  } else {
    const int mode = *pt::uniform<int>(0, 2);
    ns = mode == 0 ? 0 : (mode == 1 ? 1 : rows);
  }
  for (std::int64_t i = 0; i < ns; ++i) {
    if (o.e8m0) {
      const int c = finite ? *pt::uniform<int>(107, 147)
                           : *rc::gen::weightedOneOf<int>({{6, pt::uniform<int>(100, 154)},
                                                           {1, rc::gen::element(0, 1, 254, 255)}});
      o.e8m0_codes.push_back(static_cast<std::uint8_t>(c));
      o.scales.push_back(e8m0_value(static_cast<std::uint8_t>(c)));
    } else if (finite) {
      o.scales.push_back(std::ldexp(1.0f + static_cast<float>(*pt::uniform<int>(0, 7)) / 8.0f,
                                    *pt::uniform<int>(-20, 20)));
    } else {
      o.scales.push_back(*rc::gen::oneOf(rc::gen::element(0.0f, -0.0f, 1.0f, -2.0f, 1e-40f, 3e38f),
                                         rc::gen::map(pt::uniform<int>(-30, 30), [](int e) {
                                           return std::ldexp(
                                               1.0f + static_cast<float>(e & 7) / 8.0f, e);
                                         })));
    }
  }
  return o;
}

void store(void* out, dtype t, std::int64_t i, float v) {
  if (t == dtype::float32) {
    if (v != v)
      v = emu::detail::bit_cast<float>(0x7FC00000u);
    std::memcpy(static_cast<char*>(out) + i * 4, &v, 4);
    return;
  }
  const emu::format f = t == dtype::bfloat16 ? emu::bfloat16 : emu::float16;
  std::uint16_t c = static_cast<std::uint16_t>(emu::encode(f, v, emu::rne));
  if (v != v)
    c = t == dtype::bfloat16 ? 0x7FC0 : 0x7E00;
  std::memcpy(static_cast<char*>(out) + i * 2, &c, 2);
}

// One output of the blocked rule, written out.
float rule(const operand& a, const operand& b, std::int64_t m, std::int64_t n, std::int64_t kb,
           const std::optional<emu::accumulation>& model, float bias) {
  const std::int64_t k = a.cols;
  float total = 0.0f;
  for (std::int64_t j = 0, k0 = 0; k0 < k; ++j, k0 += kb) {
    const std::int64_t k1 = std::min(k, k0 + kb);
    float acc = 0.0f;
    if (is_int(a.k)) {
      std::int64_t s = 0;
      for (std::int64_t i = k0; i < k1; ++i)
        s += static_cast<std::int64_t>(a.value(m, i)) * static_cast<std::int64_t>(b.value(n, i));
      acc = static_cast<float>(s);
    } else if (model) {
      emu::accumulator ac(*model);
      for (std::int64_t i = k0; i < k1; ++i)
        ac.add(static_cast<float>(a.value(m, i)) * static_cast<float>(b.value(n, i)));
      acc = ac.finish();
    } else {
      for (std::int64_t i = k0; i < k1; ++i) {
        const float p = static_cast<float>(a.value(m, i)) * static_cast<float>(b.value(n, i));
        acc = acc + p;
      }
    }
    float t = acc * b.scale(n, j);
    t = t * a.scale(m, j);
    total = j == 0 ? t : total + t;
  }
  return total + bias;
}

TEST(gemm_blocks, twin_follows_the_blocked_rule) {
  check_property("gemm_blocks.rule", 300, [] {
    const kind ka = *rc::gen::element(kind::int8, kind::int8_sym, kind::e4m3, kind::e5m2,
                                      kind::bf16, kind::f16);
    const kind kb_kind = partner(ka);
    const std::int64_t m = *pt::uniform<int>(0, 6), n = *pt::uniform<int>(0, 6);
    const std::int64_t k = *rc::gen::oneOf(
        rc::gen::element<std::int64_t>(0, 1, 31, 32, 33, 128),
        rc::gen::map(pt::uniform<int>(1, 400), [](int x) { return static_cast<std::int64_t>(x); }));
    const std::int64_t kb = *rc::gen::oneOf(
        rc::gen::element<std::int64_t>(1, 7, 32, 128),
        rc::gen::map(pt::uniform<int>(1, 200), [](int x) { return static_cast<std::int64_t>(x); }));
    const bool e8m0 = is_fp8(ka) && *rc::gen::arbitrary<bool>();
    const bool a_blocked = *rc::gen::arbitrary<bool>();
    const bool b_blocked = !a_blocked || *rc::gen::arbitrary<bool>();
    operand a = make_operand(ka, m, k, kb, a_blocked, e8m0, false);
    operand b = make_operand(kb_kind, n, k, kb, b_blocked, e8m0, false);
    std::optional<emu::accumulation> model;
    if (!is_int(ka) && *rc::gen::arbitrary<bool>())
      model = *rc::gen::oneOf(
          rc::gen::just(emu::fp32_sequential_accumulation),
          rc::gen::just(emu::block_fixed_point(
              *pt::uniform<int>(1, 64), *pt::uniform<int>(0, 40), *rc::gen::arbitrary<bool>(),
              *rc::gen::element(emu::term_rounding::toward_zero, emu::term_rounding::nearest_even),
              *rc::gen::element(emu::register_rounding::nearest_even,
                                emu::register_rounding::toward_zero),
              *pt::uniform<int>(0, 4))));
    std::vector<float> bias;
    if (*rc::gen::arbitrary<bool>())
      for (std::int64_t i = 0; i < n; ++i)
        bias.push_back(static_cast<float>(*pt::uniform<int>(-512, 512)) / 64.0f);
    const dtype out_t = *rc::gen::element(dtype::float32, dtype::bfloat16, dtype::float16);
    const std::size_t os = kn::dtype_size(out_t);
    std::vector<unsigned char> got(static_cast<std::size_t>(m * n) * os + 1, 0xA5),
        want(got.size(), 0xA5);
    kn::gemm_options opt;
    opt.accumulation = model;
    kn::scaled_matmul(a.op(), b.op(),
                      vec(bias.data(), dtype::float32, static_cast<std::int64_t>(bias.size())),
                      matrix(got.data(), out_t, m, n), opt);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const float bj = bias.empty() ? 0.0f : bias[static_cast<std::size_t>(j)];
        store(want.data(), out_t, i * n + j, k == 0 ? bj : rule(a, b, i, j, kb, model, bj));
      }
    RC_ASSERT(got == want);
  });
}

TEST(gemm_blocks, twin_within_the_bound_of_the_exact_blocked_value) {
  check_property("gemm_blocks.bound", 150, [] {
    const kind ka = *rc::gen::element(kind::int8, kind::e4m3, kind::e5m2);
    const kind kb_kind = partner(ka);
    const std::int64_t m = *pt::uniform<int>(1, 4), n = *pt::uniform<int>(1, 4);
    const std::int64_t k = *pt::uniform<int>(1, 400);
    const std::int64_t kb = *rc::gen::element<std::int64_t>(1, 7, 32, 128);
    const bool e8m0 = is_fp8(ka) && *rc::gen::arbitrary<bool>();
    const bool b_blocked = *rc::gen::arbitrary<bool>();
    operand a = make_operand(ka, m, k, kb, true, e8m0, true);
    operand b = make_operand(kb_kind, n, k, kb, b_blocked, e8m0, true);
    std::vector<float> bias;
    for (std::int64_t i = 0; i < n; ++i)
      bias.push_back(static_cast<float>(*pt::uniform<int>(-512, 512)) / 64.0f);
    std::vector<float> got(static_cast<std::size_t>(m * n));
    kn::scaled_matmul(a.op(), b.op(), vec(bias.data(), dtype::float32, n),
                      matrix(got.data(), dtype::float32, m, n));

    const auto code_matrix = [](const operand& o) {
      ref::code_matrix c;
      c.elem = o.k == kind::e4m3
                   ? ref::gemm_elem::e4m3fn
                   : (o.k == kind::e5m2 ? ref::gemm_elem::e5m2 : ref::gemm_elem::int8);
      c.rows = o.rows;
      c.cols = o.cols;
      for (const std::uint16_t x : o.codes)
        c.codes.push_back(is_int(o.k) ? (x & 0xFFu) : x);
      c.scales = o.scales;
      return c;
    };
    const ref::gemm_result r =
        ref::exact_block_scaled_matmul(code_matrix(a), a.block_rows, code_matrix(b), b.block_rows,
                                       kb, bias, ref::gemm_out::float32);
    const std::int64_t nb = (k + kb - 1) / kb;
    const double u = std::ldexp(1.0, -24);
    const double nn = static_cast<double>(kb + nb);
    const ref::rational gamma = ref::exact(nn * u / (1 - nn * u));
    const ref::rational eta = ref::exact(std::ldexp(1.0, -149) * static_cast<double>(3 * nb + 1));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const ref::gemm_entry& e = r.at(i, j);
        RC_ASSERT(e.exact.is_finite());
        const float t = got[static_cast<std::size_t>(i * n + j)];
        RC_ASSERT(std::isfinite(t));
        const ref::rational err = abs(ref::exact(t) - e.exact.value);
        const ref::rational bound =
            gamma * e.abs_sum * ref::exact(1 + u) + ref::exact(2 * u) * abs(e.exact.value) + eta;
        RC_ASSERT(err <= bound);
      }
  });
}

TEST(gemm_blocks, argument_checks_name_the_argument) {
  std::vector<std::uint8_t> codes(4 * 64, 0x38);
  std::vector<float> s(8, 1.0f);
  std::vector<std::uint8_t> e(8, 127);
  std::vector<float> out(16);
  const auto op = [&](std::int64_t br, std::int64_t bk, std::int64_t ns, bool u8) {
    kn::gemm_operand o;
    o.codes = matrix(codes.data(), dtype::uint8, 4, 64);
    o.fmt = kn::target::of(emu::e4m3fn);
    o.scales = u8 ? vec(e.data(), dtype::uint8, ns) : vec(s.data(), dtype::float32, ns);
    o.block_rows = br;
    o.block_k = bk;
    return o;
  };
  const auto message = [&](const kn::gemm_operand& a, const kn::gemm_operand& b) {
    try {
      kn::scaled_matmul(a, b, kn::tensor_view{}, matrix(out.data(), dtype::float32, 4, 4));
    } catch (const lowbit::error& x) {
      return std::string(x.what());
    }
    return std::string();
  };
  EXPECT_NE(message(op(1, 32, 3, false), op(0, 0, 1, false)).find("a.scales: 1 x 32 blocks"),
            std::string::npos);
  EXPECT_NE(message(op(1, 32, 8, false), op(1, 64, 4, false)).find("b.scales: K blocks of 64"),
            std::string::npos);
  EXPECT_NE(message(op(0, 32, 8, false), op(0, 0, 1, false)).find("block_rows >= 1"),
            std::string::npos);
  EXPECT_NE(message(op(0, 0, 4, true), op(0, 0, 1, false)).find("a.scales: dtype uint8"),
            std::string::npos);
  EXPECT_EQ(message(op(1, 32, 8, true), op(2, 32, 4, true)), "");
}

TEST(gemm_blocks, named_fp8_recipes_and_their_checks) {
  std::vector<std::string> names;
  for (const kn::linear_recipe& r : kn::named_fp8_recipes())
    names.push_back(r.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"fp8_tensorwise", "fp8_tensorwise_delayed", "fp8_rowwise",
                                      "fp8_blockwise_1x128", "mxfp8", "hopper_emulated"}));
  const kn::linear_recipe b = kn::named_fp8_recipe("fp8_blockwise_1x128");
  EXPECT_EQ(b.forward.a.block_shape(), (std::pair<std::int64_t, std::int64_t>{1, 128}));
  EXPECT_EQ(b.forward.b.block_shape(), (std::pair<std::int64_t, std::int64_t>{128, 128}));
  EXPECT_EQ(b.grad_weight.b.block_shape(), (std::pair<std::int64_t, std::int64_t>{1, 128}));
  EXPECT_TRUE(b.grad_input.a.fmt.fmt == emu::e5m2);
  const kn::linear_recipe h = kn::named_fp8_recipe("hopper_emulated");
  EXPECT_TRUE(h.accumulation && *h.accumulation == kn::hopper_accumulation);
  EXPECT_EQ(h.forward.a.scaling, kn::scaling_mode::delayed);
  EXPECT_EQ(kn::named_fp8_recipe("mxfp8").forward.a.block_shape().second, 32);
  EXPECT_THROW(kn::named_fp8_recipe("fp9"), lowbit::error);
  kn::linear_recipe bad = kn::fp8_recipe(kn::fp8_granularity::rowwise);
  bad.forward.a.scaling = kn::scaling_mode::delayed;
  EXPECT_THROW(kn::check(bad), lowbit::error);
  bad = kn::fp8_recipe(kn::fp8_granularity::blockwise);
  bad.forward.b.block = 64;
  EXPECT_THROW(kn::check(bad), lowbit::error);
  bad = kn::fp8_recipe(kn::fp8_granularity::tensorwise);
  bad.accumulation = emu::exact_accumulation;
  EXPECT_THROW(kn::check(bad), lowbit::error);
}

// The blockwise recipe's forward: X in 1 x 128 blocks, W in 128 x 128 tiles by kernels::quantize,
// the scales passed to the matmul as quantize wrote them; the result is the blocked rule's.
TEST(gemm_blocks, a_recipes_quantized_operands_feed_the_matmul) {
  const kn::linear_recipe r = kn::named_fp8_recipe("fp8_blockwise_1x128");
  const std::int64_t m = 5, n = 131, k = 300;
  std::vector<float> x(static_cast<std::size_t>(m * k)), w(static_cast<std::size_t>(n * k));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(static_cast<float>(i % 13) - 6.0f, static_cast<int>(i % 9) - 4);
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = std::ldexp(static_cast<float>(i % 11) - 5.0f, static_cast<int>(i % 7) - 3);
  const auto [ar, ak] = r.forward.a.block_shape();
  const auto [br, bk] = r.forward.b.block_shape();
  const std::int64_t sa_n = m * ((k + ak - 1) / ak);
  const std::int64_t sb_n = ((n + br - 1) / br) * ((k + bk - 1) / bk);
  std::vector<std::uint8_t> xc(x.size()), wc(w.size());
  std::vector<float> sa(static_cast<std::size_t>(sa_n)), sb(static_cast<std::size_t>(sb_n));
  kn::quantize(matrix(x.data(), dtype::float32, m, k), matrix(xc.data(), dtype::uint8, m, k),
               vec(sa.data(), dtype::float32, sa_n), r.forward.a.fmt, kn::grouping::blocks(ak),
               emu::rne_sat);
  kn::quantize(matrix(w.data(), dtype::float32, n, k), matrix(wc.data(), dtype::uint8, n, k),
               vec(sb.data(), dtype::float32, sb_n), r.forward.b.fmt, kn::grouping::tiles(br, bk),
               emu::rne_sat);
  kn::gemm_operand a, b;
  a.codes = matrix(xc.data(), dtype::uint8, m, k);
  a.scales = vec(sa.data(), dtype::float32, sa_n);
  a.block_rows = ar;
  a.block_k = ak;
  b.codes = matrix(wc.data(), dtype::uint8, n, k);
  b.scales = vec(sb.data(), dtype::float32, sb_n);
  b.block_rows = br;
  b.block_k = bk;
  std::vector<float> out(static_cast<std::size_t>(m * n));
  kn::scaled_matmul(a, b, kn::tensor_view{}, matrix(out.data(), dtype::float32, m, n));
  operand oa, ob;
  oa.k = ob.k = kind::e4m3;
  oa.rows = m;
  ob.rows = n;
  oa.cols = ob.cols = k;
  oa.codes.assign(xc.begin(), xc.end());
  ob.codes.assign(wc.begin(), wc.end());
  oa.block_rows = ar;
  oa.kb = ak;
  ob.block_rows = br;
  ob.kb = bk;
  oa.scales = sa;
  ob.scales = sb;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const float want = rule(oa, ob, i, j, ak, std::nullopt, 0.0f);
      const float got = out[static_cast<std::size_t>(i * n + j)];
      EXPECT_EQ(std::memcmp(&want, &got, 4), 0) << i << ", " << j;
      // and near the product of the original values (fp8's relative error, twice)
      double exact = 0, mag = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        exact += static_cast<double>(x[static_cast<std::size_t>(i * k + l)]) *
                 w[static_cast<std::size_t>(j * k + l)];
        mag += std::fabs(static_cast<double>(x[static_cast<std::size_t>(i * k + l)]) *
                         w[static_cast<std::size_t>(j * k + l)]);
      }
      EXPECT_LE(std::fabs(got - exact), 0.14 * mag + 1e-30);
    }
}

} // namespace
