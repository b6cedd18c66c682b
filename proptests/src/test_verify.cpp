// lowbit::verify against facts computed another way: identical arrays pass every policy; one
// flipped bit is found by exact with its index and bit patterns; ulp distances equal the number
// of grid steps counted in the reference's enumeration of a format's values (and the documented
// interpolation between them); tolerance and bound policies switch exactly at their boundary;
// the report's counts add up; bad arguments throw lowbit::error with a precise message.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include <gtest/gtest.h>

#include <lowbit/emu/emu.hpp>
#include <lowbit/proptest/generators.hpp>
#include <lowbit/reference/round.hpp>
#include <lowbit/verify/verify.hpp>

#include "support.hpp"

namespace {

namespace emu = lowbit::emu;
namespace kn = lowbit::kernels;
namespace pt = lowbit::proptest;
namespace vf = lowbit::verify;
namespace ref = lowbit::reference;
using kn::dtype;
using pt::test::check_property;

// A host array of any dtype as raw bytes, row-major.
struct array {
  dtype type = dtype::float32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;

  std::size_t width() const { return kn::dtype_size(type); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto e : shape)
      n *= e;
    return n;
  }
  kn::tensor_view view() const {
    kn::tensor_view v;
    v.data = const_cast<unsigned char*>(bytes.data());
    v.type = type;
    v.ndim = static_cast<int>(shape.size());
    std::int64_t stride = 1;
    for (int k = v.ndim - 1; k >= 0; --k) {
      v.shape[static_cast<std::size_t>(k)] = shape[static_cast<std::size_t>(k)];
      v.strides[static_cast<std::size_t>(k)] = stride;
      stride *= shape[static_cast<std::size_t>(k)];
    }
    return v;
  }
  std::uint64_t bits(std::int64_t i) const {
    std::uint64_t b = 0;
    std::memcpy(&b, bytes.data() + static_cast<std::size_t>(i) * width(), width()); // little endian
    return b;
  }
  void set_bits(std::int64_t i, std::uint64_t b) {
    std::memcpy(bytes.data() + static_cast<std::size_t>(i) * width(), &b, width());
  }
};

array make_array(dtype t, std::vector<std::int64_t> shape) {
  array a;
  a.type = t;
  a.shape = std::move(shape);
  a.bytes.assign(static_cast<std::size_t>(a.numel()) * a.width(), 0);
  return a;
}

template <class T> array from_values(const std::vector<T>& v) {
  array a = make_array(vf::dtype_of<T>(), {static_cast<std::int64_t>(v.size())});
  std::memcpy(a.bytes.data(), v.data(), a.bytes.size());
  return a;
}

std::string hex_of(std::uint64_t b, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(b));
  return buf;
}

std::vector<std::int64_t> unravel(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  return idx;
}

// The report's own bookkeeping, which every report must satisfy.
void check_invariants(const vf::report& r, std::size_t worst_limit) {
  RC_ASSERT(r.total == r.checked + r.nan_matches + r.nan_mismatches);
  RC_ASSERT(r.failed >= r.nan_mismatches);
  RC_ASSERT(r.failed <= r.total);
  std::int64_t sum = 0;
  for (const auto& b : r.histogram) {
    RC_ASSERT(b.count > 0);
    sum += b.count;
  }
  RC_ASSERT(sum == r.checked);
  RC_ASSERT(r.worst.size() <= worst_limit);
  const auto failing = static_cast<std::size_t>(
      std::count_if(r.worst.begin(), r.worst.end(), [](const vf::element& e) { return e.failed; }));
  RC_ASSERT(failing == std::min<std::size_t>(worst_limit, static_cast<std::size_t>(r.failed)));
  for (std::size_t k = 1; k < r.worst.size(); ++k)
    RC_ASSERT(r.worst[k - 1].failed || !r.worst[k].failed); // failing ones first
  RC_ASSERT(r.ok() == (r.failed == 0));
}

// A random array of one of the value dtypes, or of the codes of a format of at most 16 bits.
struct case_array {
  array a;
  std::optional<emu::format> fmt; // set for code arrays
};

rc::Gen<case_array> random_arrays() {
  return rc::gen::apply(
      [](int which, std::vector<std::int64_t> shape, std::uint64_t seed, int fmt_index) {
        static const auto formats = pt::test::formats_up_to(16);
        case_array c;
        const dtype types[] = {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                               dtype::int8,    dtype::int32,   dtype::uint8};
        dtype t = types[which];
        if (t == dtype::uint8) {
          c.fmt = formats[static_cast<std::size_t>(fmt_index) % formats.size()].fmt;
          t = c.fmt->bits() <= 8 ? dtype::uint8 : dtype::uint16;
        }
        c.a = make_array(t, std::move(shape));
        pt::detail::stream s{seed};
        const std::uint64_t mask =
            c.fmt ? (std::uint64_t{1} << c.fmt->bits()) - 1u : ~std::uint64_t{0};
        for (std::int64_t i = 0; i < c.a.numel(); ++i)
          c.a.set_bits(i, s.next() & mask);
        return c;
      },
      pt::uniform<int>(0, 6), pt::shapes(3, 600),
      pt::uniform<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()),
      pt::uniform<int>(0, 1000));
}

bool is_nan_element(const case_array& c, std::int64_t i) {
  const std::uint64_t b = c.a.bits(i);
  if (c.fmt)
    return emu::is_nan_code(*c.fmt, static_cast<std::uint32_t>(b));
  switch (c.a.type) {
  case dtype::float32: return (b & 0x7FFFFFFFu) > 0x7F800000u;
  case dtype::float64: return (b & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
  case dtype::float16: return (b & 0x7FFFu) > 0x7C00u;
  case dtype::bfloat16: return (b & 0x7FFFu) > 0x7F80u;
  default: return false;
  }
}

// ---- identical arrays, flipped bits -----------------------------------------------------------

TEST(verify, identical_arrays_pass_every_policy) {
  check_property("verify_identical", 300, [] {
    const case_array c = *random_arrays();
    const array copy = c.a; // a second buffer with the same bytes
    std::int64_t nans = 0;
    for (std::int64_t i = 0; i < c.a.numel(); ++i)
      nans += is_nan_element(c, i);
    std::vector<vf::policy> policies = {vf::exact(), vf::exact(true), vf::ulp(0),
                                        vf::tolerance(0, 0),
                                        vf::bound([](const vf::bound_args&) { return 0.0; })};
    for (auto& p : policies) {
      p.format = c.fmt;
      const vf::report r = vf::compare(copy.view(), c.a.view(), p);
      RC_ASSERT(r.ok());
      RC_ASSERT(r.total == c.a.numel());
      RC_ASSERT(r.nan_matches == nans);
      RC_ASSERT(r.checked == r.total - nans);
      RC_ASSERT(r.max_ulp_error == 0.0);
      RC_ASSERT(r.max_abs_error == 0.0);
      RC_ASSERT(r.worst.empty());
      RC_ASSERT(r.histogram.size() == (r.checked ? 1u : 0u));
      check_invariants(r, 10);
    }
  });
}

TEST(verify, exact_finds_one_flipped_bit) {
  check_property("verify_flipped_bit", 400, [] {
    case_array c = *random_arrays();
    RC_PRE(c.a.numel() > 0);
    const std::int64_t i = *pt::uniform<std::int64_t>(0, c.a.numel() - 1);
    const int nbits = c.fmt ? c.fmt->bits() : static_cast<int>(8 * c.a.width());
    const int bit = *pt::uniform<int>(0, nbits - 1);
    case_array flipped = c;
    flipped.a.set_bits(i, c.a.bits(i) ^ (std::uint64_t{1} << bit));
    const bool strict = *pt::coin();
    vf::policy p = vf::exact(strict);
    p.format = c.fmt;
    const std::size_t k = *pt::uniform<std::size_t>(0, 3);
    vf::options opt;
    opt.worst = k;
    const vf::report r = vf::compare(flipped.a.view(), c.a.view(), p, std::nullopt, opt);
    check_invariants(r, k);
    const bool both_nan = is_nan_element(c, i) && is_nan_element(flipped, i);
    if (both_nan && !strict) {
      RC_ASSERT(r.ok());
      return;
    }
    RC_ASSERT(r.failed == 1);
    RC_ASSERT(r.nan_mismatches == (is_nan_element(c, i) || is_nan_element(flipped, i) ? 1 : 0));
    if (k == 0)
      return;
    RC_ASSERT(r.worst.size() == 1u);
    const vf::element& e = r.worst[0];
    const int digits = c.fmt ? (c.fmt->bits() + 3) / 4 : static_cast<int>(2 * c.a.width());
    RC_ASSERT(e.failed);
    RC_ASSERT(e.flat_index == i);
    RC_ASSERT(e.index == unravel(i, c.a.shape));
    RC_ASSERT(e.candidate_hex == hex_of(flipped.a.bits(i), digits));
    RC_ASSERT(e.reference_hex == hex_of(c.a.bits(i), digits));
  });
}

TEST(verify, strided_views_report_logical_indices) {
  // A 3x5 matrix and the transposed view of its 5x3 transpose: same logical elements.
  std::vector<float> m(15), mt(15);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      m[static_cast<std::size_t>(5 * i + j)] = mt[static_cast<std::size_t>(3 * j + i)] =
          0.5f * static_cast<float>(5 * i + j);
  mt[3 * 4 + 2] = 100.0f; // logical element [2, 4] of the candidate
  kn::tensor_view cand = kn::tensor_view::contiguous(mt.data(), dtype::float32, {3, 5});
  cand.strides = {1, 3};
  const vf::report r = vf::compare(cand, vf::view(m, {3, 5}), vf::exact());
  ASSERT_EQ(r.failed, 1);
  ASSERT_EQ(r.worst.size(), 1u);
  EXPECT_EQ(r.worst[0].index, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(r.worst[0].flat_index, 14);
  EXPECT_EQ(r.worst[0].candidate, 100.0);
  EXPECT_EQ(r.worst[0].reference, 7.0);
  EXPECT_EQ(r.worst[0].candidate_hex, "0x42C80000");
  EXPECT_EQ(r.worst[0].reference_hex, "0x40E00000");
}

// ---- ulp distances against an enumeration of the grid -----------------------------------------

// Index of a non-NaN code on the ascending list of f's distinct finite values; +-Inf one step
// beyond the ends. Computed from the reference's enumeration only.
std::int64_t grid_index(const emu::format& f, std::uint32_t code) {
  const auto& values = ref::finite_values(f);
  const auto n = static_cast<std::int64_t>(values.size());
  if (ref::is_inf(f, code))
    return ref::sign_of(f, code) ? -1 : n;
  const ref::rational v = ref::value_of(f, code); // signed
  const auto it =
      std::lower_bound(values.begin(), values.end(), v,
                       [](const auto& a, const ref::rational& b) { return a.first < b; });
  if (it == values.end() || it->first != v)
    throw std::logic_error("value not in the enumeration");
  return it - values.begin();
}

rc::Gen<std::uint32_t> non_nan_code(const emu::format& f) {
  return rc::gen::suchThat(pt::any_code(f), [f](std::uint32_t c) { return !ref::is_nan(f, c); });
}

TEST(verify, ulp_distance_counts_grid_steps) {
  check_property("verify_ulp_steps", 1500, [] {
    static const auto formats = pt::test::formats_up_to(16);
    const auto nf = *rc::gen::elementOf(formats);
    const emu::format f = nf.fmt;
    const std::uint32_t a = *non_nan_code(f), b = *non_nan_code(f);
    RC_LOG() << nf.name << "\n";
    const auto expected = static_cast<double>(std::llabs(grid_index(f, a) - grid_index(f, b)));
    array ca = make_array(f.bits() <= 8 ? dtype::uint8 : dtype::uint16, {1});
    array cb = ca;
    ca.set_bits(0, a);
    cb.set_bits(0, b);
    const vf::report r = vf::compare(ca.view(), cb.view(), vf::ulp(expected, f));
    RC_ASSERT(r.max_ulp_error == expected);
    // The same values as doubles take the other road: positions located from the values.
    const array da = from_values(std::vector<double>{emu::decode<double>(f, a)});
    const array db = from_values(std::vector<double>{emu::decode<double>(f, b)});
    RC_ASSERT(vf::compare(da.view(), db.view(), vf::ulp(expected, f)).max_ulp_error == expected);
    RC_ASSERT(r.ok());
    if (expected > 0) {
      const vf::report tight = vf::compare(ca.view(), cb.view(), vf::ulp(expected - 0.5, f));
      RC_ASSERT(tight.failed == 1);
      RC_ASSERT(tight.worst.at(0).ulp_error == expected);
    }
    check_invariants(r, 10);
  });
}

// Off the grid, a value t of the way from one grid point to the next lies t steps beyond the
// first (docs/verification.md); beyond max the top spacing continues (up to Inf where f has it).
TEST(verify, ulp_distance_interpolates_between_grid_points) {
  check_property("verify_ulp_between", 1000, [] {
    static const auto formats = pt::test::formats_up_to(16);
    const auto nf = *rc::gen::elementOf(formats);
    const emu::format f = nf.fmt;
    RC_LOG() << nf.name << "\n";
    const auto& values = ref::finite_values(f);
    const auto n = static_cast<std::int64_t>(values.size());
    const std::int64_t i = *pt::uniform<std::int64_t>(0, n - 2);
    const int t_num = *pt::uniform<int>(0, 255);
    const double t = t_num / 256.0;
    const double lo = static_cast<double>(values[static_cast<std::size_t>(i)].first);
    const double hi = static_cast<double>(values[static_cast<std::size_t>(i + 1)].first);
    const double x = lo + t * (hi - lo);
    RC_PRE(ref::exact(x) ==
           values[static_cast<std::size_t>(i)].first +
               ref::rational(t_num, 256) * (values[static_cast<std::size_t>(i + 1)].first -
                                            values[static_cast<std::size_t>(i)].first));
    // Against a random code of the format: the distance is |i + t - index(code)|.
    const std::uint32_t code = *non_nan_code(f);
    const double expected = std::fabs(static_cast<double>(i - grid_index(f, code)) + t);
    array cand = make_array(f.bits() <= 8 ? dtype::uint8 : dtype::uint16, {1});
    cand.set_bits(0, code);
    const array refv = from_values(std::vector<double>{x});
    const vf::report r = vf::compare(cand.view(), refv.view(), vf::ulp(1e9, f));
    RC_ASSERT(r.max_ulp_error == expected);

    // Beyond max: max + s * 2^(emax - M) is s steps beyond max (Inf's position with Inf).
    const double q = std::ldexp(1.0, f.emax() - f.man_bits);
    const double max = static_cast<double>(values.back().first);
    const double s = *pt::uniform<int>(0, 64) / 16.0;
    const double beyond = max + s * q;
    const double steps = f.has_inf() ? std::min(s, 1.0) : s;
    const array b = from_values(std::vector<double>{beyond});
    const array m = from_values(std::vector<double>{max});
    const vf::report rb = vf::compare(b.view(), m.view(), vf::ulp(1e9, f));
    RC_ASSERT(rb.max_ulp_error == steps);
  });
}

TEST(verify, ulp_on_float_grids_by_hand) {
  // float32: 1 and the next float are one step apart; +-0 are one point; the largest float
  // and Inf are one step apart; -min_subnormal and +min_subnormal two.
  const float one_up = std::nextafter(1.0f, 2.0f);
  const float fmax = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  const float den = std::numeric_limits<float>::denorm_min();
  auto c = std::vector<float>{1.0f, -0.0f, fmax, -den};
  auto r = std::vector<float>{one_up, 0.0f, inf, den};
  const vf::report rep = vf::compare(vf::view(c), vf::view(r), vf::ulp(2));
  EXPECT_EQ(rep.grid, "float32");
  EXPECT_TRUE(rep.ok()) << rep;
  EXPECT_EQ(rep.max_ulp_error, 2.0);
  // float64, through its bits; a double half way between two floats is half a float32 step.
  auto cd = std::vector<double>{1.0, 0.0};
  auto rd = std::vector<double>{std::nextafter(1.0, 2.0), -0.0};
  EXPECT_EQ(vf::compare(vf::view(cd), vf::view(rd), vf::ulp(1)).max_ulp_error, 1.0);
  auto half = std::vector<double>{1.0 + 0x1p-24};
  auto cf = std::vector<float>{1.0f};
  const vf::report mixed = vf::compare(vf::view(cf), vf::view(half), vf::ulp(0.5));
  EXPECT_EQ(mixed.grid, "float32");
  EXPECT_EQ(mixed.max_ulp_error, 0.5);
  EXPECT_TRUE(mixed.ok());
  // Integers: the grid of the integers.
  auto ci = std::vector<std::int32_t>{-3, 7}, ri = std::vector<std::int32_t>{2, 7};
  const vf::report ints = vf::compare(vf::view(ci), vf::view(ri), vf::ulp(4));
  EXPECT_EQ(ints.grid, "integers");
  EXPECT_EQ(ints.max_ulp_error, 5.0);
  EXPECT_EQ(ints.failed, 1);
}

// ---- tolerance and bound boundaries -----------------------------------------------------------

TEST(verify, tolerance_and_bound_switch_at_the_boundary) {
  check_property("verify_tolerance_boundary", 500, [] {
    // Dyadic values with a short span: atol + rtol |r| and r +- that are exact in double.
    const double r = *pt::uniform<int>(-1000, 1000) / 16.0;
    const double atol = *rc::gen::element(0.0, std::ldexp(1.0, *pt::uniform<int>(-10, 2)));
    const double rtol = *rc::gen::element(0.0, std::ldexp(1.0, *pt::uniform<int>(-10, 0)));
    const double allowed = atol + rtol * std::fabs(r);
    // The next differences beyond the boundary that r + d represents exactly (the policy takes
    // |c - r| in double, so a smaller step would round back onto the boundary).
    const double step = std::ldexp(1.0, std::ilogb(std::max(std::fabs(r) + allowed, 1.0)) - 52 + 1);
    const std::vector<double> cand = {r + allowed, r - allowed, r + (allowed + step),
                                      r - (allowed + step), r};
    const std::vector<double> refs(cand.size(), r);
    const auto fn = [&](const vf::bound_args& a) {
      RC_ASSERT(a.reference == r);
      RC_ASSERT(a.index.size() == 1u);
      RC_ASSERT(a.index[0] == a.flat_index);
      return allowed;
    };
    for (const vf::policy& p : {vf::tolerance(atol, rtol), vf::bound(fn, "fn")}) {
      const vf::report rep = vf::compare(vf::view(cand), vf::view(refs), p);
      check_invariants(rep, 10);
      RC_ASSERT(rep.failed == 2);
      std::vector<std::int64_t> failing;
      for (const auto& e : rep.worst) {
        if (!e.failed)
          continue;
        failing.push_back(e.flat_index);
        RC_ASSERT(e.allowed == allowed);
        RC_ASSERT(e.abs_error > allowed);
      }
      std::sort(failing.begin(), failing.end());
      RC_ASSERT(failing == (std::vector<std::int64_t>{2, 3}));
    }
  });
}

TEST(verify, infinities_pass_only_when_equal_and_nans_are_counted) {
  const double inf = HUGE_VAL, qnan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> c = {inf, 1.0, qnan, qnan, -inf, 2.0};
  const std::vector<double> r = {inf, inf, qnan, 1.0, -inf, 2.0};
  const vf::report rep = vf::compare(vf::view(c), vf::view(r), vf::tolerance(1, 1));
  EXPECT_EQ(rep.total, 6);
  EXPECT_EQ(rep.checked, 4);
  EXPECT_EQ(rep.nan_matches, 1);
  EXPECT_EQ(rep.nan_mismatches, 1);
  EXPECT_EQ(rep.failed, 2);
  ASSERT_EQ(rep.worst.size(), 2u);
  EXPECT_TRUE(rep.worst[0].nan_mismatch); // NaN mismatches are the worst
  EXPECT_EQ(rep.worst[0].flat_index, 3);
  EXPECT_EQ(rep.worst[1].flat_index, 1);
  EXPECT_EQ(rep.max_abs_error, inf);
  // exact:strict tells NaN payloads apart; exact does not.
  const std::uint16_t a = 0x7E01, b = 0x7E02; // float16 NaNs
  const auto va = kn::tensor_view::contiguous(&a, dtype::float16, {1});
  const auto vb = kn::tensor_view::contiguous(&b, dtype::float16, {1});
  EXPECT_TRUE(vf::compare(va, vb, vf::exact()).ok());
  const vf::report strict = vf::compare(va, vb, vf::exact(true));
  EXPECT_EQ(strict.nan_mismatches, 1);
  EXPECT_EQ(strict.worst.at(0).candidate_hex, "0x7E01");
  // +0 and -0: one grid point, but not the same bits.
  const std::vector<float> pz = {0.0f}, nz = {-0.0f};
  const vf::report zeros = vf::compare(vf::view(pz), vf::view(nz), vf::exact());
  EXPECT_EQ(zeros.failed, 1);
  EXPECT_EQ(zeros.max_ulp_error, 0.0);
  EXPECT_TRUE(vf::compare(vf::view(pz), vf::view(nz), vf::ulp(0)).ok());
}

// ---- the report ------------------------------------------------------------------------------

TEST(verify, report_text_and_json) {
  const std::vector<std::uint8_t> cand = {0x38, 0x40, 0x7F, 0x44, 0x46}; // e4m3fn codes
  const std::vector<std::uint8_t> refc = {0x38, 0x41, 0x7F, 0x44, 0x44};
  const std::vector<float> in = {1.0f, 2.1f, NAN, 3.0f, 3.3f};
  vf::options opt;
  opt.worst = 5;
  const vf::report r = vf::compare(vf::view(cand), vf::view(refc), vf::parse_policy("ulp:1@e4m3fn"),
                                   vf::view(in), opt);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.checked, 4);
  EXPECT_EQ(r.nan_matches, 1);
  ASSERT_EQ(r.worst.size(), 2u);
  EXPECT_EQ(r.worst[0].index, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(r.worst[0].ulp_error, 2.0);
  EXPECT_EQ(r.worst[0].candidate, 3.5);
  EXPECT_EQ(r.worst[0].reference, 3.0);
  EXPECT_EQ(r.worst[0].input_hex, "0x40533333");
  EXPECT_FALSE(r.worst[1].failed); // within the policy, but not equal
  std::ostringstream os;
  os << r;
  const std::string text = os.str();
  EXPECT_EQ(text, r.to_string());
  for (const char* s : {"verify FAILED: 1 of 5 elements outside ulp:1@e4m3fn",
                        "candidate uint8 (5,), reference uint8, inputs float32; ulp grid e4m3fn",
                        "checked 4, NaN matched 1, NaN mismatches 0",
                        "[4]    3.3 (0x40533333)  3.5 (0x46)  3 (0x44)", "FAIL",
                        "ulp errors: 0: 2 | (0, 1]: 1 | (1, 2]: 1"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\nin:\n" << text;
  const std::string json = r.to_json();
  for (const char* s : {"\"ok\": false", "\"policy\": \"ulp:1@e4m3fn\"", "\"failed\": 1",
                        "\"candidate_hex\": \"0x46\"", "\"index\": [4]",
                        "{\"label\": \"(1, 2]\", \"lo\": 1, \"hi\": 2, \"count\": 1}"})
    EXPECT_NE(json.find(s), std::string::npos) << s << "\nin:\n" << json;
}

TEST(verify, histogram_buckets) {
  // Distances 0, 0.5, 1, 2, 3, 4, 5, 8, 9 on the integers.
  const std::vector<double> c = {0, 0.5, 1, 2, 3, 4, 5, 8, 9};
  vf::policy p = vf::ulp(100);
  const std::vector<std::int32_t> zero(c.size(), 0);
  const vf::report rep = vf::compare(vf::view(c), vf::view(zero), vf::tolerance(100));
  EXPECT_EQ(rep.grid, "float64"); // the candidate's grid: distances in float64 steps
  const vf::report ints = vf::compare(vf::view(zero), vf::view(c), p);
  EXPECT_EQ(ints.grid, "integers");
  std::vector<std::pair<std::string, std::int64_t>> got;
  for (const auto& b : ints.histogram)
    got.emplace_back(b.label, b.count);
  const std::vector<std::pair<std::string, std::int64_t>> want = {
      {"0", 1}, {"(0, 1]", 2}, {"(1, 2]", 1}, {"(2, 4]", 2}, {"(4, 8]", 2}, {"(8, 16]", 1}};
  EXPECT_EQ(got, want);
}

// ---- policies and errors ---------------------------------------------------------------------

template <class Fn> void expect_error(Fn fn, lowbit::errc code, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no lowbit::error; expected one containing: " << part;
  } catch (const lowbit::error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(verify, policy_text_round_trips) {
  for (const char* s :
       {"exact", "exact:strict", "ulp:1", "ulp:0.5@float32", "ulp:2@e4m3fn", "atol:0.001",
        "rtol:0.01", "atol:0.001,rtol:0.01", "exact@e2m1fn", "atol:1e-05,rtol:1e-05@e5m2"})
    EXPECT_EQ(vf::to_string(vf::parse_policy(s)), s);
  EXPECT_EQ(vf::to_string(vf::parse_policy(" ulp : 3 ", emu::e5m2)), "ulp:3@e5m2");
  EXPECT_EQ(vf::to_string(vf::parse_policy("rtol:0.5,atol:2")), "atol:2,rtol:0.5");
  EXPECT_EQ(vf::to_string(vf::bound([](const vf::bound_args&) { return 1.0; }, "mine")),
            "bound:mine");
  const vf::policy p = vf::parse_policy("ulp:2", emu::e4m3fn);
  EXPECT_EQ(p.kind, vf::policy_kind::ulp);
  EXPECT_EQ(p.max_ulp, 2.0);
  EXPECT_TRUE(p.format && *p.format == emu::e4m3fn);
}

TEST(verify, bad_policies_throw) {
  using lowbit::errc;
  const auto parse = [](const char* s) { return [s] { vf::parse_policy(s); }; };
  expect_error(parse("close"), errc::invalid_argument, "policy 'close': unknown policy 'close'");
  expect_error(parse(""), errc::invalid_argument, "empty policy");
  expect_error(parse("ulp"), errc::invalid_argument, "ulp needs a value");
  expect_error(parse("ulp:x"), errc::invalid_argument, "ulp: 'x' is not a number");
  expect_error(parse("ulp:-1"), errc::invalid_argument, "must be >= 0, got -1");
  expect_error(parse("atol:nan"), errc::invalid_argument, "tolerance: atol is NaN");
  expect_error(parse("atol:-1e-3"), errc::invalid_argument, "atol must be >= 0");
  expect_error(parse("atol:1,atol:2"), errc::invalid_argument, "atol given twice");
  expect_error(parse("atol:1,ulp:2"), errc::invalid_argument, "'ulp' cannot follow a tolerance");
  expect_error(parse("exact,ulp:1"), errc::invalid_argument, "exact cannot be combined");
  expect_error(parse("exact:loose"), errc::invalid_argument, "exact takes no value but 'strict'");
  expect_error(parse("ulp:1@e4m3fx"), errc::invalid_argument, "format 'e4m3fx'");
  expect_error(parse("bound"), errc::invalid_argument, "a bound policy takes a function");
  expect_error([] { vf::parse_policy("ulp:1@e5m2", emu::e4m3fn); }, errc::invalid_argument,
               "names format e5m2 but the format argument is e4m3fn");
  expect_error([] { vf::tolerance(std::nan(""), 0); }, errc::invalid_argument, "atol is NaN");
  expect_error([] { vf::ulp(-0.5); }, errc::invalid_argument, "must be >= 0");
  expect_error([] { vf::bound(nullptr); }, errc::invalid_argument, "no bound function");
}

TEST(verify, bad_arrays_throw) {
  using lowbit::errc;
  std::vector<float> f3(3), f4(4);
  std::vector<double> d3(3);
  std::vector<std::uint8_t> u3 = {0, 1, 0x1F};
  std::vector<std::uint16_t> w3(3);
  std::vector<std::int64_t> l3(3);
  expect_error([&] { vf::compare(vf::view(f3), vf::view(f4), vf::exact()); },
               errc::invalid_argument, "candidate has shape (3,) but reference has shape (4,)");
  expect_error([&] { vf::compare(vf::view(f3), vf::view(d3), vf::exact()); }, errc::invalid_type,
               "exact compares bit patterns, so candidate (float32) and reference (float64)");
  EXPECT_TRUE(vf::compare(vf::view(f3), vf::view(d3), vf::ulp(0)).ok());
  expect_error([&] { vf::compare(vf::view(u3), vf::view(u3), vf::exact()); },
               errc::invalid_argument, "candidate: dtype uint8 holds codes of a number format");
  expect_error([&] { vf::compare(vf::view(w3), vf::view(w3), vf::ulp(1, emu::e4m3fn)); },
               errc::invalid_type, "dtype uint16 does not hold codes of e4m3fn; expected uint8");
  expect_error([&] { vf::compare(vf::view(u3), vf::view(u3), vf::ulp(1, emu::e2m1fn)); },
               errc::invalid_argument, "candidate[2] = 0x1F is not a code of e2m1fn (4 bits)");
  expect_error([&] { vf::compare(vf::view(l3), vf::view(l3), vf::exact()); }, errc::invalid_type,
               "dtype int64 is not supported");
  expect_error([&] { vf::compare(vf::view(f3), vf::view(f3), vf::exact(), vf::view(f4)); },
               errc::invalid_argument, "inputs has shape (4,)");
  kn::tensor_view gpu = vf::view(f3);
  gpu.dev = {kn::device_type::cuda, 0};
  expect_error([&] { vf::compare(gpu, vf::view(f3), vf::exact()); }, errc::invalid_argument,
               "candidate is on cuda:0, but lowbit::verify compares host memory");
  expect_error(
      [&] {
        vf::compare(vf::view(f3, {3}), vf::view(f3), vf::bound([](const vf::bound_args& a) {
                      return a.flat_index == 1 ? std::nan("") : 0.0;
                    }));
      },
      errc::invalid_argument, "the bound function returned nan at index [1]");
  expect_error(
      [&] {
        vf::view(f3, {2, 2});
      },
      errc::invalid_argument, "shape (2, 2) holds 4 elements but the container has 3");
}

TEST(verify, empty_and_scalar_arrays) {
  std::vector<float> none;
  const vf::report e = vf::compare(vf::view(none, {0, 3}), vf::view(none, {0, 3}), vf::exact());
  EXPECT_TRUE(e.ok());
  EXPECT_EQ(e.total, 0);
  EXPECT_TRUE(e.histogram.empty());
  const float a = 1.0f, b = 2.0f;
  const vf::report s =
      vf::compare(kn::tensor_view::contiguous(&a, dtype::float32, {}),
                  kn::tensor_view::contiguous(&b, dtype::float32, {}), vf::tolerance(0.5));
  EXPECT_EQ(s.failed, 1);
  EXPECT_TRUE(s.worst.at(0).index.empty());
  EXPECT_NE(s.to_string().find("candidate float32 ()"), std::string::npos) << s;
}

} // namespace
