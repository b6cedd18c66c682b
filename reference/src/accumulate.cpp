// The accumulation models over rationals: every step of docs/techniques/fp8-training.md taken
// literally, each rounding to float32 done by reference::round.
#include <lowbit/emu/error.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/reference/accumulate.hpp>
#include <lowbit/reference/round.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace lowbit::reference {

namespace {

// 2^e exactly (the double range holds every grid of the models).
rational pow2(int e) {
  return exact(std::ldexp(1.0, e));
}

// floor(log2 |x|) of a finite nonzero float32 (a normal double, so ilogb is exact).
int exponent(float x) {
  return std::ilogb(static_cast<double>(x));
}

using integer = boost::multiprecision::cpp_int;

// x rounded to an integer: toward zero, or to nearest with ties to even.
integer to_integer(const rational& x, emu::term_rounding r) {
  const integer t = numerator(x) / denominator(x); // truncates toward zero
  if (r == emu::term_rounding::toward_zero)
    return t;
  const rational rest = abs(x - rational(t));
  const bool up = rest > rational(1, 2) || (rest == rational(1, 2) && (t % 2 != 0));
  if (!up)
    return t;
  return x < 0 ? integer(t - 1) : integer(t + 1);
}

float to_float(const rational& x, emu::register_rounding r) {
  emu::policy p;
  if (r == emu::register_rounding::toward_zero) {
    p.round = emu::rounding::toward_zero;
    p.over = emu::overflow::saturate;
  }
  return std::bit_cast<float>(round(emu::float32, x, false, p));
}

// x rounded to a register of `bits` significand bits (bits < 24): the grid 2^(e(x) - bits + 1)
// or 2^-149 where coarser; beyond float32's range Inf (nearest) or the largest register value.
float to_register(const rational& x, int bits, emu::register_rounding r) {
  if (bits >= 24)
    return to_float(x, r);
  if (x == 0)
    return 0.0f;
  int e = 0; // floor(log2 |x|) by comparison with powers of two
  const rational ax = abs(x);
  while (ax >= pow2(e + 1))
    ++e;
  while (ax < pow2(e))
    --e;
  const bool neg = x < 0;
  const rational top = (pow2(bits) - rational(1)) * pow2(128 - bits);
  if (e > 127)
    return r == emu::register_rounding::nearest_even ? (neg ? -INFINITY : INFINITY)
                                                     : to_float(neg ? -top : top, r);
  const rational g = pow2(std::max(e - bits + 1, -149));
  const rational v = rational(to_integer(x / g, r == emu::register_rounding::toward_zero
                                                    ? emu::term_rounding::toward_zero
                                                    : emu::term_rounding::nearest_even)) *
                     g;
  if (abs(v) >= pow2(128))
    return neg ? -INFINITY : INFINITY;
  return to_float(v, r); // exact: v has at most `bits` significant bits
}

float nearest(const rational& x) {
  return to_float(x, emu::register_rounding::nearest_even);
}

rational value(float x) {
  return exact(static_cast<double>(x));
}

// The definition with each product's grid exponent given (the product's or its operands').
float evaluate(const emu::accumulation& m, const std::vector<float>& products,
               const std::vector<int>& exponents) {
  require(emu::is_valid(m), errc::invalid_argument, "model: not a valid accumulation model");
  require(m.kind != emu::accumulation_kind::exact, errc::invalid_argument,
          "model: exact has no float32 evaluation here (exact_scaled_matmul rounds the exact sum)");
  // Non-finite products: the side sum of the definition, in float32 order.
  float special = 0.0f;
  bool has_special = false;
  if (m.kind == emu::accumulation_kind::fp32_sequential) {
    float acc = 0.0f;
    for (const float p : products) {
      if (!std::isfinite(p) || !std::isfinite(acc)) {
        acc = acc + p; // IEEE specials: the float operation is the definition
        continue;
      }
      acc = nearest(value(acc) + value(p));
    }
    return acc;
  }
  float r = 0.0f, a = 0.0f;
  int since = 0;
  const std::size_t k = static_cast<std::size_t>(m.block);
  for (std::size_t b0 = 0; b0 < products.size(); b0 += k) {
    std::vector<float> terms;
    std::vector<int> term_exponents;
    for (std::size_t i = b0; i < products.size() && i < b0 + k; ++i) {
      if (!std::isfinite(products[i])) {
        special = special + products[i];
        has_special = true;
        continue;
      }
      terms.push_back(products[i]);
      term_exponents.push_back(exponents[i]);
    }
    if (std::isfinite(r)) {
      const bool with_reg = m.align_with_register;
      bool any = false;
      int e_max = 0;
      for (std::size_t i = 0; i < terms.size(); ++i)
        if (terms[i] != 0.0f) {
          e_max = any ? std::max(e_max, term_exponents[i]) : term_exponents[i];
          any = true;
        }
      if (with_reg && r != 0.0f) {
        e_max = any ? std::max(e_max, exponent(r)) : exponent(r);
        any = true;
      }
      if (any) {
        const rational q = pow2(e_max - m.fraction_bits);
        if (with_reg)
          terms.push_back(r);
        rational v(0);
        for (const float t : terms)
          v += rational(to_integer(value(t) / q, m.terms)) * q;
        const float block_sum = to_register(v, m.register_bits, m.reg);
        if (with_reg)
          r = block_sum;
        else if (std::isfinite(block_sum))
          r = to_register(value(r) + value(block_sum), m.register_bits, m.reg);
        else
          r = r + block_sum;
      }
    }
    if (m.promote_every > 0 && ++since == m.promote_every) {
      a = std::isfinite(a) && std::isfinite(r) ? nearest(value(a) + value(r)) : a + r;
      r = 0.0f;
      since = 0;
    }
  }
  float result = r;
  if (m.promote_every > 0)
    result = since > 0
                 ? (std::isfinite(a) && std::isfinite(r) ? nearest(value(a) + value(r)) : a + r)
                 : a;
  return has_special ? special + result : result;
}

} // namespace

float accumulate_exactly(const emu::accumulation& m, const std::vector<float>& products) {
  std::vector<int> e(products.size(), 0);
  for (std::size_t i = 0; i < products.size(); ++i)
    if (products[i] != 0.0f && std::isfinite(products[i]))
      e[i] = exponent(products[i]);
  return evaluate(m, products, e);
}

float accumulate_exactly(const emu::accumulation& m, const std::vector<float>& a,
                         const std::vector<float>& b, int min_exponent_a, int min_exponent_b) {
  require(a.size() == b.size(), errc::invalid_argument, "a, b: not of the same length");
  std::vector<float> p(a.size());
  std::vector<int> e(a.size(), 0);
  for (std::size_t i = 0; i < a.size(); ++i) {
    p[i] = a[i] * b[i];
    if (p[i] == 0.0f || !std::isfinite(p[i]))
      continue;
    require(value(p[i]) == value(a[i]) * value(b[i]), errc::invalid_argument,
            "a, b: a product is not exact in float32");
    if (m.exponent == emu::product_exponent::of_product) {
      e[i] = exponent(p[i]);
    } else if (m.exponent == emu::product_exponent::of_operands) {
      e[i] = exponent(a[i]) + exponent(b[i]);
    } else {
      e[i] = std::max(exponent(a[i]), min_exponent_a) + std::max(exponent(b[i]), min_exponent_b);
    }
  }
  return evaluate(m, p, e);
}

} // namespace lowbit::reference
