// The quantization CPU twin (lowbit::kernels::quantize / quantize_mx) against the exact reference
// (reference/quantize.hpp), within the bound derived in docs/techniques/quantization.md:
//
//   the twin computes y = fl(x * fl(q*)); |y - x q*| <= |x q*| (2u + u^2), u = 2^-24,
//
// so its code may differ from the exact rounding of x q* only where x q* lies within that band of a
// rounding boundary, and then only by one step. Both conditions are checked exactly: the band
// [x q* (1 - eps), x q* (1 + eps)] must contain a boundary (the reference rounds its two ends
// differently) and the twin's code must be the rounding of one of the ends. Power-of-two scales
// make y exact (away from float underflow), and OCP MX involves no rounding besides the element's:
// there the twin must equal the reference bit for bit.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/quantize.hpp>
#include <lowbit/reference/quantize.hpp>

#include "support.hpp"

namespace {

using namespace lowbit;
using lowbit::proptest::test::check_property;
using lowbit::proptest::test::describe;
using lowbit::proptest::test::hex_code;
namespace ref = lowbit::reference;
using rational = ref::rational;
using kernels::dtype;

struct case_target {
  kernels::target kt;
  ref::quant_target rt;
};

case_target make(const emu::format& f) {
  return {kernels::target::of(f), {false, f, {}}};
}
case_target make(const emu::int_format& f) {
  return {kernels::target::of(f), {true, {}, f}};
}

std::vector<case_target> targets() {
  return {make(emu::e4m3fn),   make(emu::e5m2),   make(emu::e4m3fnuz), make(emu::e3m2fn),
          make(emu::e2m3fn),   make(emu::e2m1fn), make(emu::float16),  make(emu::bfloat16),
          make(emu::int8_sym), make(emu::int8),   make(emu::uint8),    make(emu::int4_sym)};
}

// Values that put groups in every state: ordinary, outliers, exact grid values after scaling is
// unknown in advance, so plain random magnitudes over a wide range, zeros, and (rarely) NaN/Inf.
std::vector<float> group_values(std::size_t n, bool specials) {
  std::vector<float> v(n);
  const int e0 = *rc::gen::inRange(-60, 60);
  for (auto& x : v) {
    const int k = *rc::gen::inRange(0, 100);
    if (specials && k < 2)
      x = (k == 0 ? 1.0f : -1.0f) * std::numeric_limits<float>::quiet_NaN();
    else if (specials && k < 4)
      x = -std::numeric_limits<float>::infinity();
    else if (k < 10)
      x = 0.0f;
    else
      x = std::ldexp(static_cast<float>(*rc::gen::inRange(-(1 << 24), 1 << 24)),
                     e0 - 24 + *rc::gen::inRange(-8, 3));
  }
  return v;
}

rational exact_of(float x) {
  return ref::exact(static_cast<double>(x));
}

std::uint32_t code_at(const std::vector<unsigned char>& codes, dtype t, std::size_t i) {
  if (t == dtype::uint16) {
    std::uint16_t c;
    std::memcpy(&c, codes.data() + 2 * i, 2);
    return c;
  }
  return codes[i];
}

constexpr double u = 1.0 / (1 << 24);

// The value of a target code (saturated codes are finite; a NaN or Inf code fails the caller's
// comparison by throwing, which rapidcheck reports).
rational value(const case_target& t, std::uint32_t code) {
  if (t.rt.is_int) { // integer codes are the value's two's complement low 8 bits
    const auto b = static_cast<std::uint8_t>(code);
    return t.rt.ifmt.is_signed ? rational(static_cast<std::int8_t>(b)) : rational(b);
  }
  if (ref::is_inf(t.rt.fmt, code))
    return (ref::sign_of(t.rt.fmt, code) ? -1 : 1) * (ref::grid_above_max(t.rt.fmt) * 2);
  return ref::value_of(t.rt.fmt, code);
}

// One element of a scaled group: the twin's code is acceptable under the bound of the header.
void check_element(const case_target& t, const emu::policy& pol, float x, const rational& q,
                   bool pow2, std::uint32_t twin, const std::string& where) {
  const rational y = exact_of(x) * q;
  const bool neg = std::signbit(x);
  const std::uint32_t exact_code = ref::quantize_value(t.rt, y, neg, pol);
  if (twin == exact_code)
    return;
  const rational tiny = rational(1, ref::integer(1) << 126); // float underflow below 2^-126
  RC_ASSERT_FALSE(pow2 && (y > tiny || y < -tiny));          // exact product: must agree
  const rational eps = rational(2) * rational(u) + rational(u) * rational(u);
  const rational lo = y * (1 - eps), hi = y * (1 + eps);
  const std::uint32_t c_lo = ref::quantize_value(t.rt, lo, neg, pol);
  const std::uint32_t c_hi = ref::quantize_value(t.rt, hi, neg, pol);
  // Roundings are monotone, so the results reachable from the band are exactly the values
  // between those of its two ends (a grid point inside the band is reachable too: round to odd
  // keeps an exact even value).
  const rational v_lo = value(t, c_lo), v_hi = value(t, c_hi), v = value(t, twin);
  const bool inside = (v_lo <= v && v <= v_hi) || (v_hi <= v && v <= v_lo);
  if (c_lo == c_hi || !inside)
    RC_FAIL(where + ": twin " + hex_code(twin) + ", exact " + hex_code(exact_code) +
            ", band ends " + hex_code(c_lo) + "/" + hex_code(c_hi) + " for x " +
            lowbit::proptest::test::describe_input(x) + " " + describe(pol));
}

TEST(quantize, twin_within_derived_bound_of_reference) {
  check_property("quantize_twin_vs_reference", 300, [] {
    const auto all = targets();
    const case_target t = *rc::gen::elementOf(all);
    const auto pols = lowbit::proptest::test::deterministic_policies();
    const emu::policy pol = *rc::gen::elementOf(pols);
    kernels::scaling sc;
    sc.margin = *rc::gen::inRange(-2, 3);
    sc.pow2 = *rc::gen::arbitrary<bool>();
    const std::int64_t m = *rc::gen::inRange(1, 6), n = *rc::gen::inRange(1, 40);
    const int gk = *rc::gen::inRange(0, 5);
    const kernels::grouping g =
        gk == 0   ? kernels::grouping::per_tensor()
        : gk == 1 ? kernels::grouping::per_row()
        : gk == 2 ? kernels::grouping::per_column()
        : gk == 3 ? kernels::grouping::blocks(*rc::gen::inRange<std::int64_t>(1, 17))
                  : kernels::grouping::tiles(*rc::gen::inRange<std::int64_t>(1, 4),
                                             *rc::gen::inRange<std::int64_t>(1, 9));
    const auto x = group_values(static_cast<std::size_t>(m * n), *rc::gen::inRange(0, 4) == 0);
    const dtype ct = t.kt.code_dtype();
    std::vector<unsigned char> codes(static_cast<std::size_t>(m * n) * kernels::dtype_size(ct));
    const std::int64_t ns = g.scale_rows(m) * g.scale_cols(n);
    std::vector<float> d(static_cast<std::size_t>(ns));
    kernels::quantize(kernels::tensor_view::contiguous(x.data(), dtype::float32, {m, n}),
                      kernels::tensor_view::contiguous(codes.data(), ct, {m, n}),
                      kernels::tensor_view::contiguous(d.data(), dtype::float32, {ns}), t.kt, g,
                      pol, sc);
    // Exact amax per group, then every element against the bound.
    // The group of element (r, c), from the grouping's definition (docs), row-major over groups.
    const auto gi = [&](std::int64_t r, std::int64_t c) -> std::int64_t {
      switch (g.k) {
      case kernels::grouping::kind::tensor: return 0;
      case kernels::grouping::kind::rows: return r;
      case kernels::grouping::kind::columns: return c;
      case kernels::grouping::kind::blocks: return r * g.scale_cols(n) + c / g.tile_cols;
      case kernels::grouping::kind::tiles:
        return (r / g.tile_rows) * g.scale_cols(n) + c / g.tile_cols;
      }
      return 0;
    };
    std::vector<rational> amax(static_cast<std::size_t>(ns), rational(0));
    std::vector<bool> poisoned(static_cast<std::size_t>(ns), false);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t c = 0; c < n; ++c) {
        const float v = x[static_cast<std::size_t>(r * n + c)];
        const auto k = static_cast<std::size_t>(gi(r, c));
        if (!std::isfinite(v))
          poisoned[k] = true;
        else if (abs(exact_of(v)) > amax[k])
          amax[k] = abs(exact_of(v));
      }
    const rational flt_max = ref::exact(static_cast<double>(std::numeric_limits<float>::max()));
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t c = 0; c < n; ++c) {
        const auto i = static_cast<std::size_t>(r * n + c);
        const auto k = static_cast<std::size_t>(gi(r, c));
        const std::uint32_t twin = code_at(codes, ct, i);
        const std::string where = "element (" + std::to_string(r) + ", " + std::to_string(c) + ")";
        if (poisoned[k]) { // the group is NaN: d NaN, every code encode(+NaN)
          RC_ASSERT(std::isnan(d[k]));
          const std::uint32_t want = t.rt.is_int ? 0u : ref::round(t.rt.fmt, std::nan(""), pol);
          RC_ASSERT(twin == want);
          continue;
        }
        if (amax[k] == 0) {
          RC_ASSERT(d[k] == 1.0f);
          continue;
        }
        const rational q = ref::exact_scale(t.rt, amax[k], sc.margin, sc.pow2);
        if (!sc.pow2 && q > flt_max)
          continue; // q clamped to FLT_MAX by the twin (documented)
        check_element(t, pol, x[i], q, sc.pow2, twin, where);
        // d within one float rounding of d* (exact for power-of-two scales)
        const rational dstar = 1 / q, dt = ref::exact(static_cast<double>(d[k]));
        const rational err = dt > dstar ? dt - dstar : dstar - dt;
        if (sc.pow2)
          RC_ASSERT(err == 0);
        else
          RC_ASSERT(err <= dstar * rational(u));
      }
  });
}

TEST(quantize, mx_twin_equals_reference) {
  check_property("quantize_mx_twin_vs_reference", 300, [] {
    const std::vector<case_target> all = {make(emu::e4m3fn), make(emu::e5m2),   make(emu::e3m2fn),
                                          make(emu::e2m3fn), make(emu::e2m1fn), make(emu::int8)};
    const case_target t = *rc::gen::elementOf(all);
    auto pols = lowbit::proptest::test::deterministic_policies();
    const emu::policy pol = *rc::gen::elementOf(pols);
    const std::int64_t block = *rc::gen::element<std::int64_t>(32, 32, 8, 5);
    const std::int64_t m = *rc::gen::inRange(1, 4), n = *rc::gen::inRange(1, 100);
    const auto x = group_values(static_cast<std::size_t>(m * n), *rc::gen::inRange(0, 4) == 0);
    const dtype ct = t.kt.code_dtype();
    std::vector<unsigned char> codes(static_cast<std::size_t>(m * n));
    const std::int64_t nb = (n + block - 1) / block;
    std::vector<std::uint8_t> scales(static_cast<std::size_t>(m * nb));
    kernels::quantize_mx(kernels::tensor_view::contiguous(x.data(), dtype::float32, {m, n}),
                         kernels::tensor_view::contiguous(codes.data(), ct, {m, n}),
                         kernels::tensor_view::contiguous(scales.data(), dtype::uint8, {m * nb}),
                         t.kt, pol, block);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < nb; ++j) {
        rational amax = 0;
        bool poisoned = false;
        for (std::int64_t c = j * block; c < std::min(n, (j + 1) * block); ++c) {
          const float v = x[static_cast<std::size_t>(r * n + c)];
          if (!std::isfinite(v))
            poisoned = true;
          else if (abs(exact_of(v)) > amax)
            amax = abs(exact_of(v));
        }
        const std::uint32_t sc = scales[static_cast<std::size_t>(r * nb + j)];
        if (poisoned) {
          RC_ASSERT(sc == 0xFFu);
          continue;
        }
        const int s = amax == 0 ? -127 : ref::mx_shared_exponent(amax, t.kt.emax());
        RC_ASSERT(sc == static_cast<std::uint32_t>(s + 127));
        for (std::int64_t c = j * block; c < std::min(n, (j + 1) * block); ++c) {
          const auto i = static_cast<std::size_t>(r * n + c);
          const std::uint32_t want =
              ref::mx_element(t.rt, exact_of(x[i]), std::signbit(x[i]), s, pol);
          if (codes[i] != want)
            RC_FAIL("MX element (" + std::to_string(r) + ", " + std::to_string(c) + "): twin " +
                    hex_code(codes[i]) + ", reference " + hex_code(want) + " " + describe(pol));
        }
      }
  });
}

} // namespace

// The NaN rule of docs/techniques/quantization.md with a given scale: a NaN product carries
// sign(x) * sign(q) (a NaN input keeps its sign under a positive scale, Inf * 0 included), and a
// NaN scale makes every code the positive NaN. Checked against the reference's rounding of the
// expected value, for a symmetric format (e4m3fn), an IEEE one (e5m2) and one whose NaN has no
// sign (e4m3fnuz), both NaN-sign policies, saturating and not.
TEST(quantize, nan_sign_rule_of_scaled_products) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {nan, -nan, -inf, inf, 1.0f, -1.0f, 0.0f, -0.0f, 3.0e38f};
  for (const emu::format& f : {emu::e4m3fn, emu::e5m2, emu::e4m3fnuz})
    for (const emu::nan_sign ns : {emu::nan_sign::preserve, emu::nan_sign::positive})
      for (const emu::overflow ov : {emu::overflow::saturate, emu::overflow::nonsaturating})
        for (const float q : {2.0f, -2.0f, 0.0f, nan, -nan}) {
          const emu::policy pol{emu::rounding::nearest_even, ov, emu::subnormals::keep, ns, 0};
          std::vector<std::uint8_t> codes(xs.size());
          float qv = q;
          const auto n = static_cast<std::int64_t>(xs.size());
          kernels::cast_scaled(kernels::tensor_view::contiguous(xs.data(), dtype::float32, {n}),
                               kernels::tensor_view::contiguous(codes.data(), dtype::uint8, {n}),
                               kernels::tensor_view::contiguous(&qv, dtype::float32, {1}),
                               kernels::target::of(f), pol);
          for (std::size_t i = 0; i < xs.size(); ++i) {
            const double y = static_cast<double>(xs[i]) * static_cast<double>(q);
            double want = static_cast<double>(xs[i] * q); // exact here, or overflowing to Inf
            if (std::isnan(y))
              want = std::isnan(q)
                         ? std::fabs(std::nan(""))
                         : std::copysign(std::fabs(std::nan("")),
                                         (std::signbit(xs[i]) != std::signbit(q)) ? -1.0 : 1.0);
            EXPECT_EQ(codes[i], ref::round(f, want, pol))
                << emu::format_name(f) << " x=" << xs[i]
                << (std::signbit(xs[i]) ? " (sign set)" : "") << " q=" << q
                << (std::signbit(q) ? " (sign set)" : "") << " nan=" << static_cast<int>(ns)
                << " over=" << static_cast<int>(ov);
          }
        }
}
