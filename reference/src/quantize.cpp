#include <lowbit/reference/quantize.hpp>

#include <lowbit/emu/error.hpp>

namespace lowbit::reference {

namespace {

rational pow2(int k) {
  return k >= 0 ? rational(integer(1) << k) : rational(integer(1), integer(1) << -k);
}

// floor(log2(v)) for v > 0, by exact comparison with powers of two.
int floor_log2(const rational& v) {
  int e = 0;
  while (pow2(e) > v)
    --e;
  while (pow2(e + 1) <= v)
    ++e;
  return e;
}

} // namespace

rational target_max(const quant_target& t) {
  return t.is_int ? rational(t.ifmt.max()) : reference::max_value(t.fmt);
}

rational exact_scale(const quant_target& t, const rational& amax, int margin, bool pow2s) {
  require(amax > 0, errc::invalid_argument, "exact_scale: amax must be positive");
  const rational q = target_max(t) / amax * pow2(-margin);
  if (!pow2s)
    return q;
  const int k = floor_log2(q); // power-of-two scales are kept normal floats: [2^-126, 2^127]
  return pow2(k < -126 ? -126 : (k > 127 ? 127 : k));
}

rational exact_dequant_factor(const quant_target& t, const rational& amax, int margin, bool pow2s) {
  return 1 / exact_scale(t, amax, margin, pow2s);
}

std::uint32_t quantize_value(const quant_target& t, const rational& y, bool negative,
                             const emu::policy& p, std::uint32_t rbits) {
  if (t.is_int)
    return static_cast<std::uint32_t>(round_int(t.ifmt, y, p, rbits)) & 0xFFu;
  return round(t.fmt, y, negative, p, rbits);
}

int mx_shared_exponent(const rational& amax, int emax_elem) {
  require(amax > 0, errc::invalid_argument, "mx_shared_exponent: amax must be positive");
  const int s = floor_log2(amax) - emax_elem;
  return s < -127 ? -127 : (s > 127 ? 127 : s);
}

std::uint32_t mx_element(const quant_target& t, const rational& x, bool negative, int s,
                         const emu::policy& p, std::uint32_t rbits) {
  if (t.is_int)
    return static_cast<std::uint32_t>(round_int(t.ifmt, x * pow2(6 - s), p, rbits)) & 0xFFu;
  return round(t.fmt, x * pow2(-s), negative, p, rbits);
}

} // namespace lowbit::reference
