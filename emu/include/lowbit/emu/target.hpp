// What a quantized element becomes: a code of a floating-point format or an integer of an
// integer format. Quantization (kernels/quantize) and every technique that stores scaled codes
// take a target; device code reads it by value, so it is a small literal type.
#pragma once

#include <cstdint>

#include <lowbit/emu/config.hpp>
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/dtype.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>

namespace lowbit::emu {

// Exactly one of fmt (is_int false) and ifmt (is_int true) is held: read the other and the
// behaviour is undefined. A default target is e4m3fn, the common fp8 target.
struct target {
  bool is_int = false;
  union {
    format fmt;
    int_format ifmt;
  };

  // e4m3fn spelled out: device code may not bind a reference to the global constant.
  LOWBIT_HD constexpr target() : is_int(false), fmt{4, 3, 7, specials::fn} {}
  LOWBIT_HD constexpr target(const format& f) : is_int(false), fmt(f) {}
  LOWBIT_HD constexpr target(const int_format& f) : is_int(true), ifmt(f) {}
  LOWBIT_HD static constexpr target of(const format& f) { return target(f); }
  LOWBIT_HD static constexpr target of(const int_format& f) { return target(f); }

  friend constexpr bool operator==(const target& a, const target& b) {
    if (a.is_int != b.is_int)
      return false;
    return a.is_int ? a.ifmt == b.ifmt : a.fmt == b.fmt;
  }

  // Largest finite value: the format's max, or the integer max.
  LOWBIT_HD constexpr double max_value() const {
    return is_int ? static_cast<double>(ifmt.max()) : emu::max_value(fmt);
  }
  // Exponent of the largest value (the MX scale rule); 0 for integers (MXINT8).
  LOWBIT_HD constexpr int emax() const { return is_int ? 0 : fmt.emax(); }
  // Storage of one code: uint8/uint16/uint32 for formats (by width; quantization takes formats
  // of up to 16 bits, and a wider one's dtype keeps the messages that refuse it right),
  // int8/uint8 for integers of up to 8 bits (one per byte, two's complement for signed ones).
  LOWBIT_HD constexpr dtype code_dtype() const {
    if (is_int)
      return ifmt.is_signed ? dtype::int8 : dtype::uint8;
    return fmt.bits() <= 8 ? dtype::uint8 : (fmt.bits() <= 16 ? dtype::uint16 : dtype::uint32);
  }
};

static_assert(target(e5m2).max_value() == 57344.0 && target(int8_sym).max_value() == 127.0);
static_assert(target(uint8).code_dtype() == dtype::uint8 && target(float16).emax() == 15);
static_assert(target(int8) != target(e4m3fn) && target() == target(e4m3fn));

} // namespace lowbit::emu
