// lowbit::verify::compare: one pass over the elements on the host (verification is not a hot
// path; the CPU twins are): each pair read exactly, its errors and ulp distance, the histogram
// and the worst list. docs/verification.md is the specification of every rule here.
#include <lowbit/verify/compare.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/error.hpp>
#include <lowbit/emu/names.hpp>

#include "text.hpp"

namespace lowbit::verify {
namespace {

using detail::hex;
using detail::index_text;
using detail::inf;
using detail::nan;
using detail::shortest;
using kernels::dtype;
using kernels::tensor_view;

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

} // namespace

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
  // At most every element: a `worst` beyond the array's size keeps them all (and allocates no
  // more than they need).
  heap.reserve(static_cast<std::size_t>(
      std::min<std::int64_t>(static_cast<std::int64_t>(opt.worst), rep.total)));
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

    // The allowed absolute error of tolerances and bounds at this element (a bound function is
    // called, and checked, at every element, NaN ones included).
    const auto allowance = [&](double r) -> double {
      if (p.kind == policy_kind::tolerance)
        return p.atol + (p.rtol == 0 || std::isnan(r) ? 0.0 : p.rtol * std::fabs(r));
      bound_args a;
      a.index = std::span<const std::int64_t>(idx.data(), static_cast<std::size_t>(nd));
      a.flat_index = flat;
      a.reference = r;
      if (e.in)
        a.input = e.in->value;
      const double allowed = p.bound(a);
      if (std::isnan(allowed) || allowed < 0) {
        std::vector<std::int64_t> at(idx.begin(), idx.begin() + nd);
        throw error(errc::invalid_argument, "bound: the bound function returned " +
                                                shortest(allowed) + " at index " + index_text(at) +
                                                " (reference " + shortest(r) +
                                                "); it must return an allowed absolute error >= 0");
      }
      return allowed;
    };
    const bool tolerance_or_bound =
        p.kind == policy_kind::tolerance || p.kind == policy_kind::bound;

    const bool cnan = std::isnan(e.c.value), rnan = std::isnan(e.r.value);
    if (cnan || rnan) {
      if (tolerance_or_bound) // a bound function is checked here too (docs: at every element)
        e.allowed = allowance(e.r.value);
      else if (p.kind == policy_kind::ulp)
        e.allowed = p.max_ulp;
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
        e.allowed = allowance(r);
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

} // namespace lowbit::verify
