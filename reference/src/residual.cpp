// Residual split/join in exact arithmetic (reference/residual.hpp). Magnitudes are ranked among
// the non-negative float32 values by their value: rank(a) = a / 2^-149 below 2^-126, else
// 2^23 (e + 127) + (a / 2^(e - 23) - 2^23) with 2^e <= a < 2^(e + 1); the rank of +Inf is
// 255 * 2^23. The residual is the rank difference rounded to a multiple of q = 2^max(0, e16 - k)
// (e16 = 16 for bfloat16, 13 for float16), ties up, saturated to k signed bits.
#include <lowbit/reference/residual.hpp>

#include <cmath>
#include <limits>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/reference/round.hpp>

namespace lowbit::reference {

namespace {

const emu::format& format_of(residual_weight t) {
  static const emu::format bf16 = emu::bfloat16, f16 = emu::float16;
  return t == residual_weight::bf16 ? bf16 : f16;
}

int extra(residual_weight t) {
  return t == residual_weight::bf16 ? 16 : 13;
}

const integer inf_rank = integer(255) << 23;

// The rank of a finite non-negative float32 value (exact rational a), by its value.
integer rank_of(const rational& a) {
  const rational min_normal = rational(1) / (integer(1) << 126);
  if (a < min_normal) {
    const rational k = a * (integer(1) << 149);
    if (denominator(k) != 1)
      throw error(errc::invalid_argument, "rank_of: not a float32 value");
    return numerator(k);
  }
  const auto pow2 = [](int k) {
    return k >= 0 ? rational(integer(1) << k) : rational(integer(1), integer(1) << -k);
  };
  // e with 2^e <= a < 2^(e+1): a guess from the double nearest to a, then checked exactly
  int e = std::ilogb(static_cast<double>(a));
  while (a < pow2(e))
    --e;
  while (a >= pow2(e + 1))
    ++e;
  // a / 2^(e - 23)
  const rational scaled = a / pow2(e - 23);
  if (denominator(scaled) != 1)
    throw error(errc::invalid_argument, "rank_of: not a float32 value");
  return (integer(e + 127) << 23) + (numerator(scaled) - (integer(1) << 23));
}

// The float32 value of rank k (0 <= k <= inf_rank; inf_rank gives +Inf).
float value_of_rank(const integer& k) {
  if (k >= inf_rank)
    return std::numeric_limits<float>::infinity();
  const integer field = k >> 23, mant = k & ((integer(1) << 23) - 1);
  const int ef = static_cast<int>(field);
  const double m = static_cast<double>(mant);
  if (ef == 0)
    return static_cast<float>(std::ldexp(m, -149)); // exact
  return static_cast<float>(std::ldexp(m + 8388608.0, ef - 127 - 23));
}

bool code_is_nan(residual_weight t, std::uint16_t w) {
  return is_nan(format_of(t), w);
}

} // namespace

residual_parts residual_split_exact(residual_weight t, int bits, float x) {
  if (bits < 1 || bits > 16)
    throw error(errc::invalid_argument, "residual_split_exact: bits outside [1, 16]");
  const emu::format& f = format_of(t);
  const bool neg = std::signbit(x);
  const std::uint16_t sign_code = neg ? static_cast<std::uint16_t>(1u << 15) : 0;
  if (std::isnan(x))
    return {
        static_cast<std::uint16_t>(sign_code | (t == residual_weight::bf16 ? 0x7FC0u : 0x7E00u)),
        0};
  emu::policy pol;
  pol.round = emu::rounding::nearest_away;
  pol.over = emu::overflow::nonsaturating;
  const auto w = static_cast<std::uint16_t>(round(f, static_cast<double>(x), pol));
  const integer rx = std::isinf(x) ? inf_rank : rank_of(abs(exact(static_cast<double>(x))));
  const integer rw = is_inf(f, w) ? inf_rank : rank_of(abs(value_of(f, w)));
  if (t == residual_weight::f16 && is_inf(f, w))
    return {w, 0};
  const integer d = rx - rw;
  const int s = extra(t) - bits > 0 ? extra(t) - bits : 0;
  const integer q = integer(1) << s;
  // floor((d + q/2) / q) for integers of either sign
  const integer n = d + (s > 0 ? q / 2 : integer(0));
  integer r = n / q; // truncates toward zero
  if (n < 0 && r * q != n)
    r -= 1;
  const integer hi = (integer(1) << (bits - 1)) - 1, lo = -hi - 1;
  if (r > hi)
    r = hi;
  if (r < lo)
    r = lo;
  return {w, static_cast<std::int32_t>(r)};
}

float residual_join_exact(residual_weight t, int bits, std::uint16_t w, std::int32_t r) {
  if (bits < 1 || bits > 16)
    throw error(errc::invalid_argument, "residual_join_exact: bits outside [1, 16]");
  const emu::format& f = format_of(t);
  const bool neg = sign_of(f, w);
  if (code_is_nan(t, w))
    return neg ? -std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::quiet_NaN();
  const integer rw = is_inf(f, w) ? inf_rank : rank_of(abs(value_of(f, w)));
  const int s = extra(t) - bits > 0 ? extra(t) - bits : 0;
  integer k = rw + integer(r) * (integer(1) << s);
  if (k < 0)
    k = 0;
  if (k > inf_rank)
    k = inf_rank;
  const float v = value_of_rank(k);
  return neg ? -v : v;
}

} // namespace lowbit::reference
