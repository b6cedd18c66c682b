// Operands for the scaled-matmul tests (CPU twin against the reference; GPU backends against the
// twin): element codes of every operand type with their edges (int8's -128 and +-127, every fp8
// code including NaN, Inf, subnormals and max), matrices of them in adversarial mixes (sums that
// cancel, exponents spread over the whole range, long K), scales and biases. rapidcheck
// generators, drawn inside a property with operator*.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <rapidcheck.h>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/target.hpp>
#include <lowbit/proptest/generators.hpp>

namespace lowbit::proptest::test {

// ---- element codes
// -------------------------------------------------------------------------------

// The sign bit of an element code (int8 codes are two's complement bytes).
inline std::uint32_t gemm_sign_bit(const emu::target& t) {
  return t.is_int ? 0x80u : (std::uint32_t{1} << (t.fmt.bits() - 1));
}

// The code of -value(c): the sign bit flipped for formats, the two's complement negation for
// int8 (whose -128 has no negation: callers keep it out).
inline std::uint32_t negate_code(const emu::target& t, std::uint32_t c) {
  return t.is_int ? ((256u - c) & 0xFFu) : (c ^ gemm_sign_bit(t));
}

// int8 codes (low 8 bits of the value), a quarter of them edges: 0, +-1, +-127 and (full range
// only) -128.
inline rc::Gen<std::uint32_t> int8_codes(bool symmetric) {
  const std::uint32_t lo = symmetric ? 0x81u : 0x80u;
  const auto any = rc::gen::map(uniform<int>(0, 255), [lo](int c) {
    const auto u = static_cast<std::uint32_t>(c);
    return u == 0x80u ? lo : u; // int8_sym has no -128: its code becomes -127
  });
  const auto edge = symmetric
                        ? rc::gen::element<std::uint32_t>(0x00u, 0x01u, 0xFFu, 0x7Fu, 0x81u)
                        : rc::gen::element<std::uint32_t>(0x00u, 0x01u, 0xFFu, 0x7Fu, 0x81u, 0x80u);
  return rc::gen::weightedOneOf<std::uint32_t>({{3, any}, {1, edge}});
}

// The edges of a floating format's magnitudes: zero, the smallest and largest subnormal, the
// smallest normal, one, the largest finite value.
inline std::vector<std::uint32_t> magnitude_edges(const emu::format& f) {
  std::vector<std::uint32_t> e = {0u, 1u, f.man_mask(), f.man_mask() + 1u, f.max_code()};
  e.push_back(emu::encode(f, 1.0, emu::rne));
  return e;
}

// Every code of an 8-bit format uniformly (NaN, Inf, subnormals, zeros, max included) with
// edges on top: with `specials` false, finite codes only (NaN and Inf codes become zeros).
inline rc::Gen<std::uint32_t> fp8_codes(const emu::format& f, bool specials) {
  const auto any = rc::gen::map(any_code(f), [f, specials](std::uint32_t c) {
    if (!specials && !std::isfinite(emu::decode<double>(f, c)))
      return std::uint32_t{0};
    return c;
  });
  std::vector<std::uint32_t> edges = magnitude_edges(f);
  if (specials) {
    edges.push_back(f.mag_mask()); // e4m3fn's NaN, e5m2's last NaN
    if (f.special == emu::specials::ieee)
      edges.push_back(f.max_code() + 1u); // Inf
  }
  const auto edge = rc::gen::apply(
      [f](std::uint32_t c, bool neg) { return neg ? c | (1u << (f.bits() - 1)) : c; },
      rc::gen::elementOf(edges), coin());
  return rc::gen::weightedOneOf<std::uint32_t>({{3, any}, {1, edge}});
}

// Finite codes of a 16-bit format (bfloat16, float16) whose magnitudes lie in [2^elo, 2^ehi)
// (or are zero), random sign and mantissa. bfloat16 operands are kept at |e| <= 50 by the
// matmul tests so that every product is a normal float32 (exact), as fp8 and float16 products
// always are, and sums of thousands of them stay far below float32's overflow.
inline rc::Gen<std::uint32_t> half_codes(const emu::format& f, int elo, int ehi) {
  return rc::gen::apply(
      [f](int e, std::uint32_t man, bool neg, int zero) {
        std::uint32_t c = 0;
        if (zero != 0) {
          const double v = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.man_bits), e);
          c = emu::encode(f, v, emu::rne_sat); // on the grid; below normal, rounded onto it
        }
        return neg ? c | (1u << (f.bits() - 1)) : c;
      },
      uniform<int>(elo, ehi - 1), uniform<std::uint32_t>(0, f.man_mask()), coin(),
      uniform<int>(0, 15));
}

// The range of exponents the tests give each 16-bit format (see half_codes).
inline int half_emin(const emu::format& f) {
  return f == emu::bfloat16 ? -50 : f.emin() - f.man_bits;
}
inline int half_emax(const emu::format& f) {
  return f == emu::bfloat16 ? 50 : f.emax() + 1;
}

// Codes of any operand type: int8/int8_sym, e4m3fn/e5m2 (specials only when asked), bfloat16 or
// float16 (finite, in the range above).
inline rc::Gen<std::uint32_t> element_codes(const emu::target& t, bool specials) {
  if (t.is_int)
    return int8_codes(t.ifmt.symmetric);
  if (t.fmt.bits() == 8)
    return fp8_codes(t.fmt, specials);
  return half_codes(t.fmt, half_emin(t.fmt), half_emax(t.fmt));
}

// Only the extremes of a format: the smallest subnormal, the largest value, the smallest normal,
// with random signs, so that one sum spans every exponent there is (int8: +-1, +-2, +-127 and,
// full range, -128).
inline rc::Gen<std::uint32_t> extreme_codes(const emu::target& t) {
  if (t.is_int) {
    std::vector<std::uint32_t> ints = {0x01u, 0x7Fu, 0xFFu, 0x81u, 0x02u, 0xFEu};
    if (!t.ifmt.symmetric)
      ints.push_back(0x80u); // -128, the one code without a negation
    return rc::gen::elementOf(ints);
  }
  const emu::format f = t.fmt;
  std::vector<std::uint32_t> edges;
  if (f.bits() == 8) {
    edges = magnitude_edges(f);
  } else {
    for (const int e : {half_emin(f), 0, half_emax(f) - 1})
      edges.push_back(emu::encode(f, std::ldexp(1.0, e), emu::rne_sat));
  }
  return rc::gen::apply(
      [f](std::uint32_t c, bool neg) { return neg ? c | (1u << (f.bits() - 1)) : c; },
      rc::gen::elementOf(edges), coin());
}

// ---- operand matrices --------------------------------------------------------------------------

// How the codes of an operand pair are drawn.
enum class operand_mix : std::uint8_t {
  uniform,      // every element from element_codes
  cancellation, // the second half of K repeats the first with A negated: the exact sum is the
                // few elements redrawn afterwards, while the float sum meets large partial sums
  spread,       // extreme_codes only: products from the smallest to the largest exponent
  long_k,       // uniform, with K in the thousands
};

struct gemm_operands {
  std::int64_t m = 0, n = 0, k = 0;
  std::vector<std::uint32_t> a, b; // row-major M x K and N x K codes
};

inline rc::Gen<operand_mix> operand_mixes() {
  return rc::gen::weightedElement<operand_mix>({{4, operand_mix::uniform},
                                                {2, operand_mix::cancellation},
                                                {2, operand_mix::spread},
                                                {1, operand_mix::long_k}});
}

// Operands of targets ta and tb in a mix; M and N in [1, max_mn], K in [1, max_k] (thousands for
// long_k). Specials (fp8 NaN/Inf codes) only when asked.
inline gemm_operands draw_operands(const emu::target& ta, const emu::target& tb, operand_mix mix,
                                   bool specials, std::int64_t max_mn = 6,
                                   std::int64_t max_k = 48) {
  gemm_operands r;
  r.m = *uniform<std::int64_t>(1, max_mn);
  r.n = *uniform<std::int64_t>(1, max_mn);
  r.k = mix == operand_mix::long_k ? *uniform<std::int64_t>(1000, 4000)
                                   : *uniform<std::int64_t>(1, max_k);
  if (mix == operand_mix::long_k) { // keep the product count of a case near the others'
    r.m = std::min<std::int64_t>(r.m, 2);
    r.n = std::min<std::int64_t>(r.n, 2);
  }
  const auto draw = [&](const emu::target& t, std::int64_t count) {
    const rc::Gen<std::uint32_t> g =
        mix == operand_mix::spread ? extreme_codes(t) : element_codes(t, specials);
    return *rc::gen::container<std::vector<std::uint32_t>>(static_cast<std::size_t>(count), g);
  };
  r.a = draw(ta, r.m * r.k);
  r.b = draw(tb, r.n * r.k);
  if (mix == operand_mix::cancellation && r.k >= 2) {
    const std::int64_t h = r.k / 2;
    for (std::int64_t i = 0; i < r.m; ++i)
      for (std::int64_t j = 0; j < h; ++j) {
        std::uint32_t& src = r.a[static_cast<std::size_t>(i * r.k + j)];
        if (ta.is_int && src == 0x80u)
          src = 0x81u; // -128 has no negation
        r.a[static_cast<std::size_t>(i * r.k + h + j)] = negate_code(ta, src);
      }
    for (std::int64_t i = 0; i < r.n; ++i)
      for (std::int64_t j = 0; j < h; ++j)
        r.b[static_cast<std::size_t>(i * r.k + h + j)] = r.b[static_cast<std::size_t>(i * r.k + j)];
    // A few elements of A redrawn small: what remains of the sum.
    const int redraw = *uniform<int>(0, 3);
    for (int t = 0; t < redraw; ++t) {
      const auto at = *uniform<std::int64_t>(0, r.m * r.k - 1);
      r.a[static_cast<std::size_t>(at)] = *element_codes(ta, false);
    }
  }
  return r;
}

// ---- scales and biases -------------------------------------------------------------------------

// A float32 scale: random significand, exponent in [elo, ehi], random sign when `signs`;
// a quarter are powers of two (which make the epilogue's products exact).
inline rc::Gen<float> scale_values(int elo = -20, int ehi = 20, bool signs = true) {
  return rc::gen::apply(
      [](int e, std::uint32_t man, bool neg, int pow2) {
        const float s =
            std::ldexp(pow2 == 0 ? 1.0f : 1.0f + std::ldexp(static_cast<float>(man), -23), e);
        return neg ? -s : s;
      },
      uniform<int>(elo, ehi), uniform<std::uint32_t>(0, (1u << 23) - 1),
      signs ? coin() : rc::gen::just(false), uniform<int>(0, 3));
}

// How many scales an operand gets: 0 (none), 1 (tensor) or `rows` (per row).
inline std::vector<float> draw_scales(std::int64_t rows, rc::Gen<float> g = scale_values()) {
  const int mode = *uniform<int>(0, 2);
  const std::size_t count = mode == 0 ? 0 : (mode == 1 ? 1 : static_cast<std::size_t>(rows));
  return *rc::gen::container<std::vector<float>>(count, std::move(g));
}

// A bias of N float32 values (or none, a third of the time), random magnitudes around 2^e0.
inline std::vector<float> draw_bias(std::int64_t n, int e0 = 0) {
  if (*uniform<int>(0, 2) == 0)
    return {};
  return *rc::gen::container<std::vector<float>>(static_cast<std::size_t>(n),
                                                 scale_values(e0 - 12, e0 + 12));
}

// Special float32 values for scales and biases.
inline rc::Gen<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return rc::gen::elementOf(std::vector<float>{nan, -nan, inf, -inf, 0.0f, -0.0f, 1.0f, -2.0f});
}

// ---- layer inputs on rounding boundaries
// ----------------------------------------------------------

// The midpoints between consecutive values of a quantization target below its max: k + 1/2 for
// int8 (|k + 1/2| < 127), the midpoints of a floating format's finite grid otherwise; random
// sign.
inline rc::Gen<double> target_midpoints(const emu::target& t) {
  if (t.is_int)
    return rc::gen::map(uniform<int>(-127, 126), [](int k) { return k + 0.5; });
  const emu::format f = t.fmt;
  return rc::gen::apply(
      [f](std::uint32_t c, bool neg) {
        const double m = 0.5 * (emu::decode<double>(f, c) + emu::decode<double>(f, c + 1));
        return neg ? -m : m;
      },
      uniform<std::uint32_t>(0, f.max_code() - 1), coin());
}

// A rows x cols float matrix whose exact quantized values x q* are ties of the target: every
// row holds +-max * s (its absmax, so q* = 1 / s for per-row and per-tensor groups) and
// midpoints * s elsewhere (a few zeros), with s = odd * 2^e: 1 / s is not a float, so
// fl(x fl(q*)) falls on either side of the tie and a kernel's code may be the exact code's
// neighbour. Every value is exact in float32 (s has at most 10 significant bits).
inline std::vector<float> tie_values(std::int64_t rows, std::int64_t cols, const emu::target& t,
                                     int e) {
  const double s = std::ldexp(static_cast<double>(2 * *uniform<int>(1, 511) + 1), e);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t at = *uniform<std::int64_t>(0, cols - 1);
    for (std::int64_t c = 0; c < cols; ++c) {
      double x = 0;
      if (c == at)
        x = (*coin() ? -1 : 1) * t.max_value();
      else if (*uniform<int>(0, 9) != 0)
        x = *target_midpoints(t);
      v[static_cast<std::size_t>(r * cols + c)] = static_cast<float>(x * s);
    }
  }
  return v;
}

// ---- storage -----------------------------------------------------------------------------------

// Codes as the bytes a kernel reads: one byte per 8-bit code, two for 16-bit values.
inline std::vector<unsigned char> code_bytes(const emu::target& t,
                                             const std::vector<std::uint32_t>& codes) {
  const std::size_t w = t.is_int || t.fmt.bits() == 8 ? 1 : 2;
  std::vector<unsigned char> out(codes.size() * w);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    if (w == 1) {
      out[i] = static_cast<unsigned char>(codes[i]);
    } else {
      const auto c = static_cast<std::uint16_t>(codes[i]);
      std::memcpy(out.data() + 2 * i, &c, 2);
    }
  }
  return out;
}

} // namespace lowbit::proptest::test
