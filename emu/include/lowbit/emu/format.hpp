// Number formats as literal values.
//
// A format is a small aggregate (exponent bits, mantissa bits, bias, how NaN/Inf are encoded,
// signedness, whether exponent field 0 holds zero and subnormals). It is a structural type, so it
// can be a template argument (fp<e4m3fn>) and a run-time value (the Python module) alike; every
// routine in emu takes it by value and folds to constants when it is known at compile time.
#pragma once

#include <cstdint>
#include <type_traits>

#include <lowbit/emu/config.hpp>

namespace lowbit::emu {

// How a format spends its codes on non-finite values.
enum class specials : std::uint8_t {
  ieee, // exponent all ones: Inf (mantissa 0) and NaNs (mantissa != 0); +0 and -0 (IEEE 754)
  fn,   // no Inf; one NaN per sign where exponent and mantissa are all ones (OCP E4M3, E8M0)
  fnuz, // no Inf, no -0; the single NaN takes the code of -0, sign bit alone (e4m3fnuz)
  none, // every code is a finite number (OCP FP6 and FP4)
};

struct format {
  int exp_bits = 0;
  int man_bits = 0;
  int bias = 0;
  specials special = specials::ieee;
  bool is_signed = true;
  // false: exponent field 0 is an ordinary binade, so there is no zero and no subnormal (E8M0).
  bool has_zero = true;

  friend constexpr bool operator==(const format&, const format&) = default;

  LOWBIT_HD constexpr int bits() const { return (is_signed ? 1 : 0) + exp_bits + man_bits; }
  LOWBIT_HD constexpr std::uint32_t man_mask() const { return (1u << man_bits) - 1u; }
  LOWBIT_HD constexpr std::uint32_t mag_mask() const {
    return static_cast<std::uint32_t>((std::uint64_t{1} << (exp_bits + man_bits)) - 1u);
  }
  LOWBIT_HD constexpr std::uint32_t sign_mask() const {
    return is_signed ? static_cast<std::uint32_t>(std::uint64_t{1} << (exp_bits + man_bits)) : 0u;
  }
  // Largest code (magnitude bits) that encodes a finite value.
  LOWBIT_HD constexpr std::uint32_t max_code() const {
    switch (special) {
    case specials::ieee: return mag_mask() - (1u << man_bits);
    case specials::fn: return mag_mask() - 1u;
    default: return mag_mask();
    }
  }
  // Exponent (unbiased) of the lowest binade with an implicit leading one.
  LOWBIT_HD constexpr int emin() const { return (has_zero ? 1 : 0) - bias; }
  // Exponent of the largest finite value.
  LOWBIT_HD constexpr int emax() const { return static_cast<int>(max_code() >> man_bits) - bias; }
  LOWBIT_HD constexpr bool has_inf() const { return special == specials::ieee; }
  LOWBIT_HD constexpr bool has_nan() const { return special != specials::none; }
  LOWBIT_HD constexpr bool has_negative_zero() const {
    return is_signed && has_zero && special != specials::fnuz;
  }
  LOWBIT_HD constexpr bool has_subnormals() const { return has_zero && man_bits > 0; }
  // Code of the smallest positive value (the smallest subnormal, or the smallest normal).
  LOWBIT_HD constexpr std::uint32_t min_positive_code() const { return has_zero ? 1u : 0u; }
  // Code of the smallest positive normal value.
  LOWBIT_HD constexpr std::uint32_t min_normal_code() const {
    return has_zero ? (1u << man_bits) : 0u;
  }
  // Every value decodes exactly into float (otherwise only into double).
  LOWBIT_HD constexpr bool fits_float() const { return emax() <= 127 && emin() - man_bits >= -149; }
};

// nullptr when f describes a usable format, else why not. Limits: exponent 1..8 bits, mantissa
// 0..23 bits (so every value and every midpoint is exact in double, and double arithmetic on
// two values rounds innocuously), at least one normal binade, values inside double's range.
constexpr const char* check_format(const format& f) {
  // First, so that emin() and emax() below cannot overflow int.
  if (f.bias < -(1 << 20) || f.bias > (1 << 20))
    return "the bias must lie in -2^20..2^20 (the exponent range must lie inside double's)";
  if (static_cast<int>(f.special) > static_cast<int>(specials::none))
    return "specials is not one of ieee, fn, fnuz, none";
  if (f.exp_bits < 1 || f.exp_bits > 8)
    return "exponent bits must be in 1..8";
  if (f.man_bits < 0 || f.man_bits > 23)
    return "mantissa bits must be in 0..23";
  if (f.special == specials::ieee && f.man_bits == 0)
    return "an IEEE-style format needs at least one mantissa bit to encode NaN";
  if (f.special == specials::fnuz && !f.is_signed)
    return "fnuz puts its NaN at the negative-zero code, so it must be signed";
  if (f.special == specials::fnuz && !f.has_zero)
    return "fnuz puts its NaN at the negative-zero code, so it must have a zero";
  if (f.special == specials::fn && f.max_code() < f.min_normal_code())
    return "the format has no finite normal value";
  if (f.max_code() < f.min_normal_code() || f.emax() < f.emin())
    return "the format has no normal binade";
  if (f.emax() > 1023 || f.emin() < -1022)
    return "the format's exponent range must lie inside double's normal range";
  return nullptr;
}
constexpr bool is_valid(const format& f) {
  return check_format(f) == nullptr;
}

// clang-format off
inline constexpr format e4m3fn      {4, 3, 7, specials::fn};
inline constexpr format e5m2        {5, 2, 15, specials::ieee};
inline constexpr format e4m3fnuz    {4, 3, 8, specials::fnuz};
inline constexpr format e5m2fnuz    {5, 2, 16, specials::fnuz};
inline constexpr format e4m3b11fnuz {4, 3, 11, specials::fnuz};
inline constexpr format e4m3        {4, 3, 7, specials::ieee};
inline constexpr format e3m4        {3, 4, 3, specials::ieee};
inline constexpr format e8m0fnu     {8, 0, 127, specials::fn, /*is_signed=*/false, /*has_zero=*/false};
inline constexpr format e3m2fn      {3, 2, 3, specials::none};
inline constexpr format e2m3fn      {2, 3, 1, specials::none};
inline constexpr format e2m1fn      {2, 1, 1, specials::none};
inline constexpr format float16     {5, 10, 15, specials::ieee};
inline constexpr format bfloat16    {8, 7, 127, specials::ieee};
inline constexpr format tfloat32    {8, 10, 127, specials::ieee};
inline constexpr format float32     {8, 23, 127, specials::ieee};
// clang-format on

static_assert(is_valid(e4m3fn) && is_valid(e5m2) && is_valid(e4m3fnuz) && is_valid(e5m2fnuz));
static_assert(is_valid(e8m0fnu) && is_valid(e3m2fn) && is_valid(e2m3fn) && is_valid(e2m1fn));
static_assert(is_valid(float16) && is_valid(bfloat16) && is_valid(float32));
static_assert(e4m3fn.max_code() == 0x7E && e5m2.max_code() == 0x7B && e8m0fnu.max_code() == 0xFE);

namespace detail {
// The narrowest unsigned type that holds a code of `Bits` bits.
template <int Bits>
using code_storage =
    std::conditional_t<(Bits <= 8), std::uint8_t,
                       std::conditional_t<(Bits <= 16), std::uint16_t, std::uint32_t>>;
} // namespace detail

struct named_format {
  const char* name;
  format fmt;
  const char* spec; // where the format is defined
};

inline constexpr named_format named_formats[] = {
    {"e4m3fn", e4m3fn, "OCP 8-bit FP (OFP8) v1.0, E4M3"},
    {"e5m2", e5m2, "OCP 8-bit FP (OFP8) v1.0, E5M2"},
    {"e4m3fnuz", e4m3fnuz, "Graphcore/AMD FP8 proposal (bias 8), ml_dtypes float8_e4m3fnuz"},
    {"e5m2fnuz", e5m2fnuz, "Graphcore/AMD FP8 proposal (bias 16), ml_dtypes float8_e5m2fnuz"},
    {"e4m3b11fnuz", e4m3b11fnuz, "ml_dtypes float8_e4m3b11fnuz (bias 11)"},
    {"e4m3", e4m3, "IEEE 754-style E4M3 (ml_dtypes float8_e4m3)"},
    {"e3m4", e3m4, "IEEE 754-style E3M4 (ml_dtypes float8_e3m4)"},
    {"e8m0fnu", e8m0fnu, "OCP Microscaling (MX) v1.0, E8M0 scale"},
    {"e3m2fn", e3m2fn, "OCP Microscaling (MX) v1.0, FP6 E3M2"},
    {"e2m3fn", e2m3fn, "OCP Microscaling (MX) v1.0, FP6 E2M3"},
    {"e2m1fn", e2m1fn, "OCP Microscaling (MX) v1.0, FP4 E2M1"},
    {"float16", float16, "IEEE 754 binary16"},
    {"bfloat16", bfloat16, "bfloat16 (truncated binary32)"},
    {"tfloat32", tfloat32, "NVIDIA TensorFloat-32 (19 bits)"},
    {"float32", float32, "IEEE 754 binary32"},
};

} // namespace lowbit::emu
