// The format sweep's formats and claims, shared by the CPU sweep (proptests/src/
// test_format_sweep.cpp) and the GPU sweep (proptests/gpu/gpu_format_sweep_test.cpp): every
// named format, a few user-defined ones chosen to sit at the edges the host API checks (wider
// than 16 bits, values beyond float32, unsigned, without zero), the integer targets, and for
// each public function that takes a format the set of formats its header comment says it
// accepts. A test then holds each function to its claim: refused formats throw lowbit::error,
// accepted formats get every output element written with the right bits.
#pragma once

#include <string>
#include <vector>

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/quantize.hpp>

namespace lowbit::sweep {

struct sweep_format {
  std::string name;
  emu::format fmt;
};

// Spellings of the user-defined formats, each parsed by emu::parse_format (so each is valid).
inline constexpr const char* user_formats[] = {
    "e8m23b0",                   // 32 bits, values up to 2^254: beyond float32
    "e5m11",                     // 17 bits: uint32 codes, values inside float32
    "e6m9",                      // 16 bits, neither float16 nor bfloat16
    "e8m7b150",                  // 16 bits, subnormals below float32's
    "e5m10_unsigned",            // 15 bits, unsigned
    "e4m3_fn_nozero",            // 8 bits, no zero (exponent field 0 is a binade)
    "e8m0b0_fn_unsigned_nozero", // 8 bits, 2^0 .. 2^254: beyond float32
    "e3m1_none_unsigned",        // 4 bits, unsigned, every code finite
    "e1m0_none",                 // 2 bits: +-0, +-1
};

inline std::vector<sweep_format> formats() {
  std::vector<sweep_format> v;
  for (const auto& n : emu::named_formats)
    v.push_back({n.name, n.fmt});
  for (const char* s : user_formats)
    v.push_back({s, emu::parse_format(s)});
  return v;
}

inline std::vector<emu::int_format> int_targets() {
  return {emu::int8,
          emu::int8_sym,
          emu::uint8,
          emu::int4,
          emu::int4_sym,
          emu::uint4,
          emu::int_format{16, true, false},
          emu::int_format{16, false, false}};
}

// Every sweep format and integer target as a quantization target.
inline std::vector<kernels::target> all_targets() {
  std::vector<kernels::target> v;
  for (const auto& f : formats())
    v.push_back(kernels::target::of(f.fmt));
  for (const auto& i : int_targets())
    v.push_back(kernels::target::of(i));
  return v;
}

// The public functions that take a format or a quantization target.
enum class fn {
  cast,                 // kernels::cast
  decode_float32,       // kernels::decode into float32
  decode_float64,       // kernels::decode into float64
  quantize,             // kernels::quantize
  cast_scaled,          // kernels::cast_scaled
  dequantize,           // kernels::dequantize
  quantize_delayed,     // kernels::quantize_delayed
  quantize_mx,          // kernels::quantize_mx
  dequantize_mx,        // kernels::dequantize_mx
  codebook_from_format, // kernels::codebook::from_format (host only)
  verify_codes,         // verify::compare of code arrays of policy.format (host only)
};

inline const char* fn_name(fn f) {
  switch (f) {
  case fn::cast: return "cast";
  case fn::decode_float32: return "decode_float32";
  case fn::decode_float64: return "decode_float64";
  case fn::quantize: return "quantize";
  case fn::cast_scaled: return "cast_scaled";
  case fn::dequantize: return "dequantize";
  case fn::quantize_delayed: return "quantize_delayed";
  case fn::quantize_mx: return "quantize_mx";
  case fn::dequantize_mx: return "dequantize_mx";
  case fn::codebook_from_format: return "codebook_from_format";
  case fn::verify_codes: return "verify_codes";
  }
  return "?";
}

inline constexpr fn kernel_fns[] = {
    fn::cast,       fn::decode_float32,   fn::decode_float64, fn::quantize,     fn::cast_scaled,
    fn::dequantize, fn::quantize_delayed, fn::quantize_mx,    fn::dequantize_mx};
inline constexpr fn target_fns[] = {fn::quantize,         fn::cast_scaled, fn::dequantize,
                                    fn::quantize_delayed, fn::quantize_mx, fn::dequantize_mx};

inline bool is_ocp_mx_element(const emu::format& f) {
  return f == emu::e4m3fn || f == emu::e5m2 || f == emu::e3m2fn || f == emu::e2m3fn ||
         f == emu::e2m1fn;
}

// What each header comment claims for a floating-point format f (valid by construction).
inline bool claims(fn function, const emu::format& f) {
  switch (function) {
  // cast.hpp: codes of any format, "uint8 for formats of up to 8 bits, uint16 up to 16,
  // uint32 beyond".
  case fn::cast: return true;
  // cast.hpp: "out is float32 (formats that fit float) or float64".
  case fn::decode_float32: return f.fits_float();
  case fn::decode_float64: return true;
  // quantize.hpp, struct target: "a code of a floating-point format (that fits float)" with
  // "uint8/uint16 for formats": values inside float32, codes of at most 16 bits.
  case fn::quantize:
  case fn::cast_scaled:
  case fn::dequantize:
  case fn::quantize_delayed: return f.fits_float() && f.bits() <= 16;
  // quantize.hpp, quantize_mx: "Element targets: e4m3fn, e5m2 (MXFP8), e3m2fn, e2m3fn (MXFP6),
  // e2m1fn (MXFP4), int8 (MXINT8)"; others are refused.
  case fn::quantize_mx:
  case fn::dequantize_mx: return is_ocp_mx_element(f);
  // blockwise.hpp, from_format: "a format of at most 8 bits", its values "divided by the
  // largest magnitude (float32 division)": values inside float32.
  case fn::codebook_from_format: return f.bits() <= 8 && f.fits_float();
  // verify.hpp: "uint8/16/32 codes of p.format", any format.
  case fn::verify_codes: return true;
  }
  return false;
}

// The same for an integer target (only the functions that take a target).
inline bool claims(fn function, const emu::int_format& f) {
  switch (function) {
  // quantize.hpp, struct target: integer codes are "int8/uint8 for integers (one per byte)".
  case fn::quantize:
  case fn::cast_scaled:
  case fn::dequantize:
  case fn::quantize_delayed: return f.bits <= 8;
  // quantize.hpp, quantize_mx: the integer element is int8 (MXINT8).
  case fn::quantize_mx:
  case fn::dequantize_mx: return f == emu::int8;
  default: return false;
  }
}

inline std::string target_name(const kernels::target& t) {
  return t.is_int ? emu::int_format_name(t.ifmt) : emu::format_name(t.fmt);
}

inline bool claims(fn function, const kernels::target& t) {
  return t.is_int ? claims(function, t.ifmt) : claims(function, t.fmt);
}

} // namespace lowbit::sweep
