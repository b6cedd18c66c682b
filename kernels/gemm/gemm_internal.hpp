// The checked form of a scaled matmul, shared by the host API (gemm.cpp, which validates), the
// CPU twin (gemm_cpu.cpp) and the CUDA backends (gemm.cu: simt, widening, the unfused epilogue;
// gemm_cublaslt.cpp; gemm_cutlass_sm90.cu). Everything here has passed validation.
#pragma once

#include <cstdint>
#include <string>

#include <lowbit/emu/accumulate.hpp>
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/kernels/gemm.hpp>

#include "../common/element_ops.hpp"
#include "../common/matrix.hpp"

namespace lowbit::kernels {

// The element type of an operand, as the backends dispatch on it.
enum class gemm_elem : std::uint8_t { int8, e4m3, e5m2, bf16, f16 };

// How an operand's scales are read (blocks: gemm_side's block fields; only the CPU twin and
// simt read them, through gemm_block_scale).
enum class scale_mode : std::uint8_t { none, tensor, rows, blocks };

struct gemm_side {
  const void* codes = nullptr;
  std::int64_t rows = 0;       // M for A, N for B
  std::int64_t row_stride = 0; // elements between rows (>= K)
  gemm_elem elem = gemm_elem::int8;
  const float* scales = nullptr; // null when mode is none or blocks
  scale_mode mode = scale_mode::none;
  // mode blocks: [ceil(rows / block_rows), scale_cols] scales, row-major, float32 or E8M0 codes.
  const void* block_scales = nullptr;
  std::int64_t block_rows = 1;
  std::int64_t scale_cols = 1;
  bool e8m0 = false;
};

struct gemm_problem {
  gemm_side a, b;
  std::int64_t m = 0, n = 0, k = 0;
  const void* bias = nullptr; // null for none
  dtype bias_type = dtype::float32;
  void* out = nullptr;
  dtype out_type = dtype::float32;
  std::int64_t out_stride = 0; // elements between rows of out (>= N)
  device dev{};
  // fp8 and 16-bit operands: the sum over k = 0, 1, ..., K-1 (fp32_sequential unless the caller
  // named a model; only the twin and simt read it).
  emu::accumulation accumulation{};
  // K block length of block scales (gemm.hpp's blocked rule); 0: no K blocks.
  std::int64_t kblock = 0;
  // gemm_options::fast_accumulation (fp8 on cuBLASLt only).
  bool fast_accumulation = false;
};

// K up to which an int32 sum of int8 products is exact whatever the codes: floor((2^31 - 1) /
// 128^2). int8_sym operands take the same limit: their codes are never -128 when lowbit makes
// them, but codes from elsewhere may be, and a larger K would then overflow silently.
inline constexpr std::int64_t gemm_int8_k_limit = 131071;
static_assert(gemm_int8_k_limit * 128 * 128 <= 2147483647LL &&
              (gemm_int8_k_limit + 1) * 128 * 128 > 2147483647LL);

// The exact float32 value of one element of an fp8 or 16-bit operand (the int8 path sums
// integers and never calls this).
LOWBIT_HD inline float gemm_value(gemm_elem e, const void* codes, std::int64_t i) {
  switch (e) {
  case gemm_elem::e4m3: {
    constexpr emu::format f = emu::e4m3fn; // a local copy: device code cannot bind the global
    return emu::decode<float>(f, static_cast<const std::uint8_t*>(codes)[i]);
  }
  case gemm_elem::e5m2: {
    constexpr emu::format f = emu::e5m2;
    return emu::decode<float>(f, static_cast<const std::uint8_t*>(codes)[i]);
  }
  case gemm_elem::bf16:
    return element_ops::load(element_ops::bf16_bits{static_cast<const std::uint16_t*>(codes)[i]});
  case gemm_elem::f16:
    return element_ops::load(element_ops::f16_bits{static_cast<const std::uint16_t*>(codes)[i]});
  case gemm_elem::int8: return static_cast<float>(static_cast<const std::int8_t*>(codes)[i]);
  }
  return 0.0f;
}

// The operand format's minimum normal exponent (emu::format::emin), as an accumulation model
// that places subnormal operands by their exponent field reads it (emu::accumulator).
LOWBIT_HD constexpr int gemm_min_exponent(gemm_elem e) {
  constexpr emu::format e4m3 = emu::e4m3fn, e5m2 = emu::e5m2, bf16 = emu::bfloat16,
                        f16 = emu::float16; // local copies: device code cannot bind the globals
  switch (e) {
  case gemm_elem::e4m3: return e4m3.emin();
  case gemm_elem::e5m2: return e5m2.emin();
  case gemm_elem::bf16: return bf16.emin();
  case gemm_elem::f16: return f16.emin();
  case gemm_elem::int8: break;
  }
  return emu::accumulator::no_min_exponent;
}

// A fresh accumulator of p's model for p's operand formats.
LOWBIT_HD inline emu::accumulator gemm_accumulator(const gemm_problem& p) {
  return emu::accumulator(p.accumulation, gemm_min_exponent(p.a.elem), gemm_min_exponent(p.b.elem));
}

// An operand's scale for one of its rows (1 without scales).
LOWBIT_HD inline float gemm_scale(const float* scales, scale_mode mode, std::int64_t row) {
  return mode == scale_mode::none ? 1.0f : scales[mode == scale_mode::rows ? row : 0];
}

// The value of an E8M0 scale code: 2^(code - 127) (code 0 is 2^-127, a float32 subnormal),
// 0xFF NaN.
LOWBIT_HD inline float gemm_e8m0(std::uint8_t code) {
  if (code == 0xFFu)
    return emu::detail::bit_cast<float>(0x7FC00000u);
  if (code == 0)
    return emu::detail::bit_cast<float>(0x00400000u);
  return emu::detail::bit_cast<float>(static_cast<std::uint32_t>(code) << 23);
}

// An operand's scale for row `row` and K block j: its block scale, or gemm_scale's for an
// operand without block scales.
LOWBIT_HD inline float gemm_block_scale(const gemm_side& s, std::int64_t row, std::int64_t j) {
  if (s.mode != scale_mode::blocks)
    return gemm_scale(s.scales, s.mode, row);
  const std::int64_t i = (row / s.block_rows) * s.scale_cols + j;
  return s.e8m0 ? gemm_e8m0(static_cast<const std::uint8_t*>(s.block_scales)[i])
                : static_cast<const float*>(s.block_scales)[i];
}

// The blocked rule's float32 sum of scaled block terms, the first term as the start; each term
// scaled in the per-row order of gemm_epilogue, B's scale first.
struct gemm_block_total {
  float total = 0.0f;
  bool any = false;
  LOWBIT_HD void add(float acc, float sa, float sb) {
    float t = acc * sb;
    t = t * sa;
    total = any ? total + t : t;
    any = true;
  }
};

// bias[n] as float32 (0 without bias); bias is float32, bfloat16 or float16.
LOWBIT_HD inline float gemm_bias(const void* bias, dtype t, std::int64_t n) {
  if (bias == nullptr)
    return 0.0f;
  if (t == dtype::bfloat16)
    return element_ops::load(element_ops::bf16_bits{static_cast<const std::uint16_t*>(bias)[n]});
  if (t == dtype::float16)
    return element_ops::load(element_ops::f16_bits{static_cast<const std::uint16_t*>(bias)[n]});
  return static_cast<const float*>(bias)[n];
}

// Writes v to out[i] rounded to out's dtype, nearest-even (overflow is Inf). Every NaN is
// written as the positive quiet NaN (float32 0x7FC00000, bfloat16 0x7FC0, float16 0x7E00): the
// sign and payload of a NaN that float arithmetic makes differ between CPUs and GPUs, and the
// backends must agree bit for bit.
LOWBIT_HD inline void gemm_store(void* out, dtype t, std::int64_t i, float v) {
  const bool nan = !(v == v);
  if (t == dtype::bfloat16) {
    constexpr emu::format f = emu::bfloat16;
    static_cast<std::uint16_t*>(out)[i] =
        nan ? std::uint16_t{0x7FC0} : static_cast<std::uint16_t>(emu::encode(f, v, emu::policy{}));
  } else if (t == dtype::float16) {
    constexpr emu::format f = emu::float16;
    static_cast<std::uint16_t*>(out)[i] =
        nan ? std::uint16_t{0x7E00} : static_cast<std::uint16_t>(emu::encode(f, v, emu::policy{}));
  } else {
    static_cast<float*>(out)[i] = nan ? emu::detail::bit_cast<float>(0x7FC00000u) : v;
  }
}

// True where neither operand has per-row scales (each has one per tensor or none): the
// epilogue then multiplies the scales together first.
LOWBIT_HD inline bool gemm_scalar_scales(const gemm_problem& p) {
  return p.a.mode != scale_mode::rows && p.b.mode != scale_mode::rows;
}

// The epilogue of docs/techniques/gemm.md, one element: every backend computes exactly this
// (host and device; the build has no FMA contraction: --fmad=false, -ffp-contract=off). It is
// the order of cuBLASLt's fp8 epilogue on the H200 (bench/probes/fp8_layer_replay.py): scalar
// scales as one factor acc * (sa * sb), per-row scales B's first, (acc * sb) * sa; then + bias.
LOWBIT_HD inline float gemm_epilogue(float acc, float sa, float sb, float bias, bool scalar) {
  float v;
  if (scalar) {
    const float s = sa * sb;
    v = acc * s;
  } else {
    v = acc * sb;
    v = v * sa;
  }
  return v + bias;
}

// One whole output element of the rule from its accumulator: the epilogue with its row's and
// column's scales and bias, then the rounding to out's dtype.
LOWBIT_HD inline void gemm_finish(const gemm_problem& p, std::int64_t m, std::int64_t n,
                                  float acc) {
  const float v =
      gemm_epilogue(acc, gemm_scale(p.a.scales, p.a.mode, m), gemm_scale(p.b.scales, p.b.mode, n),
                    gemm_bias(p.bias, p.bias_type, n), gemm_scalar_scales(p));
  gemm_store(p.out, p.out_type, m * p.out_stride + n, v);
}

// K = 0 (the header's empty problem): out = round(bias), or +0 without bias; no scale is read.
LOWBIT_HD inline void gemm_empty_k(const gemm_problem& p, std::int64_t m, std::int64_t n) {
  gemm_store(p.out, p.out_type, m * p.out_stride + n, gemm_bias(p.bias, p.bias_type, n));
}

// One output of the blocked rule from its block total: T + bias, rounded to out's dtype.
LOWBIT_HD inline void gemm_finish_blocks(const gemm_problem& p, std::int64_t m, std::int64_t n,
                                         float total) {
  const float v = total + gemm_bias(p.bias, p.bias_type, n);
  gemm_store(p.out, p.out_type, m * p.out_stride + n, v);
}

inline bool gemm_is_fp8(gemm_elem e) {
  return e == gemm_elem::e4m3 || e == gemm_elem::e5m2;
}
inline bool gemm_is_16bit(gemm_elem e) {
  return e == gemm_elem::bf16 || e == gemm_elem::f16;
}
inline std::size_t gemm_elem_size(gemm_elem e) {
  return gemm_is_16bit(e) ? 2 : 1;
}

// ---- the float32 form of the register-aligned block models over fp8 operands -----------------
//
// simt's model kernel (gemm_model.cu) and the CPU twin compute the register-aligned
// block_fixed_point models over fp8 x fp8 operands in float32 with these functions, instead of
// emu::accumulator's doubles (the bits are the same; docs/techniques/fp8-training.md, "The model
// in float32"). Per block of k products: e_max from the largest key product (gemm_model_key) and
// the register's power of two; each term a b rounded to the grid 2^q, q = e_max - f (the kernel by
// a fused multiply-add with M = 2^(q + 23), gemm_model_big; the twin by scaling with 2^-q); the
// terms' float32 sum, exact (they are multiples of 2^q below 2^(q + 24) in all); the register
// that sum rounded by gemm_model_register.

// The model's parameters as the two loops read them.
struct gemm_model_args {
  int block = 1;          // k, a divisor of 32
  int fraction_bits = 0;  // f
  int promote_every = 0;  // N
  int register_shift = 0; // 24 - register_bits: the float32 bits the register drops
  bool register_nearest = false;
  bool nearest_terms = false;
  std::uint32_t m_offset = 0; // (23 - f) << 23: from 2^e_max's float32 bits to M's
};

// Where the float32 form applies: fp8 x fp8, a register-aligned block model whose k divides 32
// and whose terms and register sum below 2^(q + 24) ((k + 1) 2^(f + 2) <= 2^24), block scales'
// K block a multiple of k, K > 0.
inline bool gemm_model_takes(const gemm_problem& p) {
  const emu::accumulation& m = p.accumulation;
  if (m.kind != emu::accumulation_kind::block_fixed_point || !m.align_with_register ||
      !emu::is_valid(m))
    return false;
  if (!(p.a.elem == gemm_elem::e4m3 || p.a.elem == gemm_elem::e5m2) ||
      !(p.b.elem == gemm_elem::e4m3 || p.b.elem == gemm_elem::e5m2) || p.k == 0)
    return false;
  if (32 % m.block != 0 || (std::int64_t{m.block} + 1) << (m.fraction_bits + 2) > (1 << 24))
    return false;
  return p.kblock == 0 || p.kblock % m.block == 0;
}

inline gemm_model_args gemm_model_args_of(const emu::accumulation& m) {
  gemm_model_args a;
  a.block = m.block;
  a.fraction_bits = m.fraction_bits;
  a.promote_every = m.promote_every;
  a.register_shift = 24 - m.register_bits;
  a.register_nearest = m.reg == emu::register_rounding::nearest_even;
  a.nearest_terms = m.terms == emu::term_rounding::nearest_even;
  a.m_offset = static_cast<std::uint32_t>(23 - m.fraction_bits) << 23;
  return a;
}

// An operand value's key: the largest product of two keys (the register's power of two among
// them) has e_max as its exponent. 2^e(v) by the exponent rule (the exponent field's, a
// subnormal at the format's minimum emin, for of_operand_fields), |v| for of_product; 0 for 0;
// -1 for NaN and Inf, which the float32 form does not sum.
LOWBIT_HD inline float gemm_model_key(float v, int emin, emu::product_exponent rule) {
  if (v == 0.0f)
    return 0.0f;
  if (!(v - v == 0.0f))
    return -1.0f;
  if (rule == emu::product_exponent::of_product)
    return v < 0.0f ? -v : v;
  int e = static_cast<int>((emu::detail::bit_cast<std::uint32_t>(v) >> 23) & 0xFFu) - 127;
  if (rule == emu::product_exponent::of_operand_fields && e < emin)
    e = emin; // fp8 values are normal float32 values: the field is the exponent
  return emu::detail::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
}

// The float32 bits of M's magnitude, from the block's largest key product (or the register's
// power of two): 2^(e_max - f + 23).
LOWBIT_HD inline std::uint32_t gemm_model_big(float max_key, const gemm_model_args& a) {
  return (emu::detail::bit_cast<std::uint32_t>(max_key) & 0x7F800000u) + a.m_offset;
}

// The block's sum (a float32 multiple of 2^q, or 0) written into the register of 24 - shift
// significant bits: its low bits cleared (toward zero) or rounded to nearest even.
LOWBIT_HD inline float gemm_model_register(float v, const gemm_model_args& a) {
  if (a.register_shift == 0)
    return v;
  std::uint32_t u = emu::detail::bit_cast<std::uint32_t>(v);
  const std::uint32_t drop = (1u << a.register_shift) - 1u;
  if (a.register_nearest) {
    // The kept significand's last bit: a stored bit, or the implicit leading 1 of a 1-bit
    // register (v normal).
    const std::uint32_t odd = a.register_shift == 23 ? 1u : (u >> a.register_shift) & 1u;
    u += (drop >> 1) + odd;
  }
  return emu::detail::bit_cast<float>(u & ~drop);
}

namespace cpu {
// acc: exact int32 for int8; float32 for the others, summed over k = 0, 1, ..., K-1 in order
// (acc = acc + a*b, each product exact in float32 for fp8 and each step rounded: the simt order),
// or p.accumulation's model over the same products in the same order.
void scaled_matmul(const gemm_problem& p, const exec& ex);
} // namespace cpu

namespace cuda {
// Device capability the backends need (major * 10 + minor of the current device).
int compute_capability();

void simt_matmul(const gemm_problem& p, const exec& ex);

// simt's model kernel (gemm_model.cu), where model_kernel_takes (gemm_model_takes and a grid
// of at most 2^31 - 1 tiles): every tile of
// model_tile_m x model_tile_n outputs except those whose operands hold NaN or Inf, which it marks
// in redo[1 + tile] (row-major over its tiles), setting redo[0]; redo is zero on entry. simt_matmul
// then runs the general kernel over the marked tiles.
inline constexpr std::int64_t model_tile_m = 128, model_tile_n = 64;
bool model_kernel_takes(const gemm_problem& p);
void model_matmul(const gemm_problem& p, std::uint8_t* redo, const exec& ex);
// s[0] = sa[0] * sb[0] (float32, device pointers) on ex's stream: the one factor of scalar scales
// for a fused epilogue that multiplies by one scale at a time.
void scale_product(const float* sa, const float* sb, float* s, const exec& ex);
void widened_matmul(const gemm_problem& p, const exec& ex);
void cublaslt_matmul(const gemm_problem& p, const exec& ex);
// False when this build has no CUTLASS sm_90 kernels for the problem (then another backend runs).
bool cutlass_sm90_available(const gemm_problem& p);
void cutlass_sm90_matmul(const gemm_problem& p, const exec& ex);

// The unfused epilogue (gemm.cu): acc is an (M x N) int32 (acc_is_int) or float32 matrix in
// device memory with row stride acc_ld; one kernel applies gemm_finish's arithmetic to every
// element, reading acc in 16-byte loads, so acc must be 16-byte aligned and acc_ld a multiple of 4.
// The cuBLASLt paths that cannot fuse the rule's epilogue end with it.
void finish_matmul(const gemm_problem& p, const void* acc, bool acc_is_int, std::int64_t acc_ld,
                   const exec& ex);

// dst[i] = gemm_scale(s, mode, i) for i < n (device memory): cuBLASLt's outer-vector scaling
// takes vectors for both operands, so a tensor's scale (or none) is broadcast into one and
// per-row scales are copied into aligned scratch.
void broadcast_scales(const float* s, scale_mode mode, std::int64_t n, float* dst, const exec& ex);

// Why cuBLASLt cannot take the problem on this device (empty when it can): the element types,
// the architecture, the alignment of pointers and leading dimensions.
std::string cublaslt_refusal(const gemm_problem& p);
} // namespace cuda

} // namespace lowbit::kernels
