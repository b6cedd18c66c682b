// The scaled matmul's CPU twin (lowbit::kernels::scaled_matmul on CPU views) and the SwitchBack
// layer chain (kernels::quantize + scaled_matmul) against the exact reference
// (reference/gemm.hpp), within the bounds derived in docs/techniques/gemm-bounds.md:
//
//   with per-row scales the twin's float32 value t = fl(fl(fl(acc * sb) * sa) + bias) satisfies
//     |t - y*| <= E = (1+u) [e_S |sa sb| (1+u)^r + |S sa sb| ((1+u)^r - 1)
//                            + eta (1 + |sa| (1+u))] + u |y*|
//   (without bias: the bracket alone), u = 2^-24, eta = 2^-150 (half the smallest subnormal: a
//   product that underflows), r the number of inexact multiplications (a power-of-two scale
//   multiplies exactly), e_S the accumulator's error: 0 for an int8 sum of at most 2^24, u |S|
//   above it, gamma_{K-1} sum |a b| for the float32 sum of fp8 and 16-bit products. With scalar
//   scales (one or none per operand) t = fl(fl(acc * s) + bias) for the float32 factor
//   s = fl(sa sb), whose own error d = |s - sa sb| is computed exactly (it may underflow or
//   overflow: then the class of the result follows s):
//     E = (1+u) [e_S |s| (1+u)^r + |S s| ((1+u)^r - 1) + |S| d + 2 eta] + u |y*|,
//   r = 0 where s is a power of two, else 1.
//
// A float32 output must lie within E of y*; a bfloat16 or float16 output must be the rounding of
// a value within E of y* (the reference's rounding of y*, or, where the band holds a rounding
// boundary, its neighbour). NaN and Inf results are compared exactly wherever the bound
// determines them (every case but an Inf scale meeting an accumulator whose sign the bound leaves
// open). The chain adds the code flips of quantization (a code may be the exact rounding of
// x q* or its neighbour where x q* lies within 2u + u^2 of a rounding boundary) and the
// roundings of the stored factors d = fl(amax / max) against the exact d*.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <lowbit/emu/emu.hpp>
#include <lowbit/kernels/gemm.hpp>
#include <lowbit/kernels/quantize.hpp>
#include <lowbit/reference/gemm.hpp>

#include "../common/gemm_inputs.hpp"
#include "support.hpp"

namespace {

namespace emu = lowbit::emu;
namespace kn = lowbit::kernels;
namespace ref = lowbit::reference;
namespace pt = lowbit::proptest;
using kn::dtype;
using pt::uniform;
using pt::test::check_property;
using ref::extended;
using ref::integer;
using ref::rational;

// ---- operand types ---------------------------------------------------------------------------

struct elem_case {
  const char* name;
  kn::target t;
  ref::gemm_elem e;
  dtype codes;
};

const elem_case int8_full{"int8", kn::target::of(emu::int8), ref::gemm_elem::int8, dtype::int8};
const elem_case int8_sym{"int8_sym", kn::target::of(emu::int8_sym), ref::gemm_elem::int8,
                         dtype::int8};
const elem_case e4m3{"e4m3fn", kn::target::of(emu::e4m3fn), ref::gemm_elem::e4m3fn, dtype::uint8};
const elem_case e5m2{"e5m2", kn::target::of(emu::e5m2), ref::gemm_elem::e5m2, dtype::uint8};
const elem_case bf16{"bfloat16", kn::target::of(emu::bfloat16), ref::gemm_elem::bfloat16,
                     dtype::bfloat16};
const elem_case f16{"float16", kn::target::of(emu::float16), ref::gemm_elem::float16,
                    dtype::float16};

// The operand pairs the matmul takes: int8 with int8 (either range), fp8 with fp8, a 16-bit
// format with itself.
struct pair_case {
  elem_case a, b;
};
std::vector<pair_case> int8_pairs() {
  return {
      {int8_full, int8_full}, {int8_sym, int8_sym}, {int8_full, int8_sym}, {int8_sym, int8_full}};
}
std::vector<pair_case> float_pairs() {
  return {{e4m3, e4m3}, {e4m3, e5m2}, {e5m2, e4m3}, {e5m2, e5m2}, {bf16, bf16}, {f16, f16}};
}

struct out_case {
  dtype t;
  ref::gemm_out o;
};
std::vector<out_case> outs() {
  return {{dtype::float32, ref::gemm_out::float32},
          {dtype::bfloat16, ref::gemm_out::bfloat16},
          {dtype::float16, ref::gemm_out::float16}};
}

bool is_int8(const elem_case& c) {
  return c.e == ref::gemm_elem::int8;
}

// ---- the twin --------------------------------------------------------------------------------

// A problem as the test holds it: codes, scales and bias as plain vectors.
struct problem {
  pair_case p;
  pt::test::gemm_operands ops;
  std::vector<float> sa, sb, bias;
  dtype bias_type = dtype::float32; // bias values are exact in this type
  out_case out;
};

kn::tensor_view vec_view(const void* data, dtype t, std::size_t n) {
  return kn::tensor_view::contiguous(data, t, {static_cast<std::int64_t>(n)});
}

// The twin's outputs as codes: float32 bits, or bfloat16/float16 codes.
std::vector<std::uint32_t> run_twin(const problem& q) {
  const auto& o = q.ops;
  const auto ab = pt::test::code_bytes(q.p.a.t, o.a), bb = pt::test::code_bytes(q.p.b.t, o.b);
  kn::gemm_operand a, b;
  a.codes = kn::tensor_view::contiguous(ab.data(), q.p.a.codes, {o.m, o.k});
  a.fmt = q.p.a.t;
  a.scales = vec_view(q.sa.data(), dtype::float32, q.sa.size());
  b.codes = kn::tensor_view::contiguous(bb.data(), q.p.b.codes, {o.n, o.k});
  b.fmt = q.p.b.t;
  b.scales = vec_view(q.sb.data(), dtype::float32, q.sb.size());
  // A 16-bit bias is passed as its codes (its values are exact there, see draw_problem).
  std::vector<std::uint16_t> bias16;
  kn::tensor_view bias = vec_view(q.bias.data(), dtype::float32, q.bias.size());
  if (q.bias_type != dtype::float32 && !q.bias.empty()) {
    const emu::format f = q.bias_type == dtype::bfloat16 ? emu::bfloat16 : emu::float16;
    for (const float v : q.bias)
      bias16.push_back(static_cast<std::uint16_t>(emu::encode(f, v, emu::rne)));
    bias = vec_view(bias16.data(), q.bias_type, bias16.size());
  }
  const std::size_t count = static_cast<std::size_t>(o.m * o.n);
  std::vector<std::uint32_t> r(count);
  if (q.out.t == dtype::float32) {
    std::vector<float> out(count);
    kn::scaled_matmul(a, b, bias, kn::tensor_view::contiguous(out.data(), q.out.t, {o.m, o.n}));
    for (std::size_t i = 0; i < count; ++i)
      std::memcpy(&r[i], &out[i], 4);
  } else {
    std::vector<std::uint16_t> out(count);
    kn::scaled_matmul(a, b, bias, kn::tensor_view::contiguous(out.data(), q.out.t, {o.m, o.n}));
    for (std::size_t i = 0; i < count; ++i)
      r[i] = out[i];
  }
  return r;
}

ref::gemm_result run_reference(const problem& q) {
  ref::code_matrix a{q.p.a.e, q.ops.m, q.ops.k, q.ops.a, q.sa};
  ref::code_matrix b{q.p.b.e, q.ops.n, q.ops.k, q.ops.b, q.sb};
  return ref::exact_scaled_matmul(a, b, q.bias, q.out.o);
}

// ---- the bound -------------------------------------------------------------------------------

rational pow2(int e) {
  return e >= 0 ? rational(integer(1) << e) : rational(integer(1), integer(1) << -e);
}
const rational u = pow2(-24);
const rational eta = pow2(-150);

rational one_plus_u_pow(int r) {
  rational p = 1;
  for (int i = 0; i < r; ++i)
    p *= 1 + u;
  return p;
}
// gamma_n = n u / (1 - n u).
rational gamma(std::int64_t n) {
  const rational nu = rational(n) * u;
  return nu / (1 - nu);
}

rational abs_of(const rational& x) {
  return x < 0 ? rational(-x) : x;
}

bool is_pow2(float s) {
  int e = 0;
  return std::isfinite(s) && s != 0 && std::fabs(std::frexp(s, &e)) == 0.5f;
}

// What the bound needs of one output element.
struct bound_terms {
  rational e_s;         // |acc - S|
  rational scale;       // |sa sb| (exact factors of the specification), or |s| for scalar scales
  rational second = 0;  // the factor of the second multiplication, |sa| (1 for scalar scales)
  rational delta_s = 0; // scalar scales: |s - sa sb|
  int roundings = 0;    // inexact multiplications (and stored scales) between acc and the sum
  bool has_bias = false;
};

// E of the header for an exact sum S and y*.
rational error_bound(const bound_terms& b, const rational& s, const rational& y) {
  const rational g = one_plus_u_pow(b.roundings);
  const rational t2 = b.e_s * b.scale * g + abs_of(s) * b.scale * (g - 1) + abs_of(s) * b.delta_s +
                      eta * (1 + b.second * (1 + u));
  return b.has_bias ? (1 + u) * t2 + u * abs_of(y) : t2;
}

// The accumulator's error for the plain matmul: exact int8 sums (one rounding into float above
// 2^24), the float32 sum of exact products otherwise.
rational sum_error(const problem& q, const ref::gemm_entry& e) {
  if (is_int8(q.p.a)) {
    const rational s = e.sum.is_finite() ? abs_of(e.sum.value) : rational(0);
    return s > pow2(24) ? u * s : rational(0);
  }
  return q.ops.k > 1 ? gamma(q.ops.k - 1) * e.abs_sum : rational(0);
}

const extended& scale_of(const std::vector<extended>& s, std::int64_t i) {
  static const extended one = extended::of(rational(1));
  return s.empty() ? one : (s.size() == 1 ? s[0] : s[static_cast<std::size_t>(i)]);
}

// An order on extended values for the band check (NaN never reaches it).
rational order_key(const extended& v, const ref::gemm_out o) {
  const rational far = ref::grid_above_max(ref::out_format(o)) * 2;
  if (v.k == extended::kind::pos_inf)
    return far;
  if (v.k == extended::kind::neg_inf)
    return -far;
  return v.value;
}

// A rational for messages: %.9g of its nearest double (enough to tell float32 values apart).
std::string show(const rational& x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

std::string describe_code(ref::gemm_out o, std::uint32_t code) {
  const extended v = ref::output_value(o, code);
  std::string s = pt::test::hex_code(code);
  if (v.is_nan())
    return s + " (NaN)";
  if (v.is_inf())
    return s + (v.k == extended::kind::neg_inf ? " (-Inf)" : " (+Inf)");
  return s + " (" + show(v.value) + ")";
}

// The outcome class an element must have, where the bound decides it: the epilogue's extended
// value is evaluated for every accumulator the bound allows (S itself when its sign is certain,
// else a negative, zero and positive one); one class for all means the class is determined.
enum class outcome { finite, nan, pos_inf, neg_inf, open };
outcome class_of(const extended& v) {
  switch (v.k) {
  case extended::kind::finite: return outcome::finite;
  case extended::kind::nan: return outcome::nan;
  case extended::kind::pos_inf: return outcome::pos_inf;
  case extended::kind::neg_inf: return outcome::neg_inf;
  }
  return outcome::open;
}

outcome determined_class(const extended& s, const rational& e_s, const extended& sa,
                         const extended& sb, const extended* bias) {
  std::vector<extended> accs;
  if (!s.is_finite() || e_s == 0 || abs_of(s.value) > e_s)
    accs.push_back(s); // an Inf or NaN sum is the accumulator's too: no finite sum overflows
  else
    accs = {extended::of(rational(-1)), extended::of(rational(0)), extended::of(rational(1))};
  outcome c = outcome::open;
  for (std::size_t i = 0; i < accs.size(); ++i) {
    extended y = ref::mul(ref::mul(accs[i], sa), sb);
    if (bias != nullptr)
      y = ref::add(y, *bias);
    const outcome ci = class_of(y);
    if (i == 0)
      c = ci;
    else if (ci != c)
      return outcome::open;
  }
  return c;
}

// One output element against the reference: `twin` is the twin's output code, y the
// reference's entry, E the bound. Returns a message on failure, empty on success.
std::string check_value(ref::gemm_out o, std::uint32_t twin, const ref::gemm_entry& y,
                        const rational& bound, outcome cls) {
  const extended tv = ref::output_value(o, twin);
  const std::string got =
      "twin " + describe_code(o, twin) + ", reference " + describe_code(o, y.rounded);
  switch (cls) {
  case outcome::open: return {};
  case outcome::nan: return tv.is_nan() ? std::string() : "expected NaN: " + got;
  case outcome::pos_inf:
    return tv.k == extended::kind::pos_inf ? std::string() : "expected +Inf: " + got;
  case outcome::neg_inf:
    return tv.k == extended::kind::neg_inf ? std::string() : "expected -Inf: " + got;
  case outcome::finite: break;
  }
  if (!y.exact.is_finite())
    return "reference not finite where the bound says finite: " + got;
  const rational& ys = y.exact.value;
  if (tv.is_nan())
    return "unexpected NaN: " + got;
  if (o == ref::gemm_out::float32) {
    // The twin's float32 value itself is bounded; an overflow to Inf needs |y*| + E to reach
    // the float32 overflow threshold 2^128 - 2^103.
    if (tv.is_inf()) {
      const bool neg = tv.k == extended::kind::neg_inf;
      const rational threshold = pow2(128) - pow2(103);
      if ((neg ? -ys : ys) + bound >= threshold)
        return {};
      return "overflow to Inf far from the threshold: " + got;
    }
    if (abs_of(tv.value - ys) <= bound)
      return {};
    return "|twin - y*| = " + show(abs_of(tv.value - ys)) + " exceeds the bound " + show(bound) +
           ": " + got;
  }
  if (twin == y.rounded)
    return {};
  // The band [y* - E, y* + E]: the twin's code must be the rounding of a value in it, i.e. lie
  // between the roundings of its ends (rounding is monotone).
  const std::uint32_t lo = ref::round_output(o, extended::of(ys - bound));
  const std::uint32_t hi = ref::round_output(o, extended::of(ys + bound));
  const rational kl = order_key(ref::output_value(o, lo), o),
                 kh = order_key(ref::output_value(o, hi), o), kt = order_key(tv, o);
  if (lo != hi && kl <= kt && kt <= kh)
    return {};
  return "outside the band's roundings " + describe_code(o, lo) + " .. " + describe_code(o, hi) +
         " (bound " + show(bound) + "): " + got;
}

// Every element of a problem against the reference; counts what was decided how.
struct tally {
  int exact_equal = 0, within_band = 0, specials = 0, open = 0;
};

void check_problem(const problem& q, tally* t = nullptr) {
  const auto twin = run_twin(q);
  const ref::gemm_result r = run_reference(q);
  std::vector<extended> sa, sb, bias;
  for (const float v : q.sa)
    sa.push_back(extended::of(static_cast<double>(v)));
  for (const float v : q.sb)
    sb.push_back(extended::of(static_cast<double>(v)));
  for (const float v : q.bias)
    bias.push_back(extended::of(static_cast<double>(v)));
  for (std::int64_t i = 0; i < q.ops.m; ++i)
    for (std::int64_t j = 0; j < q.ops.n; ++j) {
      const ref::gemm_entry& e = r.at(i, j);
      const extended& sai = scale_of(sa, i);
      const extended& sbj = scale_of(sb, j);
      const extended* bj = bias.empty() ? nullptr : &bias[static_cast<std::size_t>(j)];
      bound_terms b;
      b.e_s = sum_error(q, e);
      const float fa = q.sa.empty() ? 1.0f : q.sa[q.sa.size() == 1 ? 0 : i];
      const float fb = q.sb.empty() ? 1.0f : q.sb[q.sb.size() == 1 ? 0 : j];
      const bool scalar = q.sa.size() <= 1 && q.sb.size() <= 1;
      const float fs = fa * fb; // scalar scales: the rule's one factor
      const extended es = extended::of(static_cast<double>(fs)), one = extended::of(rational(1));
      b.roundings = scalar ? (is_pow2(fs) ? 0 : 1) : (is_pow2(fa) ? 0 : 1) + (is_pow2(fb) ? 0 : 1);
      b.has_bias = bj != nullptr;
      const outcome cls = scalar ? determined_class(e.sum, b.e_s, es, one, bj)
                                 : determined_class(e.sum, b.e_s, sai, sbj, bj);
      rational bound = 0;
      if (cls == outcome::finite) {
        if (scalar) {
          b.scale = abs_of(es.value);
          b.second = 1;
          b.delta_s = abs_of(es.value - sai.value * sbj.value);
        } else {
          b.scale = abs_of(sai.value * sbj.value);
          b.second = abs_of(sai.value);
        }
        bound = error_bound(b, e.sum.value, e.exact.value);
      }
      const std::uint32_t got = twin[static_cast<std::size_t>(i * q.ops.n + j)];
      const std::string msg = check_value(q.out.o, got, e, bound, cls);
      if (!msg.empty())
        RC_FAIL(std::string(q.p.a.name) + " x " + q.p.b.name + " -> " +
                ref::gemm_out_name(q.out.o) + ", M N K = " + std::to_string(q.ops.m) + " " +
                std::to_string(q.ops.n) + " " + std::to_string(q.ops.k) + ", element (" +
                std::to_string(i) + ", " + std::to_string(j) + "): " + msg);
      if (t != nullptr) {
        if (cls == outcome::open)
          ++t->open;
        else if (cls != outcome::finite)
          ++t->specials;
        else if (got == e.rounded)
          ++t->exact_equal;
        else
          ++t->within_band;
      }
    }
}

// A bias value exact in its dtype: float32 as drawn, 16-bit ones rounded there first.
std::vector<float> in_bias_type(std::vector<float> v, dtype t) {
  if (t == dtype::float32)
    return v;
  const emu::format f = t == dtype::bfloat16 ? emu::bfloat16 : emu::float16;
  for (float& x : v)
    x = emu::decode<float>(f, emu::encode(f, x, emu::rne));
  return v;
}

problem draw_problem(const std::vector<pair_case>& pairs, bool specials) {
  problem q;
  q.p = *rc::gen::elementOf(pairs);
  const auto all_outs = outs();
  q.out = *rc::gen::elementOf(all_outs);
  q.ops = pt::test::draw_operands(q.p.a.t, q.p.b.t, *pt::test::operand_mixes(), specials);
  // Scales near 1 keep float16 outputs mostly finite; the output's overflow is checked too.
  q.sa = pt::test::draw_scales(q.ops.m, pt::test::scale_values(-12, 6));
  q.sb = pt::test::draw_scales(q.ops.n, pt::test::scale_values(-12, 6));
  q.bias_type = *rc::gen::element(dtype::float32, dtype::bfloat16, dtype::float16);
  q.bias = in_bias_type(pt::test::draw_bias(q.ops.n, *uniform<int>(-6, 2)), q.bias_type);
  return q;
}

// ---- twin against the reference --------------------------------------------------------------

TEST(gemm_reference, int8_twin_within_the_bound) {
  tally t;
  check_property("gemm_int8_twin_vs_reference", 150, [&t] {
    const problem q = draw_problem(int8_pairs(), false);
    check_problem(q, &t);
  });
  // Most outputs are round(y*) itself (every bf16/fp16 output away from a boundary, float32 ones
  // under power-of-two scales); an undetermined element would be a hole in the check.
  EXPECT_GT(t.exact_equal, 0);
  EXPECT_EQ(t.open, 0); // nothing undetermined without specials
}

TEST(gemm_reference, fp8_and_16bit_twin_within_the_bound) {
  tally t;
  check_property("gemm_float_twin_vs_reference", 150, [&t] {
    const problem q = draw_problem(float_pairs(), false);
    check_problem(q, &t);
  });
  EXPECT_GT(t.exact_equal, 0);
  EXPECT_EQ(t.open, 0);
}

// int8 sums with |acc| > 2^24: the conversion of acc to float32 is the one extra rounding.
TEST(gemm_reference, int8_large_sums_within_the_bound) {
  check_property("gemm_int8_large_sums", 20, [] {
    problem q;
    q.p = {int8_full, int8_full};
    q.out = {dtype::float32, ref::gemm_out::float32};
    q.ops.m = *uniform<std::int64_t>(1, 2);
    q.ops.n = *uniform<std::int64_t>(1, 2);
    q.ops.k = *uniform<std::int64_t>(1100, 3000); // 127 * 127 * 1041 > 2^24
    const auto big = rc::gen::element<std::uint32_t>(0x7Fu, 0x80u, 0x7Eu, 0x81u);
    q.ops.a = *rc::gen::container<std::vector<std::uint32_t>>(
        static_cast<std::size_t>(q.ops.m * q.ops.k), big);
    // B's rows carry A's signs mostly, so that the sum grows past 2^24.
    q.ops.b.resize(static_cast<std::size_t>(q.ops.n * q.ops.k));
    for (std::int64_t j = 0; j < q.ops.n; ++j)
      for (std::int64_t l = 0; l < q.ops.k; ++l)
        q.ops.b[static_cast<std::size_t>(j * q.ops.k + l)] =
            (q.ops.a[static_cast<std::size_t>(l)] & 0x80u) != 0 ? 0x81u : 0x7Fu;
    q.sa = pt::test::draw_scales(q.ops.m);
    q.sb = pt::test::draw_scales(q.ops.n);
    q.bias = pt::test::draw_bias(q.ops.n, 20);
    check_problem(q);
  });
}

// ---- specials ----------------------------------------------------------------------------------

// NaN and Inf codes (e5m2 has both, e4m3fn NaN only), Inf * 0 products, NaN/Inf/zero scales and
// NaN/Inf biases: the twin is NaN or the signed Inf exactly where the reference is, whenever the
// bound determines it (asserted to be most elements).
TEST(gemm_reference, specials_where_the_reference_has_them) {
  tally t;
  check_property("gemm_specials", 200, [&t] {
    const std::vector<pair_case> fp8 = {{e4m3, e4m3}, {e4m3, e5m2}, {e5m2, e4m3}, {e5m2, e5m2}};
    const bool ints = *uniform<int>(0, 3) == 0;
    problem q = draw_problem(ints ? int8_pairs() : fp8, true);
    const auto with_specials = [](std::vector<float>& v) {
      for (float& x : v)
        if (*uniform<int>(0, 2) == 0)
          x = *pt::test::special_floats();
    };
    with_specials(q.sa);
    with_specials(q.sb);
    q.bias_type = dtype::float32;
    with_specials(q.bias);
    check_problem(q, &t);
  });
  EXPECT_GT(t.specials, 0);
  EXPECT_GT(t.specials + t.exact_equal + t.within_band, 20 * t.open);
}

// The exactly determined cases spelled out on one element each (e5m2 codes: 0x7C = +Inf,
// 0xFC = -Inf, 0x7F = NaN, 0x3C = 1, 0x00 = 0; e4m3fn 0x7F = NaN).
TEST(gemm_reference, special_cases_one_by_one) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct row {
    const char* what;
    std::vector<std::uint32_t> a, b;
    float sa, sb, bias;
    outcome want;
  };
  const std::vector<row> rows = {
      {"NaN code", {0x7F, 0x3C}, {0x3C, 0x3C}, 1, 1, 0, outcome::nan},
      {"Inf * 0", {0x7C, 0x3C}, {0x00, 0x3C}, 1, 1, 0, outcome::nan},
      {"+Inf + -Inf", {0x7C, 0xFC}, {0x3C, 0x3C}, 1, 1, 0, outcome::nan},
      {"Inf * 1", {0x7C, 0x3C}, {0x3C, 0x3C}, 1, 1, 0, outcome::pos_inf},
      {"Inf * -1", {0x7C, 0x3C}, {0xBC, 0x3C}, 1, 1, 0, outcome::neg_inf},
      {"Inf sum * scale 0", {0x7C, 0x3C}, {0x3C, 0x3C}, 0, 1, 0, outcome::nan},
      {"Inf sum * scale -2", {0x7C, 0x3C}, {0x3C, 0x3C}, -2, 1, 0, outcome::neg_inf},
      {"finite * NaN scale", {0x3C, 0x3C}, {0x3C, 0x3C}, 1, nan, 0, outcome::nan},
      {"finite * Inf scale", {0x3C, 0x3C}, {0x3C, 0x3C}, inf, 1, 0, outcome::pos_inf},
      {"zero sum * Inf scale", {0x00, 0x00}, {0x3C, 0x3C}, inf, 1, 0, outcome::nan},
      {"finite + Inf bias", {0x3C, 0x3C}, {0x3C, 0x3C}, 1, 1, -inf, outcome::neg_inf},
      {"+Inf + -Inf bias", {0x7C, 0x3C}, {0x3C, 0x3C}, 1, 1, -inf, outcome::nan},
      {"finite + NaN bias", {0x3C, 0x3C}, {0x3C, 0x3C}, 1, 1, nan, outcome::nan},
  };
  for (const auto& o : outs())
    for (const row& r : rows) {
      problem q;
      q.p = {e5m2, e5m2};
      q.out = o;
      q.ops = {1, 1, 2, r.a, r.b};
      q.sa = {r.sa};
      q.sb = {r.sb};
      q.bias = {r.bias};
      const ref::gemm_result y = run_reference(q);
      EXPECT_EQ(class_of(y.at(0, 0).exact), r.want) << r.what;
      const std::uint32_t got = run_twin(q)[0];
      const extended v = ref::output_value(o.o, got);
      EXPECT_EQ(class_of(v), r.want) << r.what << " -> " << ref::gemm_out_name(o.o);
      EXPECT_EQ(got, y.at(0, 0).rounded) << r.what << " (NaNs: the positive quiet NaN)";
    }
}

// ---- invariants --------------------------------------------------------------------------------

// float32 steps written out: static_cast<float> of an int64 rounds to nearest-even, and each
// statement is one rounded operation (x86-64 without FMA, so nothing is contracted).
std::uint32_t naive_int8_output(std::int64_t acc, float sa, float sb, bool scalar, float bias,
                                dtype out) {
  float v = static_cast<float>(acc);
  if (scalar) {
    const float s = sa * sb;
    v = v * s;
  } else {
    v = v * sb;
    v = v * sa;
  }
  v = v + bias;
  if (std::isnan(v))
    return out == dtype::float32 ? 0x7FC00000u : (out == dtype::bfloat16 ? 0x7FC0u : 0x7E00u);
  if (out == dtype::float32) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    return b;
  }
  return emu::encode(out == dtype::bfloat16 ? emu::bfloat16 : emu::float16, v, emu::rne);
}

TEST(gemm_reference, int8_twin_is_int64_sum_then_epilogue) {
  check_property("gemm_int8_naive", 100, [] {
    problem q = draw_problem(int8_pairs(), false);
    q.bias_type = dtype::float32;
    q.sa = pt::test::draw_scales(q.ops.m, pt::test::scale_values(-40, 40));
    q.sb = pt::test::draw_scales(q.ops.n, pt::test::scale_values(-40, 40));
    const auto twin = run_twin(q);
    for (std::int64_t i = 0; i < q.ops.m; ++i)
      for (std::int64_t j = 0; j < q.ops.n; ++j) {
        std::int64_t acc = 0;
        for (std::int64_t l = 0; l < q.ops.k; ++l) {
          const auto av =
              static_cast<std::int8_t>(q.ops.a[static_cast<std::size_t>(i * q.ops.k + l)]);
          const auto bv =
              static_cast<std::int8_t>(q.ops.b[static_cast<std::size_t>(j * q.ops.k + l)]);
          acc += std::int64_t{av} * std::int64_t{bv};
        }
        const float sa = q.sa.empty() ? 1.0f : q.sa[q.sa.size() == 1 ? 0 : i];
        const float sb = q.sb.empty() ? 1.0f : q.sb[q.sb.size() == 1 ? 0 : j];
        const float bias = q.bias.empty() ? 0.0f : q.bias[static_cast<std::size_t>(j)];
        const std::uint32_t want =
            naive_int8_output(acc, sa, sb, q.sa.size() <= 1 && q.sb.size() <= 1, bias, q.out.t);
        const std::uint32_t got = twin[static_cast<std::size_t>(i * q.ops.n + j)];
        RC_ASSERT(got == want);
      }
  });
}

// Doubling row i's scale doubles row i of the output exactly and leaves the others alone (no
// bias; powers of two move only exponents while nothing overflows or underflows: scales and
// operands keep every value far inside float32 and the output format).
TEST(gemm_reference, doubling_a_row_scale_doubles_its_row) {
  check_property("gemm_row_scale_pow2", 100, [] {
    const bool ints = *pt::coin();
    problem q = draw_problem(ints ? int8_pairs() : float_pairs(), false);
    q.out = {dtype::float32, ref::gemm_out::float32};
    q.bias.clear();
    q.sa = *rc::gen::container<std::vector<float>>(static_cast<std::size_t>(q.ops.m),
                                                   pt::test::scale_values(-8, 8));
    const auto before = run_twin(q);
    const std::int64_t row = *uniform<std::int64_t>(0, q.ops.m - 1);
    q.sa[static_cast<std::size_t>(row)] *= 2.0f;
    const auto after = run_twin(q);
    for (std::int64_t i = 0; i < q.ops.m; ++i)
      for (std::int64_t j = 0; j < q.ops.n; ++j) {
        const auto at = static_cast<std::size_t>(i * q.ops.n + j);
        float b, a;
        std::memcpy(&b, &before[at], 4);
        std::memcpy(&a, &after[at], 4);
        if (std::isnan(b)) {
          RC_ASSERT(std::isnan(a));
          continue;
        }
        // Away from float underflow (where doubling a subnormal loses nothing but a rounding
        // made before may differ), doubling is exact.
        if (std::fabs(b) < 0x1p-100f)
          continue;
        RC_ASSERT(a == (i == row ? 2.0f * b : b));
      }
  });
}

// Negating A negates the output (no bias; NaN stays NaN). int8's -128 has no negation and is
// kept out.
TEST(gemm_reference, negating_a_negates_the_output) {
  check_property("gemm_sign_symmetry", 100, [] {
    const bool ints = *pt::coin();
    const std::vector<pair_case> pairs =
        ints ? std::vector<pair_case>{{int8_sym, int8_sym}, {int8_sym, int8_full}} : float_pairs();
    problem q = draw_problem(pairs, !ints);
    q.bias.clear();
    const auto before = run_twin(q);
    for (auto& c : q.ops.a)
      c = pt::test::negate_code(q.p.a.t, c);
    const auto after = run_twin(q);
    const emu::format f = ref::out_format(q.out.o);
    for (std::size_t i = 0; i < before.size(); ++i) {
      if (std::isnan(emu::decode<double>(f, before[i]))) {
        RC_ASSERT(std::isnan(emu::decode<double>(f, after[i])));
        continue;
      }
      const double b = emu::decode<double>(f, before[i]), a = emu::decode<double>(f, after[i]);
      RC_ASSERT(a == -b); // zeros: +0 == -0 (the twin adds a +0 bias, which makes zeros +0)
    }
  });
}

// ---- the SwitchBack chain ----------------------------------------------------------------------

// Float inputs of one case: random significands over a range of exponents, zeros, a few
// outliers (SwitchBack's row-wise scaling meets them in every activation row); or, a third of
// the time, values whose scaled values are the target's ties (tie_values), where the kernels'
// codes may flip to the neighbour of the exact code. `columns` lays the ties out for per-column
// groups (each column holds its absmax).
std::vector<float> layer_values(std::int64_t rows, std::int64_t cols, int e0,
                                const ref::quant_target& t, bool columns) {
  if (*uniform<int>(0, 2) == 0) {
    const kn::target kt = t.is_int ? kn::target::of(t.ifmt) : kn::target::of(t.fmt);
    if (!columns)
      return pt::test::tie_values(rows, cols, kt, e0 - 16);
    const std::vector<float> tr = pt::test::tie_values(cols, rows, kt, e0 - 16);
    std::vector<float> v(tr.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        v[static_cast<std::size_t>(r * cols + c)] = tr[static_cast<std::size_t>(c * rows + r)];
    return v;
  }
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (float& x : v) {
    const int k = *uniform<int>(0, 99);
    if (k < 5)
      x = 0.0f;
    else
      x = std::ldexp(static_cast<float>(*uniform<int>(-(1 << 24), 1 << 24)),
                     e0 - 24 + (k < 10 ? 6 : 0) + *uniform<int>(-6, 0));
  }
  return v;
}

kn::target kernel_target(const ref::quant_target& t) {
  return t.is_int ? kn::target::of(t.ifmt) : kn::target::of(t.fmt);
}

// The twin's codes and factors for one operand, quantized as the variant says.
struct twin_quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> d;
};

twin_quantized quantize_twin(const ref::float_matrix& x, const ref::quant_target& t, bool per_row,
                             bool columns_transposed) {
  twin_quantized r;
  r.codes.resize(x.values.size());
  const kn::target kt = kernel_target(t);
  const kn::grouping g = columns_transposed
                             ? kn::grouping::per_column()
                             : (per_row ? kn::grouping::per_row() : kn::grouping::per_tensor());
  const std::int64_t groups = g.scale_rows(x.rows) * g.scale_cols(x.cols);
  r.d.resize(static_cast<std::size_t>(groups));
  const std::int64_t cr = columns_transposed ? x.cols : x.rows;
  const std::int64_t cc = columns_transposed ? x.rows : x.cols;
  kn::quantize(kn::tensor_view::contiguous(x.values.data(), dtype::float32, {x.rows, x.cols}),
               kn::tensor_view::contiguous(r.codes.data(), kt.code_dtype(), {cr, cc}),
               kn::tensor_view::contiguous(r.d.data(), dtype::float32, {groups}), kt, g, emu::rne,
               {}, {}, columns_transposed);
  return r;
}

// The largest |v' v'' - v* w*| over the codes a flip may give each element, summed over k,
// and the largest sum of |products|, for output (i, j) of a chain: each operand element's twin
// code is the exact one or, inside the band, the rounding of a band end.
struct flip_terms {
  rational flip;    // bound on |sum of twin products - exact sum|
  rational abs_max; // bound on sum |twin products|
};

struct element_options {
  rational v[2]; // the values the twin's code may have (equal when no flip is possible)
};

std::vector<element_options> options_of(const ref::exact_quantized& q, const ref::quant_target& t) {
  const rational eps = 2 * u + u * u;
  std::vector<element_options> r(q.x_times_q.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    const rational& y = q.x_times_q[i];
    const bool neg = y < 0;
    const auto value = [&](std::uint32_t c) { return ref::element_value(q.codes.elem, c).value; };
    const std::uint32_t lo = ref::quantize_value(t, y * (1 - eps), neg, emu::rne);
    const std::uint32_t hi = ref::quantize_value(t, y * (1 + eps), neg, emu::rne);
    r[i].v[0] = value(lo);
    r[i].v[1] = value(hi);
  }
  return r;
}

flip_terms flips_for(const std::vector<element_options>& a, const std::vector<element_options>& b,
                     const ref::exact_quantized& qa, const ref::exact_quantized& qb, std::int64_t i,
                     std::int64_t j, std::int64_t k) {
  flip_terms f;
  for (std::int64_t l = 0; l < k; ++l) {
    const auto ia = static_cast<std::size_t>(i * k + l), ib = static_cast<std::size_t>(j * k + l);
    const rational exact = ref::element_value(qa.codes.elem, qa.codes.codes[ia]).value *
                           ref::element_value(qb.codes.elem, qb.codes.codes[ib]).value;
    rational worst = 0, largest = 0;
    for (const rational& x : a[ia].v)
      for (const rational& y : b[ib].v) {
        worst = std::max(worst, abs_of(x * y - exact));
        largest = std::max(largest, abs_of(x * y));
      }
    f.flip += worst;
    f.abs_max += largest;
  }
  return f;
}

// The chain's bound for one output: the accumulator of the twin's codes is within
// flip + (its own summation error) of the exact sum of the exact codes, and the stored factors
// d = fl(d*) add one rounding each to the two multiplications: r = 4.
rational chain_bound(const ref::chain_result& c, const flip_terms& f, bool int8, std::int64_t k,
                     std::int64_t i, std::int64_t j, bool has_bias) {
  const ref::gemm_entry& e = c.y.at(i, j);
  const rational s = abs_of(e.sum.value);
  rational e_s = f.flip;
  if (int8)
    e_s += s + f.flip > pow2(24) ? u * (s + f.flip) : rational(0);
  else if (k > 1)
    e_s += gamma(k - 1) * f.abs_max;
  const rational da =
      c.a.dequant.size() == 1 ? c.a.dequant[0] : c.a.dequant[static_cast<std::size_t>(i)];
  const rational db =
      c.b.dequant.size() == 1 ? c.b.dequant[0] : c.b.dequant[static_cast<std::size_t>(j)];
  // Per-row factors multiply B's first, so A's factor is the second multiplication's; scalar
  // factors are one fl(da db) (the fourth rounding), one multiplication.
  const bool scalar = c.a.dequant.size() <= 1 && c.b.dequant.size() <= 1;
  bound_terms b;
  b.e_s = e_s;
  b.scale = da * db;
  b.second = scalar ? rational(1) : da * (1 + u);
  b.roundings = 4;
  b.has_bias = has_bias;
  return error_bound(b, e.sum.value, e.exact.value);
}

// Runs one layer matmul of the chain on the twin and checks every output against the
// reference chain.
void check_chain(const ref::chain_result& c, const ref::quant_target& ta,
                 const ref::quant_target& tb, const twin_quantized& qa, const twin_quantized& qb,
                 std::int64_t m, std::int64_t n, std::int64_t k, const std::vector<float>& bias,
                 const out_case& o, const char* what) {
  kn::gemm_operand a, b;
  a.codes = kn::tensor_view::contiguous(qa.codes.data(), kernel_target(ta).code_dtype(), {m, k});
  a.fmt = kernel_target(ta);
  a.scales = vec_view(qa.d.data(), dtype::float32, qa.d.size());
  b.codes = kn::tensor_view::contiguous(qb.codes.data(), kernel_target(tb).code_dtype(), {n, k});
  b.fmt = kernel_target(tb);
  b.scales = vec_view(qb.d.data(), dtype::float32, qb.d.size());
  const std::size_t count = static_cast<std::size_t>(m * n);
  std::vector<std::uint32_t> got(count);
  if (o.t == dtype::float32) {
    std::vector<float> out(count);
    kn::scaled_matmul(a, b, vec_view(bias.data(), dtype::float32, bias.size()),
                      kn::tensor_view::contiguous(out.data(), o.t, {m, n}));
    for (std::size_t i = 0; i < count; ++i)
      std::memcpy(&got[i], &out[i], 4);
  } else {
    std::vector<std::uint16_t> out(count);
    kn::scaled_matmul(a, b, vec_view(bias.data(), dtype::float32, bias.size()),
                      kn::tensor_view::contiguous(out.data(), o.t, {m, n}));
    for (std::size_t i = 0; i < count; ++i)
      got[i] = out[i];
  }
  const auto oa = options_of(c.a, ta), ob = options_of(c.b, tb);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const flip_terms f = flips_for(oa, ob, c.a, c.b, i, j, k);
      const rational bound = chain_bound(c, f, ta.is_int, k, i, j, !bias.empty());
      const std::string msg = check_value(o.o, got[static_cast<std::size_t>(i * n + j)],
                                          c.y.at(i, j), bound, outcome::finite);
      if (!msg.empty())
        RC_FAIL(std::string(what) + " -> " + ref::gemm_out_name(o.o) + ", M N K = " +
                std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) +
                ", element (" + std::to_string(i) + ", " + std::to_string(j) + "): " + msg);
    }
}

std::vector<ref::switchback_variant> variants() {
  return {ref::switchback_variant::int8, ref::switchback_variant::int8_q,
          ref::switchback_variant::fp8, ref::switchback_variant::fp8_q};
}

TEST(gemm_reference, switchback_forward_within_the_chain_bound) {
  check_property("gemm_switchback_forward", 120, [] {
    const auto all = variants();
    const ref::switchback_variant v = *rc::gen::elementOf(all);
    const std::int64_t m = *uniform<std::int64_t>(1, 5), n = *uniform<std::int64_t>(1, 5),
                       k = *uniform<std::int64_t>(1, 40);
    const ref::quant_target t = ref::switchback_input_target(v);
    const ref::float_matrix x{m, k, layer_values(m, k, *uniform<int>(-20, 20), t, false)};
    const ref::float_matrix w{n, k, layer_values(n, k, *uniform<int>(-20, 20), t, false)};
    const auto all_outs = outs();
    const out_case o = *rc::gen::elementOf(all_outs);
    const std::vector<float> bias = pt::test::draw_bias(n, *uniform<int>(-10, 10));
    const ref::chain_result c = ref::switchback_forward(x, w, bias, v, o.o);
    const bool w_rows = ref::switchback_weight_per_row(v);
    const twin_quantized qx = quantize_twin(x, t, true, false);
    const twin_quantized qw = quantize_twin(w, t, w_rows, false);
    check_chain(c, t, t, qx, qw, m, n, k, bias, o, ref::switchback_variant_name(v));
  });
}

TEST(gemm_reference, switchback_input_grad_within_the_chain_bound) {
  check_property("gemm_switchback_input_grad", 120, [] {
    const auto all = variants();
    const ref::switchback_variant v = *rc::gen::elementOf(all);
    // G is M x N (N the layer's outputs), W is N x K, dX is M x K: the inner dimension is N.
    const std::int64_t m = *uniform<std::int64_t>(1, 5), n = *uniform<std::int64_t>(1, 40),
                       k = *uniform<std::int64_t>(1, 5);
    const ref::quant_target tg = ref::switchback_grad_target(v);
    const ref::quant_target tw = ref::switchback_input_target(v);
    const bool w_cols = ref::switchback_weight_per_row(v);
    const ref::float_matrix g{m, n, layer_values(m, n, *uniform<int>(-30, 0), tg, false)};
    const ref::float_matrix w{n, k, layer_values(n, k, *uniform<int>(-10, 10), tw, w_cols)};
    const auto all_outs = outs();
    const out_case o = *rc::gen::elementOf(all_outs);
    const ref::chain_result c = ref::switchback_input_grad(g, w, v, o.o);
    const twin_quantized qg = quantize_twin(g, tg, true, false);
    // W^T's codes: per column of W transposed (SwitchBackQ), or W's tensor-wise codes transposed.
    twin_quantized qw;
    if (w_cols) {
      qw = quantize_twin(w, tw, false, true);
    } else {
      const twin_quantized q = quantize_twin(w, tw, false, false);
      qw.d = q.d;
      qw.codes.resize(q.codes.size());
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t col = 0; col < k; ++col)
          qw.codes[static_cast<std::size_t>(col * n + r)] =
              q.codes[static_cast<std::size_t>(r * k + col)];
    }
    check_chain(c, tg, tw, qg, qw, m, k, n, {}, o, ref::switchback_variant_name(v));
  });
}

// ---- the reference itself ----------------------------------------------------------------------

// Small integer cases whose exact value is known without the reference: a 1 x 1 x K product of
// ones is K, the scales multiply, the bias adds; the rounding is the one of round.hpp.
TEST(gemm_reference, reference_on_values_known_by_hand) {
  const ref::code_matrix a{ref::gemm_elem::int8, 1, 3, {0x01u, 0x02u, 0xFFu}, {0.5f}};
  const ref::code_matrix b{
      ref::gemm_elem::int8, 2, 3, {0x03u, 0x04u, 0x05u, 0x80u, 0x00u, 0x7Fu}, {2.0f, 0.25f}};
  // row 0: 1*3 + 2*4 + (-1)*5 = 6; row 1: -128 + 0 - 127 = -255.
  const ref::gemm_result r = ref::exact_scaled_matmul(a, b, {1.0f, -0.5f}, ref::gemm_out::float32);
  EXPECT_EQ(r.at(0, 0).sum.value, rational(6));
  EXPECT_EQ(r.at(0, 0).exact.value, rational(6) * rational(1, 2) * 2 + 1);
  EXPECT_EQ(r.at(0, 1).sum.value, rational(-255));
  EXPECT_EQ(r.at(0, 1).exact.value,
            rational(-255) * rational(1, 2) * rational(1, 4) - rational(1, 2));
  EXPECT_EQ(r.at(0, 1).abs_sum, rational(128 + 127));
  float f;
  std::memcpy(&f, &r.at(0, 1).rounded, 4);
  EXPECT_EQ(f, -255.0f / 8.0f - 0.5f);
  // One third in float32, bf16 and fp16: nearest-even of the exact 1/3.
  const ref::code_matrix one{ref::gemm_elem::int8, 1, 1, {0x01u}, {}};
  for (const auto& o : outs()) {
    const ref::code_matrix third{ref::gemm_elem::int8, 1, 1, {0x01u}, {1.0f / 3.0f}};
    const ref::gemm_result t = ref::exact_scaled_matmul(one, third, {}, o.o);
    EXPECT_EQ(t.at(0, 0).rounded,
              emu::encode(ref::out_format(o.o), static_cast<double>(1.0f / 3.0f), emu::rne));
  }
  EXPECT_THROW(ref::exact_scaled_matmul(a, ref::code_matrix{ref::gemm_elem::int8, 1, 2, {0, 0}, {}},
                                        {}, ref::gemm_out::float32),
               lowbit::error);
  EXPECT_THROW(ref::exact_scaled_matmul(ref::code_matrix{ref::gemm_elem::int8, 1, 1, {0x100u}, {}},
                                        one, {}, ref::gemm_out::float32),
               lowbit::error);
}

// Inconsistent operands are refused with lowbit::error, never read out of bounds.
TEST(gemm_reference, reference_refuses_inconsistent_operands) {
  const ref::code_matrix a{ref::gemm_elem::e4m3fn, 2, 2, {0x38u, 0x38u, 0x38u, 0x38u}, {}};
  const ref::code_matrix b{ref::gemm_elem::e5m2, 1, 2, {0x3Cu, 0x3Cu}, {}};
  const auto out = ref::gemm_out::float32;
  EXPECT_NO_THROW(ref::exact_scaled_matmul(a, b, {}, out));
  ref::code_matrix three_scales = a;
  three_scales.scales = {1.0f, 1.0f, 1.0f}; // 0, 1 or rows (2) allowed
  EXPECT_THROW(ref::exact_scaled_matmul(three_scales, b, {}, out), lowbit::error);
  ref::code_matrix short_codes = a;
  short_codes.codes.pop_back();
  EXPECT_THROW(ref::exact_scaled_matmul(short_codes, b, {}, out), lowbit::error);
  EXPECT_THROW(ref::exact_scaled_matmul(a, b, {1.0f, 2.0f}, out), lowbit::error); // N = 1
  const ref::float_matrix g{1, 3, {1.0f, 2.0f, 3.0f}}, w{2, 2, {1.0f, 2.0f, 3.0f, 4.0f}};
  EXPECT_THROW(ref::switchback_input_grad(g, w, ref::switchback_variant::int8, out),
               lowbit::error); // G has 3 columns, W 2 rows
  EXPECT_THROW(ref::switchback_forward(g, w, {}, ref::switchback_variant::fp8, out),
               lowbit::error); // X has K = 3, W has K = 2
}

// The exact chain's pieces: q* = 127 / amax per row, codes the exact roundings, d* = 1 / q*.
TEST(gemm_reference, chain_quantizes_exactly) {
  const ref::float_matrix x{2, 3, {1.0f, -0.5f, 0.25f, 0.0f, 0.0f, 0.0f}};
  const ref::exact_quantized q =
      ref::quantize_exact(x, ref::switchback_input_target(ref::switchback_variant::int8), true);
  EXPECT_EQ(q.scale[0], rational(127));
  EXPECT_EQ(q.dequant[0], rational(1, 127));
  EXPECT_EQ(q.scale[1], rational(1)); // an all-zero row: q* = d* = 1
  // 127, -63.5 -> -64 (ties to even), 31.75 -> 32
  EXPECT_EQ(q.codes.codes[0], 127u);
  EXPECT_EQ(q.codes.codes[1], static_cast<std::uint32_t>(256 - 64));
  EXPECT_EQ(q.codes.codes[2], 32u);
  const ref::float_matrix bad{1, 1, {std::numeric_limits<float>::infinity()}};
  EXPECT_THROW(
      ref::quantize_exact(bad, ref::switchback_input_target(ref::switchback_variant::fp8), false),
      lowbit::error);
}

} // namespace
