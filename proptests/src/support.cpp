#include "support.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>

#include <lowbit/reference/round.hpp>

namespace lowbit::proptest::test {

using emu::format;
using emu::specials;

const std::vector<named_format>& all_formats() {
  static const std::vector<named_format> formats = [] {
    std::vector<named_format> v;
    for (const auto& n : emu::named_formats)
      v.push_back({n.name, n.fmt});
    const format user[] = {
        {5, 3, 10, specials::ieee},
        {6, 1, 31, specials::fnuz},
        {4, 4, 7, specials::fn, /*is_signed=*/false},
        {3, 0, 3, specials::none},                      // no mantissa bits, with zero
        {5, 0, 15, specials::fn},                       // no mantissa bits, NaN at all ones
        {4, 0, 7, specials::none, /*is_signed=*/false}, // no mantissa bits, unsigned
        {3, 2, 3, specials::none, /*is_signed=*/false},
        {1, 2, 0, specials::none}, // one exponent bit
        {2, 1, 1, specials::ieee},
        {4, 3, 7, specials::fn, /*is_signed=*/true, /*has_zero=*/false},
        {3, 3, 3, specials::none, /*is_signed=*/false, /*has_zero=*/false},
        {8, 6, -700, specials::ieee}, // every float is below its smallest subnormal
        {8, 6, 900, specials::ieee},  // every nonzero float overflows it
        {5, 10, 15, specials::fnuz},
        {7, 8, 63, specials::fn},
        // Very low biases: MX element formats in a block whose scale shifts them by 2^105 and
        // more (the nearest-even short path's magic number 2^(emin - man + 23) stops being a
        // float there), and the last bias below that.
        {2, 1, -104, specials::none},
        {2, 1, -105, specials::none},
        {3, 2, -106, specials::none},
    };
    for (const format& f : user) {
      if (const char* why = emu::check_format(f))
        throw std::logic_error("test format " + emu::format_name(f) + ": " + why);
      v.push_back({emu::format_name(f), f});
    }
    return v;
  }();
  return formats;
}

std::vector<named_format> formats_up_to(int bits) {
  std::vector<named_format> r;
  for (const auto& f : all_formats())
    if (f.fmt.bits() <= bits)
      r.push_back(f);
  return r;
}

std::string test_name(const named_format& f) {
  std::string s = f.name;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)))
      c = '_';
  return s;
}

namespace {
constexpr emu::rounding deterministic_roundings[] = {
    emu::rounding::nearest_even, emu::rounding::nearest_away, emu::rounding::toward_zero,
    emu::rounding::up,           emu::rounding::down,         emu::rounding::odd};
}

std::vector<emu::policy> deterministic_policies() {
  std::vector<emu::policy> v;
  for (auto r : deterministic_roundings)
    for (auto o : {emu::overflow::saturate, emu::overflow::nonsaturating})
      for (auto s : {emu::subnormals::keep, emu::subnormals::flush})
        for (auto n : {emu::nan_sign::preserve, emu::nan_sign::positive})
          v.push_back(emu::policy{r, o, s, n, 0});
  return v;
}

std::vector<emu::policy> rounding_overflow_policies() {
  std::vector<emu::policy> v;
  for (auto r : deterministic_roundings)
    for (auto o : {emu::overflow::saturate, emu::overflow::nonsaturating})
      v.push_back(emu::policy{r, o, emu::subnormals::keep, emu::nan_sign::preserve, 0});
  return v;
}

std::vector<emu::policy> stochastic_policies(int k) {
  std::vector<emu::policy> v;
  for (auto o : {emu::overflow::saturate, emu::overflow::nonsaturating})
    for (auto s : {emu::subnormals::keep, emu::subnormals::flush})
      for (auto n : {emu::nan_sign::preserve, emu::nan_sign::positive})
        v.push_back(emu::policy{emu::rounding::stochastic, o, s, n, k});
  return v;
}

std::string describe(const emu::policy& p) {
  std::string s = std::string("{") + emu::rounding_name(p.round);
  if (p.round == emu::rounding::stochastic)
    s += " k=" + std::to_string(p.random_bits);
  s += std::string(", ") + emu::overflow_name(p.over);
  s += p.sub == emu::subnormals::keep ? ", keep" : ", flush";
  s += p.nan == emu::nan_sign::preserve ? ", nan preserve}" : ", nan positive}";
  return s;
}

std::string hex_code(std::uint32_t code) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%X", code);
  return buf;
}

std::string describe_input(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  char buf[96];
  std::snprintf(buf, sizeof buf, "double %a (bits 0x%016llX)", x,
                static_cast<unsigned long long>(b));
  return buf;
}

std::string describe_input(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  char buf[96];
  std::snprintf(buf, sizeof buf, "float %a (bits 0x%08X)", static_cast<double>(x), b);
  return buf;
}

void check_property(const std::string& id, int cases, std::function<void()> property) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  const char* rc_params = std::getenv("RC_PARAMS");
  if (rc_params == nullptr || std::strstr(rc_params, "seed") == nullptr) {
    std::uint64_t h = 1469598103934665603u; // FNV-1a of the id: a fixed seed per property
    for (char c : id)
      h = (h ^ static_cast<unsigned char>(c)) * 1099511628211u;
    params.seed = h;
  }
  double scale = 1.0;
  if (const char* s = std::getenv("LOWBIT_PROPTEST_SCALE"))
    scale = std::max(0.01, std::atof(s));
  params.maxSuccess = std::max(1, static_cast<int>(cases * scale));
  rc::detail::TestMetadata metadata;
  metadata.id = id;
  metadata.description = id;
  const rc::detail::TestResult result = rc::detail::checkTestable(property, metadata, params);
  if (!result.template is<rc::detail::SuccessResult>()) {
    std::ostringstream os;
    rc::detail::printResultMessage(result, os);
    ADD_FAILURE() << id << " (rapidcheck seed " << params.seed << ")\n" << os.str();
  }
}

// ---- breakpoint tables -------------------------------------------------------------------------

namespace {

using reference::rational;

double exact_double(const rational& r) {
  const double d = r.convert_to<double>();
  if (!std::isfinite(d) || reference::exact(d) != r)
    throw std::logic_error("breakpoint is not exactly a double");
  return d;
}

} // namespace

breakpoint_table make_breakpoint_table(const format& f, const emu::policy& p) {
  breakpoint_table t;
  t.fmt = f;
  t.pol = p;
  std::vector<rational> grid;
  for (const auto& [v, code] : reference::finite_values(f))
    if (v >= 0)
      grid.push_back(v);
  grid.push_back(reference::grid_above_max(f));
  std::vector<rational> points;
  if (grid.front() != 0)
    points.push_back(rational(0)); // formats without zero
  for (std::size_t i = 0; i < grid.size(); ++i) {
    if (i > 0)
      points.push_back((grid[i - 1] + grid[i]) / 2);
    points.push_back(grid[i]);
  }
  for (int s = 0; s < 2; ++s) {
    const bool negative = s == 1;
    const auto ref = [&](const rational& a) {
      return reference::round(f, negative ? rational(-a) : a, negative, p);
    };
    for (std::size_t j = 0; j < points.size(); ++j) {
      t.at[s].push_back(ref(points[j]));
      t.between[s].push_back(j == 0 ? t.at[s][0] : ref((points[j - 1] + points[j]) / 2));
    }
    t.between[s].push_back(ref(points.back() * 2));
    const double sign = negative ? -1.0 : 1.0;
    t.infinity[s] = reference::round(f, sign * HUGE_VAL, p);
    t.nan[s] = reference::round(f, std::copysign(std::nan(""), sign), p);
  }
  for (const rational& r : points)
    t.points.push_back(exact_double(r));
  return t;
}

std::uint32_t breakpoint_table::expected(double x) const {
  const int s = std::signbit(x) ? 1 : 0;
  if (std::isnan(x))
    return nan[s];
  if (std::isinf(x))
    return infinity[s];
  const double a = std::fabs(x);
  const auto j =
      static_cast<std::size_t>(std::lower_bound(points.begin(), points.end(), a) - points.begin());
  return (j < points.size() && points[j] == a) ? at[s][j] : between[s][j];
}

void on_threads(int threads, const std::function<void(int)>& fn) {
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        fn(t);
      } catch (...) {
        errors[static_cast<std::size_t>(t)] = std::current_exception();
      }
    });
  for (auto& th : pool)
    th.join();
  for (auto& e : errors)
    if (e)
      std::rethrow_exception(e);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace lowbit::proptest::test

namespace lowbit::emu {
void showValue(const policy& p, std::ostream& os) {
  os << proptest::test::describe(p);
}
void showValue(overflow o, std::ostream& os) {
  os << overflow_name(o);
}
void showValue(const format& f, std::ostream& os) {
  os << format_name(f);
}
} // namespace lowbit::emu
