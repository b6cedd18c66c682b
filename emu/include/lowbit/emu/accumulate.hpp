// Accumulation models: how a dot product's exact products are summed. A matmul names its model
// the way a cast names its rounding policy, because fp8 tensor cores do not sum in float32 and a
// simulation that sums in float32 tells the wrong story about them. Three kinds:
//   exact            the exact sum (rounded once by the reference; emu cannot compute it),
//   fp32_sequential  acc = acc + p in product order, float32 nearest-even (lowbit's CPU twin),
//   block_fixed_point blocks of k products aligned to the block's largest exponent, rounded to
//                    f fraction bits, summed exactly, written into a float32 register (or one
//                    of fewer significand bits), promoted into a float32 accumulator every N
//                    blocks (tensor-core models).
// The equations are in docs/techniques/fp8-training.md ("The accumulation models"). Everything
// here is host and device code, the standard library only, so a CUDA kernel and the CPU twin run
// the same accumulator.
#pragma once

#include <cstdint>

#include <lowbit/emu/config.hpp>

namespace lowbit::emu {

enum class accumulation_kind : std::uint8_t { fp32_sequential, exact, block_fixed_point };

// How an aligned term (a product, or the register when it takes part in the alignment) is
// rounded to the block's grid of 2^(e_max - f).
enum class term_rounding : std::uint8_t { toward_zero, nearest_even };

// How the block's exact fixed-point sum is written into the float32 register.
enum class register_rounding : std::uint8_t { nearest_even, toward_zero };

// The exponent that places a product on its block's grid: floor(log2 |p|) of the product; or
// the sum of its operands' floor(log2 |x|) (the product's significand then lies in [1, 4): a
// multiplier that adds the exponents and aligns before normalising); or that sum with each
// operand's exponent as its encoding's exponent field reads, where a subnormal operand sits at
// its format's minimum normal exponent with a significand below 1 (the significand product then
// lies in (0, 4)). The operands' forms need accumulator::add(a, b), and of_operand_fields the
// operands' minimum exponents (the accumulator's constructor); add(p) alone uses the product's.
enum class product_exponent : std::uint8_t { of_product, of_operands, of_operand_fields };

struct accumulation {
  accumulation_kind kind = accumulation_kind::fp32_sequential;
  // block_fixed_point only:
  int block = 1;                    // k: products per block (the last block may be shorter)
  int fraction_bits = 23;           // f: bits kept below the block's largest exponent
  bool align_with_register = false; // the register is one of the aligned terms (else added
                                    // after the block sum is rounded into float32)
  term_rounding terms = term_rounding::toward_zero;
  register_rounding reg = register_rounding::nearest_even;
  int promote_every = 0;  // N: blocks between promotions; 0: never ("fast")
  int register_bits = 24; // significand bits the register keeps (float32: 24), rounded by `reg`
  product_exponent exponent = product_exponent::of_product;

  friend constexpr bool operator==(const accumulation&, const accumulation&) = default;
};

// Limits that keep a block's fixed-point sum exact in a double: |S| < (k + 1) 2^(f + 1) <= 2^48
// (2^(f + 2) and 2^49 with product_exponent::of_operands).
inline constexpr int accumulation_max_block = 64;
inline constexpr int accumulation_max_fraction_bits = 40;

inline constexpr accumulation fp32_sequential_accumulation{};
inline constexpr accumulation exact_accumulation{accumulation_kind::exact};

constexpr accumulation block_fixed_point(int k, int f, bool align_with_register, term_rounding t,
                                         register_rounding r, int promote_every) {
  return {accumulation_kind::block_fixed_point, k, f, align_with_register, t, r, promote_every};
}

// The same with a register narrower than float32 and the exponent rule named.
constexpr accumulation block_fixed_point(int k, int f, bool align_with_register, term_rounding t,
                                         register_rounding r, int promote_every, int register_bits,
                                         product_exponent e) {
  return {accumulation_kind::block_fixed_point,
          k,
          f,
          align_with_register,
          t,
          r,
          promote_every,
          register_bits,
          e};
}

// The model fitted to cuBLASLt's fp8 GEMMs on an H200 (CUDA 13.0; docs/techniques/
// fp8-training.md, "Hopper's parameters"): blocks of 32 products aligned by their operands'
// exponent fields and the register's exponent, truncated 13 bits below, the register a 14-bit
// significand truncated toward zero; slow accumulation promotes every 4 blocks (128 products).
// It reproduces the probes (e4m3 x e4m3, K = 256 to 4096, both modes) and a training step's
// matmuls (e4m3 x e4m3 and e5m2 x e4m3, K = 384 to 2048, slow mode) bit for bit.
constexpr accumulation hopper_fp8_accumulation(bool fast_accumulation) {
  return block_fixed_point(32, 13, true, term_rounding::toward_zero, register_rounding::toward_zero,
                           fast_accumulation ? 0 : 4, 14, product_exponent::of_operand_fields);
}

// False for parameters outside the limits above (the accumulator's result is then unspecified).
LOWBIT_HD constexpr bool is_valid(const accumulation& m) {
  if (m.kind != accumulation_kind::block_fixed_point)
    return m.kind == accumulation_kind::fp32_sequential || m.kind == accumulation_kind::exact;
  return m.block >= 1 && m.block <= accumulation_max_block && m.fraction_bits >= 0 &&
         m.fraction_bits <= accumulation_max_fraction_bits && m.promote_every >= 0 &&
         (m.terms == term_rounding::toward_zero || m.terms == term_rounding::nearest_even) &&
         (m.reg == register_rounding::nearest_even || m.reg == register_rounding::toward_zero) &&
         m.register_bits >= 1 && m.register_bits <= 24 &&
         (m.exponent == product_exponent::of_product ||
          m.exponent == product_exponent::of_operands ||
          m.exponent == product_exponent::of_operand_fields);
}

namespace detail {

// 2^n as a double for -1022 <= n <= 1023 (built from bits: exact and constexpr).
LOWBIT_HD constexpr double pow2(int n) {
  return bit_cast<double>(static_cast<std::uint64_t>(n + 1023) << 52);
}

// floor(log2 |x|) of a finite nonzero float32, subnormals included.
LOWBIT_HD constexpr int exponent_of(float x) {
  const std::uint32_t bits = bit_cast<std::uint32_t>(x);
  const int e = static_cast<int>((bits >> 23) & 0xFFu);
  if (e != 0)
    return e - 127;
  std::uint32_t m = bits & 0x7FFFFFu;
  int top = -1;
  while (m != 0) {
    m >>= 1;
    ++top;
  }
  return -149 + top;
}

LOWBIT_HD constexpr bool finite(float x) {
  return ((bit_cast<std::uint32_t>(x) >> 23) & 0xFFu) != 0xFFu;
}

// x rounded to an integer (|x| < 2^52, so the int64 conversion is exact and truncates).
LOWBIT_HD constexpr double round_integer(double x, term_rounding r) {
  const auto i = static_cast<std::int64_t>(x);
  if (r == term_rounding::toward_zero)
    return static_cast<double>(i);
  const double rest = x - static_cast<double>(i); // exact
  const double half = rest < 0 ? -rest : rest;
  const bool up = half > 0.5 || (half == 0.5 && (i & 1) != 0);
  return static_cast<double>(up ? (x < 0 ? i - 1 : i + 1) : i);
}

// The float32 next to the float32 f in the direction of `up` (toward +Inf) or toward -Inf.
LOWBIT_HD constexpr float next_float(float f, bool up) {
  const std::uint32_t b = bit_cast<std::uint32_t>(f);
  if ((b & 0x7FFFFFFFu) == 0)
    return bit_cast<float>(up ? 1u : 0x80000001u);
  return bit_cast<float>((f > 0) == up ? b + 1u : b - 1u);
}

// s + t (exact; |t| at most half an ulp of the double s, t = 0 when s is exact) rounded to
// float32. A double to float conversion rounds s to nearest-even; t matters only where s is a
// tie between two floats (nearest) or s is itself a float (toward zero).
LOWBIT_HD constexpr float to_float(double s, double t, register_rounding r) {
  const float f = static_cast<float>(s);
  const double fd = static_cast<double>(f);
  if (r == register_rounding::nearest_even) {
    if (t != 0 && fd != s && finite(f)) {
      const float other = next_float(f, fd < s);
      const double od = static_cast<double>(other);
      const bool tie = (fd > s ? fd - s : s - fd) == (od > s ? od - s : s - od);
      if (tie && ((od > s) == (t > 0)))
        return other;
    }
    return f;
  }
  if (s == 0)
    return 0.0f;
  if (!finite(f))
    return bit_cast<float>(s < 0 ? 0xFF7FFFFFu : 0x7F7FFFFFu); // the largest finite float
  if ((fd < 0 ? -fd : fd) > (s < 0 ? -s : s))
    return next_float(f, s < 0);
  if (fd == s && t != 0 && ((t < 0) == (s > 0)))
    return next_float(f, s < 0); // s is a float and the exact value lies just inside it
  return f;
}

// floor(log2 |s|) of a nonzero finite double of the models' range (a normal double).
LOWBIT_HD constexpr int exponent_of(double s) {
  return static_cast<int>((bit_cast<std::uint64_t>(s) >> 52) & 0x7FFu) - 1023;
}

// s + t (as in to_float) rounded to a register of `bits` significand bits: the grid is
// 2^(e(s) - bits + 1), or float32's subnormal grid 2^-149 where that is coarser; one rounding.
// For bits = 24 this is to_float. Beyond float32's range: Inf (nearest) or the largest register
// value (toward zero).
LOWBIT_HD constexpr float to_register(double s, double t, int bits, register_rounding r) {
  if (bits >= 24)
    return to_float(s, t, r);
  if (s == 0)
    return static_cast<float>(s);
  const int e = exponent_of(s);
  const bool neg = s < 0;
  if (e > 127)
    return r == register_rounding::nearest_even
               ? bit_cast<float>(neg ? 0xFF800000u : 0x7F800000u)
               : static_cast<float>((neg ? -1.0 : 1.0) * (pow2(bits) - 1) * pow2(128 - bits));
  const int g = e - bits + 1 > -149 ? e - bits + 1 : -149;
  const double x = s * pow2(-g); // exact: |x| < 2^bits
  auto i = static_cast<std::int64_t>(x);
  const double rest = x - static_cast<double>(i); // exact, the sign of s or zero
  const double tail = t * pow2(-g);
  const std::int64_t away = neg ? -1 : 1;
  if (r == register_rounding::toward_zero) {
    if (rest == 0 && tail != 0 && ((tail < 0) == !neg)) {
      // s is on the grid and the exact value lies just inside it: one step down, on the finer
      // grid of the binade below where s is a power of two.
      if (g > -149 && (neg ? -i : i) == (std::int64_t{1} << (bits - 1)))
        return static_cast<float>((neg ? -1.0 : 1.0) * (pow2(bits) - 1) * pow2(g - 1));
      i -= away;
    }
  } else {
    const double half = neg ? -rest : rest;
    const bool inward = tail != 0 && ((tail < 0) == !neg);
    const bool up = half > 0.5 || (half == 0.5 && (tail != 0 ? !inward : (i & 1) != 0));
    if (up)
      i += away;
  }
  const double v = static_cast<double>(i) * pow2(g);
  if ((v < 0 ? -v : v) >= pow2(128))
    return bit_cast<float>(neg ? 0xFF800000u : 0x7F800000u); // rounded up past the range
  return static_cast<float>(v);
}

} // namespace detail

// The streaming form of a model: add(p) for each product in order, then finish(). Products are
// float32 values (the exact products of fp8 and 16-bit operands). NaN and Inf products do not
// enter the blocks: they are summed in float32 on the side and added to the result at the end,
// so NaN in gives NaN out and Inf gives Inf (or NaN for Inf - Inf). `exact` is not computable
// here: finish() returns NaN for it.
class accumulator {
public:
  // min_exponent_a, min_exponent_b: the operand formats' minimum normal exponents (format::emin),
  // read by product_exponent::of_operand_fields only; the defaults are below every float32, so
  // that rule then places products as of_operands does.
  LOWBIT_HD constexpr explicit accumulator(const accumulation& m,
                                           int min_exponent_a = no_min_exponent,
                                           int min_exponent_b = no_min_exponent)
      : m_(m), emin_a_(min_exponent_a), emin_b_(min_exponent_b) {}

  static constexpr int no_min_exponent = -149;

  LOWBIT_HD constexpr void add(float p) {
    add_aligned(p, p != 0.0f && detail::finite(p) ? detail::exponent_of(p) : 0);
  }

  // The product a * b (exact for fp8 and 16-bit operands), placed by the model's exponent rule:
  // with product_exponent::of_operands, by e(a) + e(b); with of_operand_fields, by
  // max(e(a), min_exponent_a) + max(e(b), min_exponent_b).
  LOWBIT_HD constexpr void add(float a, float b) {
    const float p = a * b;
    if (m_.exponent == product_exponent::of_product || p == 0.0f || !detail::finite(p)) {
      add(p);
      return;
    }
    int ea = detail::exponent_of(a), eb = detail::exponent_of(b);
    if (m_.exponent == product_exponent::of_operand_fields) {
      ea = ea > emin_a_ ? ea : emin_a_;
      eb = eb > emin_b_ ? eb : emin_b_;
    }
    add_aligned(p, ea + eb);
  }

  // A fresh accumulator of the same model and operands (the start of a block scale's block).
  LOWBIT_HD constexpr void restart() { *this = accumulator(m_, emin_a_, emin_b_); }

  LOWBIT_HD constexpr float finish() {
    if (m_.kind == accumulation_kind::exact)
      return detail::bit_cast<float>(0x7FC00000u);
    if (m_.kind == accumulation_kind::fp32_sequential)
      return acc_;
    if (count_ > 0)
      flush();
    float r = part_;
    if (m_.promote_every > 0)
      r = since_promotion_ > 0 ? acc_ + part_ : acc_;
    return has_special_ ? special_ + r : r;
  }

private:
  LOWBIT_HD constexpr void add_aligned(float p, int e) {
    if (m_.kind == accumulation_kind::fp32_sequential) {
      acc_ = acc_ + p;
      return;
    }
    if (!detail::finite(p)) {
      special_ = special_ + p;
      has_special_ = true;
      p = 0.0f; // keeps the block's length: the alignment of the others is unchanged
    }
    exp_[count_] = e;
    buf_[count_++] = p;
    if (count_ == m_.block)
      flush();
  }

  LOWBIT_HD constexpr void flush() {
    const int n = count_;
    count_ = 0;
    const bool with_reg = m_.align_with_register && detail::finite(part_);
    bool any = false;
    int e_max = 0;
    for (int i = 0; i < n; ++i)
      if (buf_[i] != 0.0f) {
        const int e = exp_[i];
        e_max = !any || e > e_max ? e : e_max;
        any = true;
      }
    if (with_reg && part_ != 0.0f) {
      const int e = detail::exponent_of(part_);
      e_max = !any || e > e_max ? e : e_max;
      any = true;
    }
    if (any && detail::finite(part_)) {
      const int q = e_max - m_.fraction_bits; // the grid: multiples of 2^q
      const double down = detail::pow2(-q);
      double s = 0; // in units of 2^q; exact: |s| < (k + 1) 2^(f + 2) <= 2^49
      for (int i = 0; i < n; ++i)
        s += detail::round_integer(static_cast<double>(buf_[i]) * down, m_.terms);
      if (with_reg)
        s += detail::round_integer(static_cast<double>(part_) * down, m_.terms);
      const double v = s * detail::pow2(q); // exact (the double range holds every q)
      const float block_sum = detail::to_register(v, 0.0, m_.register_bits, m_.reg);
      if (with_reg) {
        part_ = block_sum;
      } else {
        // The register adds the rounded block sum with its own rounding (TwoSum for the tail).
        const double a = static_cast<double>(part_), b = static_cast<double>(block_sum);
        const double sum = a + b, bb = sum - a, tail = (a - (sum - bb)) + (b - bb);
        part_ = detail::to_register(sum, tail, m_.register_bits, m_.reg);
      }
    }
    if (m_.promote_every > 0 && ++since_promotion_ == m_.promote_every) {
      acc_ = acc_ + part_;
      part_ = 0.0f;
      since_promotion_ = 0;
    }
  }

  accumulation m_;
  int emin_a_, emin_b_;
  float acc_ = 0.0f;  // fp32_sequential's sum, or the promoted float32 accumulator
  float part_ = 0.0f; // the block register
  float special_ = 0.0f;
  bool has_special_ = false;
  int count_ = 0, since_promotion_ = 0;
  float buf_[accumulation_max_block] = {};
  int exp_[accumulation_max_block] = {};
};

// The model's sum of products[0..n) in order.
LOWBIT_HD constexpr float accumulate(const accumulation& m, const float* products, std::int64_t n) {
  accumulator a(m);
  for (std::int64_t i = 0; i < n; ++i)
    a.add(products[i]);
  return a.finish();
}

// The model's sum of the products a[i] b[i], i in [0, n), in order, each placed by its operands
// (what the CPU twin and simt compute; equal to the products' form unless the model takes
// product_exponent::of_operands or of_operand_fields), the operands' minimum exponents as in
// accumulator's constructor.
LOWBIT_HD constexpr float accumulate(const accumulation& m, const float* a, const float* b,
                                     std::int64_t n,
                                     int min_exponent_a = accumulator::no_min_exponent,
                                     int min_exponent_b = accumulator::no_min_exponent) {
  accumulator acc(m, min_exponent_a, min_exponent_b);
  for (std::int64_t i = 0; i < n; ++i)
    acc.add(a[i], b[i]);
  return acc.finish();
}

} // namespace lowbit::emu
