// Names of formats and policies, for command lines, Python and reports (host only).
// Named formats parse by name; any other format by "e<E>m<M>[b<bias>][_ieee|_fn|_fnuz|_none]
// [_unsigned][_nozero]", which is also how format_name() prints a format that has no name.
#pragma once

#include <charconv>
#include <string>
#include <string_view>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/policy.hpp>

namespace lowbit::emu {

inline const char* special_name(specials s) {
  switch (s) {
  case specials::ieee: return "ieee";
  case specials::fn: return "fn";
  case specials::fnuz: return "fnuz";
  case specials::none: return "none";
  }
  return "?";
}

inline std::string format_name(const format& f) {
  for (const auto& n : named_formats)
    if (n.fmt == f)
      return n.name;
  // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "literal" + std::string here.
  std::string s = "e";
  s += std::to_string(f.exp_bits);
  s += 'm';
  s += std::to_string(f.man_bits);
  s += 'b';
  s += std::to_string(f.bias);
  s += '_';
  s += special_name(f.special);
  if (!f.is_signed)
    s += "_unsigned";
  if (!f.has_zero)
    s += "_nozero";
  return s;
}

inline format parse_format(std::string_view name) {
  for (const auto& n : named_formats)
    if (name == n.name)
      return n.fmt;
  const auto fail = [&](const char* why) {
    std::string known;
    for (const auto& n : named_formats)
      known += std::string(known.empty() ? "" : ", ") + n.name;
    return error(errc::invalid_argument, "format '" + std::string(name) + "': " + why +
                                             " (named formats: " + known +
                                             "; or e<E>m<M>[b<bias>][_ieee|_fn|_fnuz|_none]"
                                             "[_unsigned][_nozero])");
  };
  std::string_view s = name;
  const auto number = [&](int& out) {
    bool neg = !s.empty() && s.front() == '-';
    if (neg)
      s.remove_prefix(1);
    // Digits only: from_chars would take a second '-' ("b--5"), and -INT_MIN overflows.
    if (s.empty() || s.front() < '0' || s.front() > '9')
      return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || p == s.data())
      return false;
    s.remove_prefix(static_cast<std::size_t>(p - s.data()));
    if (neg)
      out = -out;
    return true;
  };
  format f;
  if (s.empty() || s.front() != 'e')
    throw fail("unknown name");
  s.remove_prefix(1);
  if (!number(f.exp_bits) || s.empty() || s.front() != 'm')
    throw fail("unknown name");
  s.remove_prefix(1);
  if (!number(f.man_bits))
    throw fail("expected the mantissa bits after 'm'");
  f.bias = (f.exp_bits >= 1 && f.exp_bits <= 8) ? (1 << (f.exp_bits - 1)) - 1 : 0;
  if (!s.empty() && s.front() == 'b') {
    s.remove_prefix(1);
    if (!number(f.bias))
      throw fail("expected the bias after 'b'");
  }
  while (!s.empty()) {
    if (s.front() != '_')
      throw fail("unexpected text");
    s.remove_prefix(1);
    const auto end = s.find('_');
    const std::string_view word = s.substr(0, end);
    s.remove_prefix(end == std::string_view::npos ? s.size() : end);
    if (word == "ieee")
      f.special = specials::ieee;
    else if (word == "fn")
      f.special = specials::fn;
    else if (word == "fnuz")
      f.special = specials::fnuz;
    else if (word == "none")
      f.special = specials::none;
    else if (word == "unsigned")
      f.is_signed = false;
    else if (word == "nozero")
      f.has_zero = false;
    else
      throw fail("unknown suffix");
  }
  if (const char* why = check_format(f))
    throw fail(why);
  return f;
}

inline const char* rounding_name(rounding r) {
  switch (r) {
  case rounding::nearest_even: return "nearest_even";
  case rounding::nearest_away: return "nearest_away";
  case rounding::toward_zero: return "toward_zero";
  case rounding::up: return "up";
  case rounding::down: return "down";
  case rounding::odd: return "odd";
  case rounding::stochastic: return "stochastic";
  }
  return "?";
}

inline constexpr rounding all_roundings[] = {
    rounding::nearest_even, rounding::nearest_away, rounding::toward_zero, rounding::up,
    rounding::down,         rounding::odd,          rounding::stochastic};

inline rounding parse_rounding(std::string_view name) {
  for (rounding r : all_roundings)
    if (name == rounding_name(r))
      return r;
  throw error(errc::invalid_argument,
              "rounding '" + std::string(name) +
                  "': expected one of nearest_even, nearest_away, toward_zero, up, down, odd, "
                  "stochastic");
}

inline const char* overflow_name(overflow o) {
  return o == overflow::saturate ? "saturate" : "nonsaturating";
}

inline std::string int_format_name(const int_format& f) {
  return std::string(f.is_signed ? "int" : "uint") + std::to_string(f.bits) +
         (f.symmetric ? "_sym" : "");
}

inline int_format parse_int_format(std::string_view name) {
  for (const int_format& f : {int8, int8_sym, uint8, int4, int4_sym, uint4})
    if (name == int_format_name(f))
      return f;
  throw error(errc::invalid_argument, "integer format '" + std::string(name) +
                                          "': expected int8, int8_sym, uint8, int4, int4_sym "
                                          "or uint4");
}

// Throws lowbit::error unless p is a valid policy.
inline void validate(const policy& p) {
  if (const char* why = check_policy(p))
    throw error(errc::invalid_argument, std::string("policy: ") + why);
}
inline void validate(const format& f) {
  if (const char* why = check_format(f))
    throw error(errc::invalid_argument, std::string("format: ") + why);
}

} // namespace lowbit::emu
