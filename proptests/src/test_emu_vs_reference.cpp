// emu against the reference, bit for bit, over the edge-biased generators: encode from double and
// from float under every policy, decode of every code, integer quantization; then the invariants
// that any correct rounding has (sign symmetry, monotonicity, scale invariance, idempotence).
#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/proptest/generators.hpp>
#include <lowbit/reference/round.hpp>

#include "support.hpp"

namespace {

namespace ref = lowbit::reference;
namespace emu = lowbit::emu;
namespace pt = lowbit::proptest;
using pt::test::check_property;
using pt::test::describe;
using pt::test::describe_input;
using pt::test::hex_code;
using pt::test::named_format;

class per_format : public ::testing::TestWithParam<named_format> {};

std::string param_name(const ::testing::TestParamInfo<named_format>& info) {
  return pt::test::test_name(info.param);
}

// Every policy: the 48 deterministic ones and the 8 stochastic ones with k random bits.
std::vector<emu::policy> every_policy(int k) {
  auto v = pt::test::deterministic_policies();
  for (const auto& p : pt::test::stochastic_policies(k))
    v.push_back(p);
  return v;
}

template <class T> void encode_matches_reference(const named_format& nf, int cases) {
  const emu::format f = nf.fmt;
  check_property(nf.name + (sizeof(T) == 4 ? "/encode_float" : "/encode_double"), cases, [f, nf] {
    const T x = *pt::edge_values<T>(f);
    const int k = *pt::uniform<int>(1, 32);
    const std::uint32_t rbits = *pt::uniform<std::uint32_t>(0, 0xFFFFFFFFu);
    for (const emu::policy& p : every_policy(k)) {
      const std::uint32_t got = emu::encode(f, x, p, rbits);
      const std::uint32_t want = ref::round(f, static_cast<double>(x), p, rbits);
      if (got != want)
        RC_FAIL(nf.name + " " + describe(p) + " " + describe_input(x) + " rbits " +
                hex_code(rbits) + ": emu " + hex_code(got) + ", reference " + hex_code(want));
    }
  });
}

TEST_P(per_format, encode_double_matches_reference) {
  encode_matches_reference<double>(GetParam(), 500);
}
TEST_P(per_format, encode_float_matches_reference) {
  encode_matches_reference<float>(GetParam(), 500);
}

// Decode of random codes (every code is swept in the exhaustive test for formats up to 16 bits;
// this covers the wider ones): the exact value, the sign of zero, NaN and Inf by definition.
TEST_P(per_format, decode_matches_value_of) {
  const named_format nf = GetParam();
  const emu::format f = nf.fmt;
  check_property(nf.name + "/decode", 500, [f, nf] {
    const std::uint32_t c = *pt::any_code(f);
    const double d = emu::decode<double>(f, c);
    const std::string where = nf.name + " code " + hex_code(c);
    if (ref::is_nan(f, c)) {
      RC_ASSERT(std::isnan(d));
    } else if (ref::is_inf(f, c)) {
      RC_ASSERT(std::isinf(d));
      RC_ASSERT(std::signbit(d) == ref::sign_of(f, c));
    } else {
      if (ref::exact(d) != ref::value_of(f, c))
        RC_FAIL(where + ": decode<double> is not exact");
      RC_ASSERT(std::signbit(d) == ref::sign_of(f, c));
    }
    if (f.fits_float()) {
      const float x = emu::decode<float>(f, c);
      RC_ASSERT(std::isnan(x) == std::isnan(d));
      if (!std::isnan(x)) {
        RC_ASSERT(static_cast<double>(x) == d);
        RC_ASSERT(std::signbit(x) == std::signbit(d));
      }
    }
  });
}

// Sign symmetry: negating the input negates the result for the sign-symmetric roundings; up and
// down mirror each other. Compared through decoded values, since a format may lack -0 (fnuz,
// unsigned) or signed NaNs. Inputs below the smallest value of a format without zero are left
// out: the rule sends both signs to code 0 there.
TEST_P(per_format, sign_symmetry) {
  const named_format nf = GetParam();
  const emu::format f = nf.fmt;
  if (!f.is_signed)
    GTEST_SKIP() << "unsigned format";
  check_property(nf.name + "/sign_symmetry", 300, [f, nf] {
    const double x = *pt::edge_values<double>(f);
    RC_PRE(!std::isnan(x));
    RC_PRE(f.has_zero || std::fabs(x) >= emu::min_positive(f));
    const auto same_up_to_sign = [&](std::uint32_t a, std::uint32_t b) {
      const double da = emu::decode<double>(f, a), db = emu::decode<double>(f, b);
      if (std::isnan(da) || std::isnan(db))
        return std::isnan(da) && std::isnan(db);
      if (da != -db)
        return false;
      // Zeros: opposite signs where the format has -0.
      return da != 0 || !f.has_negative_zero() || std::signbit(da) != std::signbit(db);
    };
    using emu::rounding;
    for (const emu::policy& p0 : pt::test::deterministic_policies()) {
      emu::policy mirrored = p0;
      if (p0.round == rounding::up)
        mirrored.round = rounding::down;
      if (p0.round == rounding::down)
        mirrored.round = rounding::up;
      const std::uint32_t pos = emu::encode(f, x, p0), neg = emu::encode(f, -x, mirrored);
      if (!same_up_to_sign(pos, neg))
        RC_FAIL(nf.name + " " + describe(p0) + " " + describe_input(x) + ": " + hex_code(pos) +
                " vs " + hex_code(neg) + " for the negated input");
    }
  });
}

// Monotonicity: x <= y implies decode(encode(x)) <= decode(encode(y)) under every deterministic
// rounding. Saturating overflow, so that no NaN result (formats without Inf) interrupts the order.
TEST_P(per_format, monotone) {
  const named_format nf = GetParam();
  const emu::format f = nf.fmt;
  check_property(nf.name + "/monotone", 300, [f, nf] {
    const double x = *pt::edge_values<double>(f);
    RC_PRE(!std::isnan(x));
    // A close neighbour (a few ulps of double, up to a few grid steps away) or an arbitrary value.
    const int ulps = *pt::uniform<int>(1, 1 << 20);
    const double y = *rc::gen::oneOf(rc::gen::just(std::nextafter(x, HUGE_VAL)),
                                     rc::gen::just(x + ulps * std::fabs(x) * 0x1p-52),
                                     pt::edge_values<double>(f));
    RC_PRE(!std::isnan(y));
    const double lo = std::min(x, y), hi = std::max(x, y);
    for (const emu::policy& p : pt::test::deterministic_policies()) {
      if (p.over != emu::overflow::saturate)
        continue;
      const double a = emu::decode<double>(f, emu::encode(f, lo, p));
      const double b = emu::decode<double>(f, emu::encode(f, hi, p));
      if (!(a <= b))
        RC_FAIL(nf.name + " " + describe(p) + ": " + describe_input(lo) + " -> " +
                std::to_string(a) + " but " + describe_input(hi) + " -> " + std::to_string(b));
    }
  });
}

// Scale invariance: where x and x * 2^j both lie in [min normal, max], the results differ by the
// factor 2^j exactly, for every rounding (stochastic too: t does not change with the scale).
TEST_P(per_format, scale_invariance) {
  const named_format nf = GetParam();
  const emu::format f = nf.fmt;
  if (f.emax() == f.emin())
    GTEST_SKIP() << "a single normal binade: nothing to scale";
  check_property(nf.name + "/scale", 300, [f, nf] {
    // x in the normal range, j such that x * 2^j stays there.
    const int e = *pt::uniform<int>(f.emin(), f.emax());
    const double x = pt::detail::with_sign(std::ldexp(1.0 + *pt::unit_interval(), e),
                                           f.is_signed && *pt::coin());
    const int j = *pt::uniform<int>(f.emin() - e, f.emax() - e);
    const double y = std::ldexp(x, j);
    const double max = emu::max_value(f);
    RC_PRE(std::fabs(x) <= max && std::fabs(y) <= max); // the top binade may end below 2^(emax+1)
    const std::uint32_t rbits = *pt::uniform<std::uint32_t>(0, 0xFFFFFFFFu);
    for (const emu::policy& p : every_policy(*pt::uniform<int>(1, 32))) {
      const double a = emu::decode<double>(f, emu::encode(f, x, p, rbits));
      const double b = emu::decode<double>(f, emu::encode(f, y, p, rbits));
      if (std::ldexp(a, j) != b)
        RC_FAIL(nf.name + " " + describe(p) + " " + describe_input(x) + " * 2^" +
                std::to_string(j) + ": " + std::to_string(a) + " vs " + std::to_string(b));
    }
  });
}

// Idempotence: a result is on the grid, so converting its value again changes nothing (through
// double and through float, any random bits).
TEST_P(per_format, idempotent) {
  const named_format nf = GetParam();
  const emu::format f = nf.fmt;
  check_property(nf.name + "/idempotent", 300, [f, nf] {
    const double x = *pt::edge_values<double>(f);
    const std::uint32_t r1 = *pt::uniform<std::uint32_t>(0, 0xFFFFFFFFu);
    const std::uint32_t r2 = *pt::uniform<std::uint32_t>(0, 0xFFFFFFFFu);
    for (const emu::policy& p : every_policy(*pt::uniform<int>(1, 32))) {
      const std::uint32_t c = emu::encode(f, x, p, r1);
      const std::uint32_t again = emu::encode(f, emu::decode<double>(f, c), p, r2);
      if (again != c)
        RC_FAIL(nf.name + " " + describe(p) + " " + describe_input(x) + ": " + hex_code(c) +
                " re-encodes to " + hex_code(again));
      if (f.fits_float())
        RC_ASSERT(emu::encode(f, emu::decode<float>(f, c), p, r2) == c);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(formats, per_format, ::testing::ValuesIn(pt::test::all_formats()),
                         param_name);

// ---- integer targets -------------------------------------------------------------------------

// Inputs for integer quantization: integers and half-integers with +-1..2 ulps around them over
// and beyond the target's range, random values, and the edge values of a wide format.
template <class T> rc::Gen<T> int_inputs(const emu::int_format& f) {
  const std::int64_t span = std::int64_t{1} << (f.bits + 1);
  const rc::Gen<T> near_half_integers = rc::gen::apply(
      [](std::int64_t n, int half, int steps, bool negative) {
        const double v = static_cast<double>(n) + 0.5 * half;
        return pt::detail::nudge<T>(negative ? -v : v, steps);
      },
      pt::uniform<std::int64_t>(0, span), pt::uniform<int>(0, 1),
      rc::gen::element(-2, -1, 0, 0, 0, 1, 2), pt::coin());
  return rc::gen::weightedOneOf<T>({
      {6, near_half_integers},
      {2, pt::in_range<T>(emu::bfloat16)},
      {1, pt::specials<T>()},
      {1, pt::random_bits<T>()},
  });
}

TEST(integer, quantize_int_matches_round_int) {
  const std::pair<const char*, emu::int_format> formats[] = {
      {"int8", emu::int8}, {"int8_sym", emu::int8_sym}, {"uint8", emu::uint8},
      {"int4", emu::int4}, {"int4_sym", emu::int4_sym}, {"uint4", emu::uint4}};
  for (const auto& [name, f] : formats) {
    const auto run = [&, f = f, name = std::string(name)](auto tag) {
      using T = decltype(tag);
      check_property(name + (sizeof(T) == 4 ? "/float" : "/double"), 400, [f, name] {
        const T x = *int_inputs<T>(f);
        const int k = *pt::uniform<int>(1, 32);
        const std::uint32_t rbits = *pt::uniform<std::uint32_t>(0, 0xFFFFFFFFu);
        for (const emu::policy& p : every_policy(k)) {
          const std::int32_t got = emu::quantize_int(f, x, p, rbits);
          const std::int32_t want = ref::round_int(f, static_cast<double>(x), p, rbits);
          if (got != want)
            RC_FAIL(name + " " + describe(p) + " " + describe_input(x) + " rbits " +
                    hex_code(rbits) + ": emu " + std::to_string(got) + ", reference " +
                    std::to_string(want));
        }
      });
    };
    run(double{});
    run(float{});
  }
}

} // namespace
