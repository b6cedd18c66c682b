// lowbit::verify: the comparison, the policy parser and the report's text and JSON forms. One
// pass over the elements on the host (verification is not a hot path; the CPU twins are).
// docs/verification.md is the specification of every rule here.
#include <lowbit/kernels/verify.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <ostream>
#include <sstream>
#include <utility>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/error.hpp>
#include <lowbit/emu/names.hpp>

namespace lowbit::verify {
namespace {

using kernels::dtype;
using kernels::tensor_view;

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// ---- numbers as text ------------------------------------------------------------------------

// The shortest text that reads back as the same double.
std::string shortest(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, res.ptr);
}

// For people: a value that a float holds exactly prints as the shortest float text (0.1f as
// "0.1", not "0.10000000149011612"); the hex bit pattern beside it removes any doubt.
std::string readable(double x) {
  if (std::isfinite(x) && std::fabs(x) <= std::numeric_limits<float>::max() &&
      static_cast<double>(static_cast<float>(x)) == x) {
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
    return std::string(buf, res.ptr);
  }
  return shortest(x);
}

// Errors to six significant digits: enough to read, and the JSON form keeps every digit.
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

// ---- policies -------------------------------------------------------------------------------

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

// ---- reading elements -----------------------------------------------------------------------

enum class storage : std::uint8_t { f32, f64, f16, bf16, code, i8, i16, i32, u_plain };

struct column {
  const tensor_view* view = nullptr;
  const char* arg = "";
  storage kind = storage::f32;
  emu::format fmt{}; // codes
  std::uint32_t code_mask = 0;
  // The format whose codes the stored bits are (float16, bfloat16, float32, code arrays): on
  // that format's grid a position is read off the bits.
  std::optional<emu::format> native;
  int hex_digits = 8;
};

struct sample {
  double value = 0;
  std::uint64_t bits = 0;
};

template <class T> T load(const tensor_view& v, std::int64_t offset) {
  T x;
  std::memcpy(
      &x, static_cast<const unsigned char*>(v.data) + offset * static_cast<std::int64_t>(sizeof(T)),
      sizeof(T));
  return x;
}

sample read(const column& c, std::int64_t offset) {
  const tensor_view& v = *c.view;
  switch (c.kind) {
  case storage::f32: {
    const auto x = load<float>(v, offset);
    std::uint32_t b;
    std::memcpy(&b, &x, 4);
    return {static_cast<double>(x), b};
  }
  case storage::f64: {
    const auto x = load<double>(v, offset);
    std::uint64_t b;
    std::memcpy(&b, &x, 8);
    return {x, b};
  }
  case storage::f16: {
    const auto b = load<std::uint16_t>(v, offset);
    return {emu::decode<double>(emu::float16, b), b};
  }
  case storage::bf16: {
    const auto b = load<std::uint16_t>(v, offset);
    return {emu::decode<double>(emu::bfloat16, b), b};
  }
  case storage::code:
  case storage::u_plain: {
    std::uint32_t b = 0;
    switch (v.type) {
    case dtype::uint8: b = load<std::uint8_t>(v, offset); break;
    case dtype::uint16: b = load<std::uint16_t>(v, offset); break;
    default: b = load<std::uint32_t>(v, offset); break;
    }
    if (c.kind == storage::u_plain)
      return {static_cast<double>(b), b};
    return {emu::decode<double>(c.fmt, b), b};
  }
  case storage::i8: {
    const auto x = load<std::int8_t>(v, offset);
    return {static_cast<double>(x), static_cast<std::uint8_t>(x)};
  }
  case storage::i16: {
    const auto x = load<std::int16_t>(v, offset);
    return {static_cast<double>(x), static_cast<std::uint16_t>(x)};
  }
  case storage::i32: {
    const auto x = load<std::int32_t>(v, offset);
    return {static_cast<double>(x), static_cast<std::uint32_t>(x)};
  }
  }
  return {};
}

// `fmt`: the format of code arrays. `plain_uint`: unsigned integers without a format are plain
// integers (inputs) rather than an error (candidate and reference).
column make_column(const tensor_view& v, const char* arg, const std::optional<emu::format>& fmt,
                   bool plain_uint) {
  kernels::require_valid(v, arg);
  require(v.dev.type == kernels::device_type::cpu, errc::invalid_argument,
          std::string(arg) + " is on " + kernels::device_name(v.dev) +
              ", but lowbit::verify compares host memory: copy it to the host first (x.cpu() in "
              "PyTorch, cudaMemcpy in C++)");
  column c;
  c.view = &v;
  c.arg = arg;
  const int bytes = static_cast<int>(kernels::dtype_size(v.type));
  c.hex_digits = 2 * bytes;
  switch (v.type) {
  case dtype::float32:
    c.kind = storage::f32;
    c.native = emu::float32;
    return c;
  case dtype::float64: c.kind = storage::f64; return c;
  case dtype::float16:
    c.kind = storage::f16;
    c.native = emu::float16;
    return c;
  case dtype::bfloat16:
    c.kind = storage::bf16;
    c.native = emu::bfloat16;
    return c;
  case dtype::int8: c.kind = storage::i8; return c;
  case dtype::int16: c.kind = storage::i16; return c;
  case dtype::int32: c.kind = storage::i32; return c;
  case dtype::uint8:
  case dtype::uint16:
  case dtype::uint32:
    if (!fmt) {
      require(plain_uint, errc::invalid_argument,
              std::string(arg) + ": dtype " + kernels::dtype_name(v.type) +
                  " holds codes of a number format; name the format (a policy such as "
                  "'ulp:1@e4m3fn' or 'exact@e4m3fn', or the format argument)");
      c.kind = storage::u_plain;
      return c;
    }
    {
      const dtype want =
          fmt->bits() <= 8 ? dtype::uint8 : (fmt->bits() <= 16 ? dtype::uint16 : dtype::uint32);
      require(v.type == want, errc::invalid_type,
              std::string(arg) + ": dtype " + kernels::dtype_name(v.type) +
                  " does not hold codes of " + emu::format_name(*fmt) + "; expected " +
                  kernels::dtype_name(want));
    }
    c.kind = storage::code;
    c.fmt = *fmt;
    c.native = *fmt;
    c.code_mask = static_cast<std::uint32_t>((std::uint64_t{1} << fmt->bits()) - 1u);
    c.hex_digits = (fmt->bits() + 3) / 4;
    return c;
  case dtype::int64: break;
  }
  throw error(errc::invalid_type,
              std::string(arg) + ": dtype " + kernels::dtype_name(v.type) +
                  " is not supported; expected float32, float64, float16, bfloat16, int8, int16, "
                  "int32, or uint8/uint16/uint32 codes of a format");
}

// ---- the grid of ulp distances --------------------------------------------------------------

// A point's place on a grid: whole + frac steps from zero (frac may be any real), or beyond every
// finite position (infinite = +-1) for Inf on a grid that has no Inf.
struct position {
  std::int64_t whole = 0;
  double frac = 0;
  int infinite = 0;
};

struct grid {
  enum class kind : std::uint8_t { format, float64, integers } k = kind::format;
  emu::format fmt{};
  std::string name;
};

// The largest grid value <= a (a >= the smallest value): rounding down, saturating at max.
constexpr emu::policy down_saturate{emu::rounding::down, emu::overflow::saturate};

// Position of a >= 0 (any a for unsigned formats) on the nonnegative codes of f, which ascend
// with the value. Between grid points: linear. Beyond max: linear with the top binade's spacing,
// up to Inf's position where f has Inf. Below the smallest value (only without zero, or negative
// a in an unsigned format): linear with the first spacing; for signed formats without zero the
// two smallest values +-v0 are one step apart, at +-1/2.
position locate_magnitude(const emu::format& f, double a) {
  const double v0 = emu::decode<double>(f, 0);
  const double offset = (f.is_signed && !f.has_zero) ? 0.5 : 0.0;
  if (a < v0) {
    if (f.is_signed)
      return {0, 0.5 * a / v0, 0};
    return {0, (a - v0) / (emu::decode<double>(f, 1) - v0), 0};
  }
  const std::uint32_t max_code = f.max_code();
  const std::uint32_t c = emu::encode(f, a, down_saturate) & f.mag_mask();
  const double vc = emu::decode<double>(f, c);
  double frac;
  if (c >= max_code) {
    frac = (a - vc) / std::ldexp(1.0, f.emax() - f.man_bits);
    if (f.has_inf() && frac >= 1)
      return {static_cast<std::int64_t>(max_code) + 1, 0, 0};
  } else {
    frac = (a - vc) / (emu::decode<double>(f, c + 1) - vc);
  }
  return {static_cast<std::int64_t>(c), frac + offset, 0};
}

position locate(const grid& g, double x) { // x is not NaN
  switch (g.k) {
  case grid::kind::float64: {
    // IEEE order: the magnitude bits count steps from zero (+-0 are one point, Inf follows max).
    std::uint64_t b;
    std::memcpy(&b, &x, 8);
    const auto mag = static_cast<std::int64_t>(b & 0x7FFFFFFFFFFFFFFFull);
    return {std::signbit(x) ? -mag : mag, 0, 0};
  }
  case grid::kind::integers: {
    if (std::isinf(x))
      return {0, 0, x > 0 ? 1 : -1};
    const double fl = std::floor(x);
    if (std::fabs(fl) < 0x1p62)
      return {static_cast<std::int64_t>(fl), x - fl, 0};
    return {0, x, 0};
  }
  case grid::kind::format: break;
  }
  const emu::format& f = g.fmt;
  if (std::isinf(x)) {
    const bool neg = x < 0;
    if (f.has_inf() && (!neg || f.is_signed)) {
      const auto p = static_cast<std::int64_t>(f.max_code()) + 1;
      return {neg ? -p : p, 0, 0};
    }
    return {0, 0, neg ? -1 : 1};
  }
  if (!f.is_signed)
    return locate_magnitude(f, x);
  position p = locate_magnitude(f, std::fabs(x));
  if (std::signbit(x)) {
    p.whole = -p.whole;
    p.frac = -p.frac;
  }
  return p;
}

// The position of a (non-NaN) code of the grid's own format: the nonnegative codes ascend with
// the value, Inf's code included, so the magnitude bits are the position (locate gives the same
// from the value, slower).
position code_position(const emu::format& f, std::uint64_t bits) {
  const auto code = static_cast<std::uint32_t>(bits);
  const auto mag = static_cast<std::int64_t>(code & f.mag_mask());
  const double offset = (f.is_signed && !f.has_zero) ? 0.5 : 0.0;
  if ((code & f.sign_mask()) != 0)
    return {-mag, -offset, 0};
  return {mag, offset, 0};
}

double distance(const position& a, const position& b) {
  if (a.infinite != 0 || b.infinite != 0)
    return a.infinite == b.infinite ? 0.0 : inf;
  // The difference of the whole parts is below 2^64: exact in unsigned arithmetic.
  const bool ge = a.whole >= b.whole;
  const std::uint64_t d =
      ge ? static_cast<std::uint64_t>(a.whole) - static_cast<std::uint64_t>(b.whole)
         : static_cast<std::uint64_t>(b.whole) - static_cast<std::uint64_t>(a.whole);
  const double whole = ge ? static_cast<double>(d) : -static_cast<double>(d);
  return std::fabs(whole + (a.frac - b.frac));
}

// ---- the histogram --------------------------------------------------------------------------

// Bucket 0: d == 0; 1: (0, 1]; j = 2..65: (2^(j-2), 2^(j-1)]; 66: finite beyond 2^64; 67: inf.
constexpr int bucket_count = 68;

int bucket_of(double d) {
  if (d == 0)
    return 0;
  if (d <= 1)
    return 1;
  if (!std::isfinite(d)) // inf (NaN never reaches here; if it did, no index from frexp)
    return 67;
  int e = 0;
  const double m = std::frexp(d, &e); // d = m * 2^e, m in [0.5, 1)
  const int k = m == 0.5 ? e - 1 : e; // smallest k with d <= 2^k
  return k <= 64 ? k + 1 : 66;
}

std::string power_text(int k) {
  return k <= 52 ? std::to_string(std::uint64_t{1} << k) : "2^" + std::to_string(k);
}

histogram_bucket make_bucket(int j, std::int64_t count) {
  histogram_bucket b;
  b.count = count;
  if (j == 0) {
    b.label = "0";
  } else if (j == 1) {
    b.label = "(0, 1]";
    b.hi = 1;
  } else if (j <= 65) {
    b.lo = std::ldexp(1.0, j - 2);
    b.hi = std::ldexp(1.0, j - 1);
    b.label = "(" + power_text(j - 2) + ", " + power_text(j - 1) + "]";
  } else if (j == 66) {
    b.lo = std::ldexp(1.0, 64);
    b.hi = inf;
    b.label = "> 2^64";
  } else {
    b.lo = b.hi = inf;
    b.label = "inf";
  }
  return b;
}

// ---- the worst list -------------------------------------------------------------------------

struct candidate_entry {
  bool failed = false;
  bool nan_mismatch = false;
  double measure = 0; // the policy's error measure: how far past (or short of) its limit
  std::int64_t flat = 0;
  std::array<std::int64_t, kernels::max_dims> index{};
  sample c, r;
  std::optional<sample> in;
  double abs_error = 0, rel_error = 0, ulp_error = 0, allowed = 0;
};

// a is worse than b: failing first, NaN mismatches first among them, then the larger measure,
// then the smaller index.
bool worse(const candidate_entry& a, const candidate_entry& b) {
  if (a.failed != b.failed)
    return a.failed;
  if (a.nan_mismatch != b.nan_mismatch)
    return a.nan_mismatch;
  if (a.measure != b.measure)
    return a.measure > b.measure;
  return a.flat < b.flat;
}

double ratio(double abs_error, double allowed) {
  if (abs_error == 0)
    return 0;
  if (allowed == 0 || std::isinf(abs_error))
    return inf;
  if (std::isinf(allowed))
    return 0;
  return abs_error / allowed;
}

// ---- JSON -----------------------------------------------------------------------------------

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(ch) < 0x20) {
        out += "\\u00" + hex(static_cast<unsigned char>(ch), 2).substr(2);
      } else {
        out += ch;
      }
    }
  }
  return out + "\"";
}

// JSON has no Inf or NaN: they are the strings "inf", "-inf" and "nan".
std::string json_number(double x) {
  return std::isfinite(x) ? shortest(x) : json_string(shortest(x));
}

std::string json_ints(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t k = 0; k < v.size(); ++k)
    s += (k ? ", " : "") + std::to_string(v[k]);
  return s + "]";
}

} // namespace

// ---- policies -------------------------------------------------------------------------------

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
    if (p.rtol != 0)
      s += (s.empty() ? "" : ",") + std::string("rtol:") + shortest(p.rtol);
    break;
  case policy_kind::bound: s = p.bound_name.empty() ? "bound" : "bound:" + p.bound_name; break;
  }
  if (p.format)
    s += "@" + emu::format_name(*p.format);
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

// ---- compare --------------------------------------------------------------------------------

report compare(const tensor_view& candidate, const tensor_view& reference, const policy& p,
               const std::optional<tensor_view>& inputs, const options& opt) {
  validate(p);
  const column cc = make_column(candidate, "candidate", p.format, false);
  const column rc = make_column(reference, "reference", p.format, false);
  kernels::require_same_shape(candidate, "candidate", reference, "reference");
  std::optional<column> ic;
  if (inputs) {
    ic = make_column(*inputs, "inputs", opt.input_format, true);
    kernels::require_same_shape(candidate, "candidate", *inputs, "inputs");
  }
  if (p.kind == policy_kind::exact)
    require(candidate.type == reference.type, errc::invalid_type,
            std::string("exact compares bit patterns, so candidate (") +
                kernels::dtype_name(candidate.type) + ") and reference (" +
                kernels::dtype_name(reference.type) +
                ") must have the same dtype; compare values across dtypes with a ulp or "
                "tolerance policy");

  grid g;
  if (p.format) {
    g.fmt = *p.format;
    g.name = emu::format_name(*p.format);
  } else {
    switch (candidate.type) {
    case dtype::float16:
      g.fmt = emu::float16;
      g.name = "float16";
      break;
    case dtype::bfloat16:
      g.fmt = emu::bfloat16;
      g.name = "bfloat16";
      break;
    case dtype::float32:
      g.fmt = emu::float32;
      g.name = "float32";
      break;
    case dtype::float64:
      g.k = grid::kind::float64;
      g.name = "float64";
      break;
    default:
      g.k = grid::kind::integers;
      g.name = "integers";
      break;
    }
  }

  report rep;
  rep.policy = to_string(p);
  rep.grid = g.name;
  rep.candidate_dtype = kernels::dtype_name(candidate.type);
  rep.reference_dtype = kernels::dtype_name(reference.type);
  if (inputs)
    rep.input_dtype = kernels::dtype_name(inputs->type);
  const int nd = candidate.ndim;
  rep.shape.assign(candidate.shape.begin(), candidate.shape.begin() + nd);
  rep.total = candidate.numel();

  std::array<std::int64_t, bucket_count> buckets{};
  std::vector<candidate_entry> heap;
  heap.reserve(opt.worst);
  const auto keep = [&](const candidate_entry& e) {
    if (opt.worst == 0 || (!e.failed && e.measure == 0))
      return;
    if (heap.size() < opt.worst) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), worse);
    } else if (worse(e, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      heap.back() = e;
      std::push_heap(heap.begin(), heap.end(), worse);
    }
  };

  const auto check_code = [&](const column& c, const sample& s,
                              const std::array<std::int64_t, kernels::max_dims>& idx) {
    if (c.kind != storage::code || (s.bits & ~static_cast<std::uint64_t>(c.code_mask)) == 0)
      return;
    std::vector<std::int64_t> at(idx.begin(), idx.begin() + nd);
    throw error(errc::invalid_argument,
                std::string(c.arg) + index_text(at) + " = " +
                    hex(s.bits, 2 * static_cast<int>(kernels::dtype_size(c.view->type))) +
                    " is not a code of " + emu::format_name(c.fmt) + " (" +
                    std::to_string(c.fmt.bits()) + " bits)");
  };

  std::array<std::int64_t, kernels::max_dims> idx{};
  std::int64_t oc = 0, orf = 0, oi = 0;
  for (std::int64_t flat = 0; flat < rep.total; ++flat) {
    candidate_entry e;
    e.flat = flat;
    e.c = read(cc, oc);
    e.r = read(rc, orf);
    check_code(cc, e.c, idx);
    check_code(rc, e.r, idx);
    if (ic) {
      e.in = read(*ic, oi);
      check_code(*ic, *e.in, idx);
    }
    e.index = idx;

    const bool cnan = std::isnan(e.c.value), rnan = std::isnan(e.r.value);
    if (cnan || rnan) {
      const bool match =
          cnan && rnan && !(p.kind == policy_kind::exact && p.strict_nan && e.c.bits != e.r.bits);
      if (match) {
        ++rep.nan_matches;
      } else {
        ++rep.nan_mismatches;
        ++rep.failed;
        e.failed = e.nan_mismatch = true;
        e.measure = inf;
        e.abs_error = e.rel_error = e.ulp_error = nan;
        e.allowed = p.kind == policy_kind::ulp ? p.max_ulp : 0;
        keep(e);
      }
    } else {
      ++rep.checked;
      const double c = e.c.value, r = e.r.value;
      const bool infinite = std::isinf(c) || std::isinf(r);
      e.abs_error = c == r ? 0.0 : std::fabs(c - r);
      e.rel_error = e.abs_error == 0                      ? 0.0
                    : (std::isinf(e.abs_error) || r == 0) ? inf
                                                          : e.abs_error / std::fabs(r);
      if (e.c.bits == e.r.bits && cc.kind == rc.kind) {
        e.ulp_error = 0; // the same value: the common case, kept cheap
      } else {
        const auto where = [&](const column& col, const sample& smp) {
          if (g.k == grid::kind::format && col.native && *col.native == g.fmt)
            return code_position(g.fmt, smp.bits);
          return locate(g, smp.value);
        };
        e.ulp_error = distance(where(cc, e.c), where(rc, e.r));
      }
      switch (p.kind) {
      case policy_kind::exact:
        e.failed = e.c.bits != e.r.bits;
        e.measure = e.ulp_error;
        break;
      case policy_kind::ulp:
        e.allowed = p.max_ulp;
        e.failed = !(e.ulp_error <= p.max_ulp);
        e.measure = e.ulp_error;
        break;
      case policy_kind::tolerance:
      case policy_kind::bound:
        if (p.kind == policy_kind::tolerance) {
          e.allowed = p.atol + (p.rtol == 0 ? 0.0 : p.rtol * std::fabs(r));
        } else {
          bound_args a;
          a.index = std::span<const std::int64_t>(idx.data(), static_cast<std::size_t>(nd));
          a.flat_index = flat;
          a.reference = r;
          if (e.in)
            a.input = e.in->value;
          e.allowed = p.bound(a);
          if (std::isnan(e.allowed) || e.allowed < 0) {
            std::vector<std::int64_t> at(idx.begin(), idx.begin() + nd);
            throw error(errc::invalid_argument,
                        "bound: the bound function returned " + shortest(e.allowed) + " at index " +
                            index_text(at) + " (reference " + shortest(r) +
                            "); it must return an allowed absolute error >= 0");
          }
        }
        // Infinities pass only where they are equal: inf - inf has no size to bound.
        e.failed = infinite ? c != r : !(e.abs_error <= e.allowed);
        e.measure = ratio(e.abs_error, e.allowed);
        break;
      }
      if (e.failed)
        ++rep.failed;
      ++buckets[static_cast<std::size_t>(bucket_of(e.ulp_error))];
      rep.max_abs_error = std::max(rep.max_abs_error, e.abs_error);
      rep.max_rel_error = std::max(rep.max_rel_error, e.rel_error);
      rep.max_ulp_error = std::max(rep.max_ulp_error, e.ulp_error);
      keep(e);
    }

    for (int k = nd - 1; k >= 0; --k) {
      oc += candidate.strides[k];
      orf += reference.strides[k];
      if (ic)
        oi += inputs->strides[k];
      if (++idx[k] < candidate.shape[k])
        break;
      oc -= idx[k] * candidate.strides[k];
      orf -= idx[k] * reference.strides[k];
      if (ic)
        oi -= idx[k] * inputs->strides[k];
      idx[k] = 0;
    }
  }

  for (int j = 0; j < bucket_count; ++j)
    if (buckets[static_cast<std::size_t>(j)] != 0)
      rep.histogram.push_back(make_bucket(j, buckets[static_cast<std::size_t>(j)]));

  std::sort_heap(heap.begin(), heap.end(), worse);
  for (const candidate_entry& e : heap) {
    element el;
    el.index.assign(e.index.begin(), e.index.begin() + nd);
    el.flat_index = e.flat;
    if (e.in) {
      el.input = e.in->value;
      el.input_hex = hex(e.in->bits, ic->hex_digits);
    }
    el.candidate = e.c.value;
    el.reference = e.r.value;
    el.candidate_hex = hex(e.c.bits, cc.hex_digits);
    el.reference_hex = hex(e.r.bits, rc.hex_digits);
    el.abs_error = e.abs_error;
    el.rel_error = e.rel_error;
    el.ulp_error = e.ulp_error;
    el.allowed = e.allowed;
    el.failed = e.failed;
    el.nan_mismatch = e.nan_mismatch;
    rep.worst.push_back(std::move(el));
  }
  return rep;
}

// ---- the report as text and JSON ------------------------------------------------------------

std::string report::to_string() const {
  std::ostringstream os;
  if (ok())
    os << "verify passed: " << total << " element" << (total == 1 ? "" : "s") << " within "
       << policy << "\n";
  else
    os << "verify FAILED: " << failed << " of " << total << " elements outside " << policy << "\n";
  os << "  candidate " << candidate_dtype << ' ' << shape_text(shape) << ", reference "
     << reference_dtype;
  if (!input_dtype.empty())
    os << ", inputs " << input_dtype;
  os << "; ulp grid " << grid << "\n";
  os << "  checked " << checked << ", NaN matched " << nan_matches << ", NaN mismatches "
     << nan_mismatches << "\n";
  os << "  max abs error " << error_text(max_abs_error) << ", max rel error "
     << error_text(max_rel_error) << ", max ulp error " << error_text(max_ulp_error) << "\n";

  if (!worst.empty()) {
    const bool with_input = !input_dtype.empty();
    const bool with_allowed = policy.rfind("exact", 0) != 0;
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> head = {"index"};
    if (with_input)
      head.push_back("input");
    for (const char* h : {"candidate", "expected", "abs error", "ulp error"})
      head.push_back(h);
    if (with_allowed)
      head.push_back("allowed");
    head.push_back("");
    rows.push_back(head);
    for (const element& e : worst) {
      std::vector<std::string> row = {index_text(e.index)};
      if (with_input)
        row.push_back(e.input ? readable(*e.input) + " (" + e.input_hex + ")" : std::string());
      row.push_back(readable(e.candidate) + " (" + e.candidate_hex + ")");
      row.push_back(readable(e.reference) + " (" + e.reference_hex + ")");
      row.push_back(error_text(e.abs_error));
      row.push_back(error_text(e.ulp_error));
      if (with_allowed)
        row.push_back(error_text(e.allowed));
      row.push_back(e.nan_mismatch ? "NaN mismatch" : (e.failed ? "FAIL" : "ok"));
      rows.push_back(std::move(row));
    }
    std::vector<std::size_t> width(head.size(), 0);
    for (const auto& row : rows)
      for (std::size_t k = 0; k < row.size(); ++k)
        width[k] = std::max(width[k], row[k].size());
    os << "  worst elements:\n";
    for (const auto& row : rows) {
      std::string line = "   ";
      for (std::size_t k = 0; k < row.size(); ++k) {
        line += ' ';
        line += row[k];
        if (k + 1 < row.size())
          line += std::string(width[k] - row[k].size(), ' ') + ' ';
      }
      while (!line.empty() && line.back() == ' ')
        line.pop_back();
      os << line << "\n";
    }
  }
  if (!histogram.empty()) {
    os << "  ulp errors:";
    for (std::size_t k = 0; k < histogram.size(); ++k)
      os << (k ? " |" : "") << ' ' << histogram[k].label << ": " << histogram[k].count;
    os << "\n";
  }
  return os.str();
}

std::string report::to_json() const {
  std::ostringstream os;
  os << "{\"ok\": " << (ok() ? "true" : "false") << ", \"policy\": " << json_string(policy)
     << ", \"grid\": " << json_string(grid)
     << ", \"candidate_dtype\": " << json_string(candidate_dtype)
     << ", \"reference_dtype\": " << json_string(reference_dtype) << ", \"input_dtype\": "
     << (input_dtype.empty() ? std::string("null") : json_string(input_dtype))
     << ", \"shape\": " << json_ints(shape) << ", \"total\": " << total
     << ", \"checked\": " << checked << ", \"nan_matches\": " << nan_matches
     << ", \"nan_mismatches\": " << nan_mismatches << ", \"failed\": " << failed
     << ", \"max_abs_error\": " << json_number(max_abs_error)
     << ", \"max_rel_error\": " << json_number(max_rel_error)
     << ", \"max_ulp_error\": " << json_number(max_ulp_error) << ", \"worst\": [";
  for (std::size_t k = 0; k < worst.size(); ++k) {
    const element& e = worst[k];
    os << (k ? ", " : "") << "{\"index\": " << json_ints(e.index)
       << ", \"flat_index\": " << e.flat_index
       << ", \"input\": " << (e.input ? json_number(*e.input) : std::string("null"))
       << ", \"input_hex\": " << (e.input ? json_string(e.input_hex) : std::string("null"))
       << ", \"candidate\": " << json_number(e.candidate)
       << ", \"candidate_hex\": " << json_string(e.candidate_hex)
       << ", \"reference\": " << json_number(e.reference)
       << ", \"reference_hex\": " << json_string(e.reference_hex)
       << ", \"abs_error\": " << json_number(e.abs_error)
       << ", \"rel_error\": " << json_number(e.rel_error)
       << ", \"ulp_error\": " << json_number(e.ulp_error)
       << ", \"allowed\": " << json_number(e.allowed)
       << ", \"failed\": " << (e.failed ? "true" : "false")
       << ", \"nan_mismatch\": " << (e.nan_mismatch ? "true" : "false") << "}";
  }
  os << "], \"histogram\": [";
  for (std::size_t k = 0; k < histogram.size(); ++k) {
    const histogram_bucket& b = histogram[k];
    os << (k ? ", " : "") << "{\"label\": " << json_string(b.label)
       << ", \"lo\": " << json_number(b.lo) << ", \"hi\": " << json_number(b.hi)
       << ", \"count\": " << b.count << "}";
  }
  os << "]}";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const report& r) {
  return os << r.to_string();
}

} // namespace lowbit::verify
