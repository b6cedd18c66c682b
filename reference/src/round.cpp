// The exact reference: values from the code definition, rounding by locating a magnitude between
// enumerated grid points with exact rational comparisons. Each step below names the rule of
// docs/rounding.md it implements; nothing here looks at the bits of a double or reuses emu's
// converter.
#include <lowbit/reference/round.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/names.hpp>

namespace lowbit::reference {

namespace {

using emu::format;
using emu::specials;

std::string hex(std::uint32_t code) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%X", code);
  return buf;
}

void require_format(const format& f, const char* fn) {
  if (const char* why = emu::check_format(f))
    throw error(errc::invalid_argument, std::string("reference::") + fn + ": format: " + why);
}

void require_policy(const emu::policy& p, const char* fn) {
  if (const char* why = emu::check_policy(p))
    throw error(errc::invalid_argument, std::string("reference::") + fn + ": policy: " + why);
}

// 2^k exactly.
rational pow2(int k) {
  if (k >= 0)
    return rational(integer(1) << k);
  return rational(integer(1), integer(1) << -k);
}

// The E with 2^E <= v < 2^(E+1), for v > 0.
int floor_log2(const rational& v) {
  const integer n = boost::multiprecision::numerator(v);
  const integer d = boost::multiprecision::denominator(v);
  int e = static_cast<int>(boost::multiprecision::msb(n)) -
          static_cast<int>(boost::multiprecision::msb(d));
  // n/d lies in [2^(e-1), 2^(e+1)); one exact comparison decides which half.
  if (v < pow2(e))
    --e;
  return e;
}

// ---- the definition of a code (docs/rounding.md, "Formats") ---------------------------------

struct fields {
  bool sign;
  std::uint32_t exponent;
  std::uint32_t mantissa;
};

int code_bits(const format& f) {
  return (f.is_signed ? 1 : 0) + f.exp_bits + f.man_bits;
}
std::uint32_t exp_all_ones(const format& f) {
  return (1u << f.exp_bits) - 1u;
}
std::uint32_t man_all_ones(const format& f) {
  return (1u << f.man_bits) - 1u;
}
std::uint32_t sign_bit(const format& f) {
  return f.is_signed ? static_cast<std::uint32_t>(std::uint64_t{1} << (f.exp_bits + f.man_bits))
                     : 0u;
}
// Exponent of the lowest binade with an implicit one: field 1 when field 0 holds the subnormals,
// field 0 otherwise.
int emin(const format& f) {
  return f.has_zero ? 1 - f.bias : -f.bias;
}

fields split(const format& f, std::uint32_t code, const char* fn) {
  if (static_cast<std::uint64_t>(code) >> code_bits(f) != 0)
    throw error(errc::invalid_argument, std::string("reference::") + fn + ": code " + hex(code) +
                                            " has more than the " + std::to_string(code_bits(f)) +
                                            " bits of " + emu::format_name(f));
  fields r;
  r.mantissa = code & man_all_ones(f);
  r.exponent = (code >> f.man_bits) & exp_all_ones(f);
  r.sign = f.is_signed && ((code >> (f.exp_bits + f.man_bits)) & 1u) != 0;
  return r;
}

bool nan_by_definition(const format& f, const fields& c) {
  switch (f.special) {
  case specials::ieee: return c.exponent == exp_all_ones(f) && c.mantissa != 0;
  case specials::fn: return c.exponent == exp_all_ones(f) && c.mantissa == man_all_ones(f);
  case specials::fnuz: return c.sign && c.exponent == 0 && c.mantissa == 0;
  case specials::none: return false;
  }
  return false;
}

bool inf_by_definition(const format& f, const fields& c) {
  return f.special == specials::ieee && c.exponent == exp_all_ones(f) && c.mantissa == 0;
}

rational magnitude_by_definition(const format& f, const fields& c) {
  if (c.exponent == 0 && f.has_zero)
    return rational(integer(c.mantissa)) * pow2(emin(f) - f.man_bits);
  const integer sig = (integer(1) << f.man_bits) + c.mantissa;
  return rational(sig) * pow2(static_cast<int>(c.exponent) - f.bias - f.man_bits);
}

// Whether grid value v >= 0 has an odd significand v / 2^(max(E_v, emin) - M).
bool odd_by_definition(const format& f, const rational& v) {
  if (v == 0)
    return false;
  const int e = std::max(floor_log2(v), emin(f));
  const rational s = v / pow2(e - f.man_bits);
  if (boost::multiprecision::denominator(s) != 1)
    throw std::logic_error("reference: significand of a value that is not on the grid");
  return boost::multiprecision::bit_test(boost::multiprecision::numerator(s), 0);
}

// ---- the grid of one format ------------------------------------------------------------------

struct point {
  rational value;
  std::uint32_t code; // magnitude code (sign bit clear); unused for the point above max
  bool odd;
  bool above_max;
};

// Formats up to this many bits keep their values in memory; wider ones (float32) are searched
// lazily through the codes.
constexpr int materialize_bits = 16;

class grid {
public:
  explicit grid(const format& f) : f_(f) {
    // Largest finite magnitude code: NaN and Inf codes sit at the top of the magnitude range.
    top_ = static_cast<std::uint32_t>((std::uint64_t{1} << (f.exp_bits + f.man_bits)) - 1u);
    while (!finite(top_))
      --top_;
    materialized_ = code_bits(f) <= materialize_bits;
    if (materialized_) {
      for (std::uint32_t c = 0; c <= top_; ++c) {
        if (!finite(c))
          continue;
        const rational v = magnitude_by_definition(f, split(f, c, "grid"));
        points_.push_back(point{v, c, odd_by_definition(f, v), false});
      }
      // The definition orders values by code; sort anyway if it did not (it cannot).
      const auto less = [](const point& a, const point& b) { return a.value < b.value; };
      if (!std::is_sorted(points_.begin(), points_.end(), less))
        std::sort(points_.begin(), points_.end(), less);
      for (std::size_t i = 1; i < points_.size(); ++i)
        if (!(points_[i - 1].value < points_[i].value))
          throw std::logic_error("reference: two nonnegative codes with one value in " +
                                 emu::format_name(f));
    }
    max_ = value_at(size() - 1);
    above_ = max_ + pow2(floor_log2(max_) - f.man_bits);
    above_odd_ = odd_by_definition(f, above_);
    smallest_ = value_at(0);
    min_positive_ = smallest_ != 0 ? smallest_ : value_at(1);
    // The smallest value with an implicit leading one: exponent field 1 (field 0 without zero).
    min_normal_ = f.has_zero ? magnitude_by_definition(f, fields{false, 1u, 0u}) : smallest_;
  }

  const format& fmt() const { return f_; }
  const rational& max() const { return max_; }
  const rational& above() const { return above_; }
  const rational& smallest() const { return smallest_; } // 0 where there is a zero
  const rational& min_positive() const { return min_positive_; }
  const rational& min_normal() const { return min_normal_; }
  std::uint32_t max_code() const { return top_; }
  std::uint32_t smallest_code() const { return code_at(0); }

  // lo <= a <= hi, consecutive grid points, for smallest() <= a <= above().
  std::pair<point, point> locate(const rational& a) const {
    if (a < smallest_ || a > above_)
      throw std::logic_error("reference: magnitude outside the grid of " + emu::format_name(f_));
    if (a >= max_) {
      const point top = point_at(size() - 1);
      const point up{above_, 0u, above_odd_, true};
      if (a == max_)
        return {top, top};
      if (a == above_)
        return {up, up};
      return {top, up};
    }
    // Largest i with value(i) <= a, by bisection over the ascending values.
    std::size_t lo = 0, hi = size() - 1; // value(lo) <= a < value(hi)
    while (hi - lo > 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      (value_at(mid) <= a ? lo : hi) = mid;
    }
    const point l = point_at(lo);
    if (l.value == a)
      return {l, l};
    return {l, point_at(hi)};
  }

  const std::vector<std::pair<rational, std::uint32_t>>& all_finite() const {
    std::call_once(all_once_, [this] { build_all_finite(); });
    return all_;
  }

private:
  bool finite(std::uint32_t code) const {
    const fields c = split(f_, code, "grid");
    return !nan_by_definition(f_, c) && !inf_by_definition(f_, c);
  }
  std::size_t size() const { return materialized_ ? points_.size() : std::size_t{top_} + 1; }
  // Lazily, index i is magnitude code i: by the definition the value grows with the code (the
  // exponent field is the high part, a subnormal m * 2^(emin-M) stays below 2^emin).
  rational value_at(std::size_t i) const {
    if (materialized_)
      return points_[i].value;
    return magnitude_by_definition(f_, split(f_, static_cast<std::uint32_t>(i), "grid"));
  }
  std::uint32_t code_at(std::size_t i) const {
    return materialized_ ? points_[i].code : static_cast<std::uint32_t>(i);
  }
  point point_at(std::size_t i) const {
    if (materialized_)
      return points_[i];
    const rational v = value_at(i);
    return point{v, code_at(i), odd_by_definition(f_, v), false};
  }

  void build_all_finite() const {
    if (!materialized_)
      throw error(errc::invalid_argument,
                  "reference::finite_values: " + emu::format_name(f_) + " has " +
                      std::to_string(code_bits(f_)) + " bits; only formats of at most " +
                      std::to_string(materialize_bits) + " bits are enumerated");
    std::vector<std::pair<rational, std::uint32_t>> negative;
    if (f_.is_signed) {
      for (std::uint32_t mag = 0; mag <= exp_mag_all_ones(); ++mag) {
        const std::uint32_t code = mag | sign_bit(f_);
        const fields c = split(f_, code, "finite_values");
        if (nan_by_definition(f_, c) || inf_by_definition(f_, c))
          continue;
        const rational v = magnitude_by_definition(f_, c);
        if (v == 0)
          continue; // zero is listed once, with its positive code
        negative.emplace_back(-v, code);
      }
    }
    const auto less = [](const auto& a, const auto& b) { return a.first < b.first; };
    std::reverse(negative.begin(), negative.end());
    if (!std::is_sorted(negative.begin(), negative.end(), less))
      std::sort(negative.begin(), negative.end(), less);
    all_ = std::move(negative);
    for (const point& p : points_)
      all_.emplace_back(p.value, p.code);
    for (std::size_t i = 1; i < all_.size(); ++i)
      if (!(all_[i - 1].first < all_[i].first))
        throw std::logic_error("reference: finite values of " + emu::format_name(f_) +
                               " are not distinct");
  }
  std::uint32_t exp_mag_all_ones() const {
    return static_cast<std::uint32_t>((std::uint64_t{1} << (f_.exp_bits + f_.man_bits)) - 1u);
  }

  format f_;
  std::uint32_t top_ = 0;
  bool materialized_ = false;
  std::vector<point> points_; // nonnegative finite values, ascending (materialized formats)
  rational max_, above_, smallest_, min_positive_, min_normal_;
  bool above_odd_ = false;
  mutable std::once_flag all_once_;
  mutable std::vector<std::pair<rational, std::uint32_t>> all_;
};

const grid& grid_of(const format& f) {
  // One entry per thread in front of the shared map: sweeps call with the same format repeatedly.
  thread_local const grid* last = nullptr;
  if (last != nullptr && last->fmt() == f)
    return *last;
  using key = std::tuple<int, int, int, int, bool, bool>;
  static std::mutex mu;
  static std::map<key, std::unique_ptr<grid>> grids;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = grids[key{f.exp_bits, f.man_bits, f.bias, static_cast<int>(f.special), f.is_signed,
                         f.has_zero}];
  if (!slot)
    slot = std::make_unique<grid>(f);
  last = slot.get();
  return *last;
}

// ---- special results (docs/rounding.md, "encode(x), in order" and "NaN results") -------------

bool has_nan(const format& f) {
  return f.special != specials::none;
}
bool has_inf(const format& f) {
  return f.special == specials::ieee;
}
bool has_negative_zero(const format& f) {
  return f.is_signed && f.has_zero && f.special != specials::fnuz;
}

std::uint32_t nan_result(const format& f, bool negative, const emu::policy& p) {
  const std::uint32_t all_magnitude_bits =
      static_cast<std::uint32_t>((std::uint64_t{1} << (f.exp_bits + f.man_bits)) - 1u);
  switch (f.special) {
  case specials::ieee:
  case specials::fn:
    return all_magnitude_bits | (negative && p.nan == emu::nan_sign::preserve ? sign_bit(f) : 0u);
  case specials::fnuz: return sign_bit(f);
  case specials::none:
    // No NaN exists: +0. A format with neither NaN nor zero has no +0 either; code 0, its
    // smallest value, is the nearest reading of the rule.
    return 0u;
  }
  return 0u;
}

// The zero of a sign, for formats with a zero (+0 where there is no -0).
std::uint32_t signed_zero(const format& f, bool negative) {
  return negative && has_negative_zero(f) ? sign_bit(f) : 0u;
}

// Step 4: an exact zero input.
std::uint32_t zero_input(const format& f, bool negative, const emu::policy& p) {
  if (f.has_zero)
    return signed_zero(f, negative);
  if (p.over == emu::overflow::saturate || !has_nan(f))
    return grid_of(f).smallest_code();
  return nan_result(f, false, p);
}

// Step 2: a negative number into an unsigned format.
std::uint32_t negative_unsigned(const format& f, const emu::policy& p) {
  if (p.over == emu::overflow::saturate || !has_nan(f))
    return 0u;
  return nan_result(f, false, p);
}

// Step 3 (infinite input) and step 5.5 (a finite result above max).
std::uint32_t overflow_result(const format& f, bool negative, const emu::policy& p,
                              bool infinite_input) {
  using emu::rounding;
  const bool toward_zero =
      !infinite_input &&
      (p.round == rounding::toward_zero || p.round == rounding::odd ||
       (p.round == rounding::down && !negative) || (p.round == rounding::up && negative));
  const std::uint32_t sign = negative ? sign_bit(f) : 0u;
  if (p.over == emu::overflow::saturate || !has_nan(f) || toward_zero)
    return grid_of(f).max_code() | sign;
  if (has_inf(f))
    return (exp_all_ones(f) << f.man_bits) | sign;
  return nan_result(f, negative, p);
}

// Step 5.3: which of lo < a < hi the rounding picks (true: hi).
bool pick_hi(const point& lo, const point& hi, const rational& a, bool negative,
             const emu::policy& p, std::uint32_t rbits) {
  using emu::rounding;
  switch (p.round) {
  case rounding::nearest_even:
  case rounding::nearest_away: {
    const rational twice = 2 * a, sum = lo.value + hi.value;
    if (twice < sum)
      return false;
    if (twice > sum)
      return true;
    if (p.round == rounding::nearest_away)
      return true;
    if (!lo.odd && hi.odd)
      return false;
    if (lo.odd && !hi.odd)
      return true;
    if (lo.odd && hi.odd)
      return true; // only when M = 0
    throw std::logic_error("reference: two consecutive grid points with even significands");
  }
  case rounding::toward_zero: return false;
  case rounding::up: return !negative;
  case rounding::down: return negative;
  case rounding::odd:
    if (lo.odd && !hi.odd)
      return false;
    if (hi.odd && !lo.odd)
      return true;
    if (lo.odd && hi.odd)
      return false; // only when M = 0
    throw std::logic_error("reference: two consecutive grid points with even significands");
  case rounding::stochastic: {
    const int k = p.random_bits;
    const integer one_k = integer(1) << k;
    const integer r = integer(rbits) & (one_k - 1);
    const rational t = (a - lo.value) / (hi.value - lo.value);
    const rational scaled = t * rational(one_k);
    const integer floor_tk =
        boost::multiprecision::numerator(scaled) / boost::multiprecision::denominator(scaled);
    return floor_tk + r >= one_k;
  }
  }
  throw std::logic_error("reference: unknown rounding");
}

} // namespace

// ---- public API --------------------------------------------------------------------------------

bool is_nan(const format& f, std::uint32_t code) {
  require_format(f, "is_nan");
  return nan_by_definition(f, split(f, code, "is_nan"));
}

bool is_inf(const format& f, std::uint32_t code) {
  require_format(f, "is_inf");
  return inf_by_definition(f, split(f, code, "is_inf"));
}

bool sign_of(const format& f, std::uint32_t code) {
  require_format(f, "sign_of");
  return split(f, code, "sign_of").sign;
}

rational value_of(const format& f, std::uint32_t code) {
  require_format(f, "value_of");
  const fields c = split(f, code, "value_of");
  if (nan_by_definition(f, c) || inf_by_definition(f, c))
    throw error(errc::invalid_argument, "reference::value_of: code " + hex(code) + " of " +
                                            emu::format_name(f) + " is not a finite number");
  const rational m = magnitude_by_definition(f, c);
  return c.sign ? rational(-m) : m;
}

const std::vector<std::pair<rational, std::uint32_t>>& finite_values(const format& f) {
  require_format(f, "finite_values");
  return grid_of(f).all_finite();
}

rational max_value(const format& f) {
  require_format(f, "max_value");
  return grid_of(f).max();
}
rational min_positive(const format& f) {
  require_format(f, "min_positive");
  return grid_of(f).min_positive();
}
rational min_normal(const format& f) {
  require_format(f, "min_normal");
  return grid_of(f).min_normal();
}
rational grid_above_max(const format& f) {
  require_format(f, "grid_above_max");
  return grid_of(f).above();
}

bool odd_significand(const format& f, const rational& v) {
  require_format(f, "odd_significand");
  const grid& g = grid_of(f);
  const auto off_grid = [] {
    return error(errc::invalid_argument, "reference::odd_significand: value is not on the grid");
  };
  if (v < g.smallest() || v > g.above())
    throw off_grid();
  const auto [lo, hi] = g.locate(v);
  if (lo.value != v)
    throw off_grid();
  return lo.odd;
}

bracket neighbours(const format& f, const rational& a) {
  require_format(f, "neighbours");
  const grid& g = grid_of(f);
  if (a < g.smallest() || a > g.above())
    throw error(errc::invalid_argument,
                "reference::neighbours: magnitude outside [smallest value, max + ulp(max)] of " +
                    emu::format_name(f));
  const auto [lo, hi] = g.locate(a);
  return bracket{lo.value, hi.value};
}

rational exact(double x) {
  if (!std::isfinite(x))
    throw error(errc::invalid_argument, "reference::exact: x is not finite");
  if (x == 0)
    return rational(0);
  int e = 0;
  const double m = std::frexp(x, &e); // x = m * 2^e, 0.5 <= |m| < 1, m has at most 53 bits
  const auto n = static_cast<long long>(std::ldexp(m, 53));
  return rational(integer(n)) * pow2(e - 53);
}

std::uint32_t round(const format& f, const rational& x, bool negative, const emu::policy& p,
                    std::uint32_t rbits) {
  require_format(f, "round");
  require_policy(p, "round");
  // Step 4: an exact zero.
  if (x == 0)
    return zero_input(f, negative, p);
  // Step 2: a negative number into an unsigned format.
  const bool neg = x < 0;
  if (neg && !f.is_signed)
    return negative_unsigned(f, p);
  const grid& g = grid_of(f);
  const rational a = neg ? rational(-x) : x;
  // Step 5.1: below the smallest value of a format without zero.
  if (!f.has_zero && a < g.smallest())
    return g.smallest_code();
  // Step 5.2: flush, tininess detected before rounding.
  if (p.sub == emu::subnormals::flush && a < g.min_normal())
    return signed_zero(f, neg);
  // Beyond the grid point above max every rounding gives a magnitude above max, so the overflow
  // rule decides directly.
  if (a > g.above())
    return overflow_result(f, neg, p, false);
  // Step 5.3: the neighbours and the rounding's choice between them.
  const auto [lo, hi] = g.locate(a);
  const point& result = (lo.value == hi.value || !pick_hi(lo, hi, a, neg, p, rbits)) ? lo : hi;
  // Step 5.4: a zero result; step 5.5: overflow.
  if (result.value == 0)
    return signed_zero(f, neg);
  if (result.above_max)
    return overflow_result(f, neg, p, false);
  return result.code | (neg ? sign_bit(f) : 0u);
}

std::uint32_t round(const format& f, double x, const emu::policy& p, std::uint32_t rbits) {
  require_format(f, "round");
  require_policy(p, "round");
  const bool neg = std::signbit(x);
  // Steps 1 (NaN), 2 (negative into unsigned, -Inf included), 3 (Inf), 4 (zero).
  if (std::isnan(x))
    return nan_result(f, neg, p);
  if (neg && x != 0 && !f.is_signed)
    return negative_unsigned(f, p);
  if (std::isinf(x))
    return overflow_result(f, neg, p, true);
  if (x == 0)
    return zero_input(f, neg, p);
  return round(f, exact(x), neg, p, rbits);
}

std::int32_t round_int(const emu::int_format& f, const rational& x, const emu::policy& p,
                       std::uint32_t rbits) {
  if (const char* why = emu::check_int_format(f))
    throw error(errc::invalid_argument, std::string("reference::round_int: format: ") + why);
  require_policy(p, "round_int");
  // The range by definition: two's complement, without -2^(bits-1) when symmetric.
  const std::int64_t max =
      f.is_signed ? (std::int64_t{1} << (f.bits - 1)) - 1 : (std::int64_t{1} << f.bits) - 1;
  const std::int64_t min = f.is_signed ? (f.symmetric ? -max : -max - 1) : 0;
  if (x == 0)
    return 0;
  const bool neg = x < 0;
  const rational a = neg ? rational(-x) : x;
  // The grid is the integers and an integer's significand is itself.
  const integer lo_int =
      boost::multiprecision::numerator(a) / boost::multiprecision::denominator(a);
  const point lo{rational(lo_int), 0u, boost::multiprecision::bit_test(lo_int, 0), false};
  const point hi{rational(lo_int + 1), 0u, !lo.odd, false};
  const integer m =
      lo.value == a ? lo_int : (pick_hi(lo, hi, a, neg, p, rbits) ? lo_int + 1 : lo_int);
  const integer v = neg ? integer(-m) : m;
  if (v < min)
    return static_cast<std::int32_t>(min);
  if (v > max)
    return static_cast<std::int32_t>(max);
  return static_cast<std::int32_t>(static_cast<std::int64_t>(v));
}

std::int32_t round_int(const emu::int_format& f, double x, const emu::policy& p,
                       std::uint32_t rbits) {
  if (std::isnan(x)) {
    round_int(f, rational(0), p, rbits); // validates the arguments
    return 0;
  }
  if (std::isinf(x)) {
    // Saturation: the end of the range on x's side, found by rounding a value beyond it.
    const rational beyond = rational(integer(1) << 40);
    return round_int(f, x > 0 ? beyond : rational(-beyond), p, rbits);
  }
  return round_int(f, exact(x), p, rbits);
}

} // namespace lowbit::reference
