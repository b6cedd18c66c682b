// The verify policies: constructors, validation, the canonical text and its parser.
// docs/verification.md defines the grammar.
#include <lowbit/verify/policy.hpp>

#include <cmath>
#include <string>

#include <lowbit/emu/error.hpp>
#include <lowbit/emu/names.hpp>

#include "text.hpp"

namespace lowbit::verify {
namespace {

using detail::shortest;

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && space(s.back()))
    s.remove_suffix(1);
  return s;
}

void require_amount(double v, const char* what) {
  require(!std::isnan(v), errc::invalid_argument,
          std::string(what) + " is NaN; it must be a number >= 0 (inf allows any error)");
  require(v >= 0, errc::invalid_argument, std::string(what) + " must be >= 0, got " + shortest(v));
}

constexpr const char* policy_grammar =
    "expected exact, exact:strict, ulp:N, atol:X, rtol:Y or atol:X,rtol:Y, optionally followed "
    "by @<format> (e.g. ulp:1@e4m3fn)";

} // namespace

policy exact(bool strict_nan) {
  policy p;
  p.kind = policy_kind::exact;
  p.strict_nan = strict_nan;
  return p;
}

policy ulp(double n, std::optional<emu::format> fmt) {
  policy p;
  p.kind = policy_kind::ulp;
  p.max_ulp = n;
  p.format = fmt;
  validate(p);
  return p;
}

policy tolerance(double atol, double rtol) {
  policy p;
  p.kind = policy_kind::tolerance;
  p.atol = atol;
  p.rtol = rtol;
  validate(p);
  return p;
}

policy bound(bound_function fn, std::string name) {
  policy p;
  p.kind = policy_kind::bound;
  p.bound = std::move(fn);
  p.bound_name = std::move(name);
  validate(p);
  return p;
}

void validate(const policy& p) {
  if (p.format)
    emu::validate(*p.format);
  switch (p.kind) {
  case policy_kind::exact: return;
  case policy_kind::ulp: require_amount(p.max_ulp, "ulp: the allowed distance"); return;
  case policy_kind::tolerance:
    require_amount(p.atol, "tolerance: atol");
    require_amount(p.rtol, "tolerance: rtol");
    return;
  case policy_kind::bound:
    require(static_cast<bool>(p.bound), errc::invalid_argument,
            "bound: the policy has no bound function");
    return;
  }
  throw error(errc::invalid_argument, "policy: unknown kind");
}

std::string to_string(const policy& p) {
  std::string s;
  switch (p.kind) {
  case policy_kind::exact: s = p.strict_nan ? "exact:strict" : "exact"; break;
  case policy_kind::ulp: s = "ulp:" + shortest(p.max_ulp); break;
  case policy_kind::tolerance:
    if (p.atol != 0 || p.rtol == 0)
      s = "atol:" + shortest(p.atol);
    if (p.rtol != 0) {
      // Appended piece by piece: GCC 12 warns (falsely) on "literal" + std::string in Release.
      if (!s.empty())
        s += ',';
      s += "rtol:";
      s += shortest(p.rtol);
    }
    break;
  case policy_kind::bound:
    s = "bound";
    if (!p.bound_name.empty()) {
      s += ':';
      s += p.bound_name;
    }
    break;
  }
  if (p.format) {
    s += '@';
    s += emu::format_name(*p.format);
  }
  return s;
}

policy parse_policy(std::string_view text, std::optional<emu::format> fmt) {
  const std::string whole(text);
  const auto fail = [&](const std::string& why) {
    return error(errc::invalid_argument, "policy '" + whole + "': " + why);
  };
  std::string_view body = trim(text);
  std::optional<emu::format> named;
  if (const auto at = body.rfind('@'); at != std::string_view::npos) {
    const std::string_view name = trim(body.substr(at + 1));
    try {
      named = emu::parse_format(name);
    } catch (const error& e) {
      throw fail(e.what());
    }
    body = trim(body.substr(0, at));
    if (fmt && !(*named == *fmt))
      throw fail("it names format " + emu::format_name(*named) + " but the format argument is " +
                 emu::format_name(*fmt));
  }
  struct item {
    std::string_view key;
    std::optional<std::string_view> value;
  };
  std::vector<item> items;
  while (!body.empty()) {
    const auto comma = body.find(',');
    const std::string_view part = trim(body.substr(0, comma));
    body = comma == std::string_view::npos ? std::string_view{} : body.substr(comma + 1);
    if (part.empty())
      throw fail(std::string("empty item; ") + policy_grammar);
    item it;
    if (const auto colon = part.find(':'); colon != std::string_view::npos) {
      it.key = trim(part.substr(0, colon));
      it.value = trim(part.substr(colon + 1));
    } else {
      it.key = part;
    }
    items.push_back(it);
  }
  if (items.empty())
    throw fail(std::string("empty policy; ") + policy_grammar);

  const auto number = [&](const item& it) {
    if (!it.value || it.value->empty())
      throw fail(std::string(it.key) + " needs a value, as in " + std::string(it.key) + ":1");
    double v = 0;
    const char* first = it.value->data();
    const char* last = first + it.value->size();
    const auto res = std::from_chars(first, last, v);
    if (res.ec != std::errc() || res.ptr != last)
      throw fail(std::string(it.key) + ": '" + std::string(*it.value) + "' is not a number");
    return v;
  };
  const auto single = [&](const char* kind) {
    if (items.size() != 1)
      throw fail(std::string(kind) + " cannot be combined with other items; " + policy_grammar);
  };

  policy p;
  const std::string_view key = items[0].key;
  if (key == "exact") {
    single("exact");
    if (items[0].value && *items[0].value != "strict")
      throw fail("exact takes no value but 'strict' (NaNs must match bit for bit), got '" +
                 std::string(*items[0].value) + "'");
    p.kind = policy_kind::exact;
    p.strict_nan = items[0].value.has_value();
  } else if (key == "ulp") {
    single("ulp");
    p.kind = policy_kind::ulp;
    p.max_ulp = number(items[0]);
  } else if (key == "atol" || key == "rtol") {
    p.kind = policy_kind::tolerance;
    bool seen_atol = false, seen_rtol = false;
    for (const item& it : items) {
      bool& seen = it.key == "atol" ? seen_atol : seen_rtol;
      if (it.key != "atol" && it.key != "rtol")
        throw fail("'" + std::string(it.key) + "' cannot follow a tolerance; " + policy_grammar);
      if (seen)
        throw fail(std::string(it.key) + " given twice");
      seen = true;
      (it.key == "atol" ? p.atol : p.rtol) = number(it);
    }
  } else if (key == "bound") {
    throw fail("a bound policy takes a function: lowbit::verify::bound(fn) in C++, a callable "
               "in Python");
  } else {
    throw fail("unknown policy '" + std::string(key) + "'; " + policy_grammar);
  }
  p.format = named ? named : fmt;
  try {
    validate(p);
  } catch (const error& e) {
    throw fail(e.what());
  }
  return p;
}

} // namespace lowbit::verify
