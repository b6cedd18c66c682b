// The operand kinds of the GEMM layer's tests (int8, int8_sym, the fp8 formats, the 16-bit
// formats) and what each is as a quantization target and a storage type: shared by the CPU
// twin's tests and the GPU tests, so that both draw the same operands.
#pragma once

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/kernels/gemm.hpp>

namespace lowbit::proptest::gemm_kinds {

enum class kind { int8, int8_sym, e4m3, e5m2, bf16, f16 };

inline kernels::target target_of(kind k) {
  switch (k) {
  case kind::int8: return kernels::target::of(emu::int8);
  case kind::int8_sym: return kernels::target::of(emu::int8_sym);
  case kind::e4m3: return kernels::target::of(emu::e4m3fn);
  case kind::e5m2: return kernels::target::of(emu::e5m2);
  case kind::bf16: return kernels::target::of(emu::bfloat16);
  case kind::f16: return kernels::target::of(emu::float16);
  }
  return {};
}

inline kernels::dtype dtype_of(kind k) {
  switch (k) {
  case kind::int8:
  case kind::int8_sym: return kernels::dtype::int8;
  case kind::e4m3:
  case kind::e5m2: return kernels::dtype::uint8;
  case kind::bf16: return kernels::dtype::bfloat16;
  case kind::f16: return kernels::dtype::float16;
  }
  return kernels::dtype::uint8;
}

inline bool is_int(kind k) {
  return k == kind::int8 || k == kind::int8_sym;
}

inline bool is_fp8(kind k) {
  return k == kind::e4m3 || k == kind::e5m2;
}

} // namespace lowbit::proptest::gemm_kinds
