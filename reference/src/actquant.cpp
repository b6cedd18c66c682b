#include <lowbit/reference/actquant.hpp>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/integer.hpp>

namespace lowbit::reference {

actquant_estimate actquant_update(const actquant_estimate& old, bool known, const rational& lo,
                                  const rational& hi, const rational& momentum) {
  require(hi >= lo, errc::invalid_argument, "actquant_update: hi < lo");
  require(momentum >= 0 && momentum <= 1, errc::invalid_argument,
          "actquant_update: momentum outside [0, 1]");
  const rational a = (hi - lo) / 255;
  if (!known)
    return {a, lo};
  return {momentum * old.alpha + (1 - momentum) * a, momentum * old.beta + (1 - momentum) * lo};
}

std::uint32_t actquant_code(const rational& x, const actquant_estimate& e, const emu::policy& p,
                            std::uint32_t rbits) {
  require(e.alpha > 0, errc::invalid_argument, "actquant_code: alpha must be positive");
  const emu::int_format u8{8, false, false};
  return static_cast<std::uint32_t>(round_int(u8, (x - e.beta) / e.alpha, p, rbits));
}

rational actquant_value(std::uint32_t code, const actquant_estimate& e) {
  require(code <= 255u, errc::invalid_argument, "actquant_value: code outside [0, 255]");
  return rational(static_cast<int>(code)) * e.alpha + e.beta;
}

} // namespace lowbit::reference
