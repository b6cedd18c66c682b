// Numbers as text for lowbit::verify (text.hpp).
#include "text.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace lowbit::verify::detail {

std::string shortest(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, res.ptr);
}

std::string readable(double x) {
  if (std::isfinite(x) && std::fabs(x) <= std::numeric_limits<float>::max() &&
      static_cast<double>(static_cast<float>(x)) == x) {
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
    return std::string(buf, res.ptr);
  }
  return shortest(x);
}

std::string error_text(double x) {
  if (!std::isfinite(x))
    return shortest(x);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string hex(std::uint64_t bits, int digits) {
  static constexpr char d[] = "0123456789ABCDEF";
  std::string s(static_cast<std::size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, bits >>= 4)
    s[static_cast<std::size_t>(i)] = d[bits & 15u];
  return "0x" + s;
}

std::string index_text(const std::vector<std::int64_t>& index) {
  std::string s = "[";
  for (std::size_t k = 0; k < index.size(); ++k)
    s += (k ? ", " : "") + std::to_string(index[k]);
  return s + "]";
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t k = 0; k < shape.size(); ++k)
    s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

} // namespace lowbit::verify::detail
