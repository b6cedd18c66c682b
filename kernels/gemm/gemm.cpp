// Host API of the scaled matmul: every argument checked with a message naming it, then the CPU
// twin (CPU views) or the CUDA backend that gemm_options asks for or `automatic` picks
// (docs/techniques/gemm.md has the table).
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/gemm.hpp>

#include <string>

#include "../common/device_check.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels {

const char* gemm_backend_name(gemm_backend b) {
  switch (b) {
  case gemm_backend::automatic: return "automatic";
  case gemm_backend::simt: return "simt";
  case gemm_backend::cublaslt: return "cublaslt";
  case gemm_backend::cutlass: return "cutlass";
  case gemm_backend::widened: return "widened";
  }
  return "unknown";
}

namespace {

std::string target_name(const target& t) {
  return t.is_int ? emu::int_format_name(t.ifmt) : emu::format_name(t.fmt);
}

// The element type of a format, and the dtype its codes must have.
gemm_elem elem_of(const target& t, const char* arg, dtype& codes_type) {
  if (t.is_int && t.ifmt == emu::int8) {
    codes_type = dtype::int8;
    return gemm_elem::int8;
  }
  if (t.is_int && t.ifmt == emu::int8_sym) {
    codes_type = dtype::int8;
    return gemm_elem::int8;
  }
  if (!t.is_int && t.fmt == emu::e4m3fn) {
    codes_type = dtype::uint8;
    return gemm_elem::e4m3;
  }
  if (!t.is_int && t.fmt == emu::e5m2) {
    codes_type = dtype::uint8;
    return gemm_elem::e5m2;
  }
  if (!t.is_int && t.fmt == emu::bfloat16) {
    codes_type = dtype::bfloat16;
    return gemm_elem::bf16;
  }
  if (!t.is_int && t.fmt == emu::float16) {
    codes_type = dtype::float16;
    return gemm_elem::f16;
  }
  throw error(errc::invalid_argument,
              std::string(arg) + ": format " + target_name(t) +
                  " is not a matmul operand format (int8, int8_sym, e4m3fn, e5m2, bfloat16, "
                  "float16)");
}

// The checks of require_valid but the data pointer's, which check_data makes last: a problem
// that is refused for its shape (K over the int8 limit) is refused before anything is read.
void check_view(const tensor_view& v, const char* arg) {
  require(v.ndim >= 0 && v.ndim <= max_dims, errc::invalid_argument,
          [&] { return std::string(arg) + ": at most 8 dimensions"; });
  for (int i = 0; i < v.ndim; ++i)
    require(v.shape[i] >= 0, errc::invalid_argument,
            [&] { return std::string(arg) + ": negative extent in shape " + v.shape_string(); });
}

void check_data(const tensor_view& v, const char* arg) {
  require(v.data != nullptr || v.numel() == 0, errc::invalid_argument,
          [&] { return std::string(arg) + ": null data pointer for a non-empty tensor"; });
}

// A default-constructed view (no dimensions, null data) stands for "none" where a tensor may
// have no elements (scales, bias), as the header's "no elements (data may be null)" reads.
tensor_view none_if_default(const tensor_view& v) {
  if (v.ndim != 0 || v.data != nullptr)
    return v;
  tensor_view e;
  e.ndim = 1;
  e.shape[0] = 0;
  e.strides[0] = 1;
  return e;
}

struct side_views {
  const char* codes_arg;
  const char* scales_arg;
  const char* fmt_arg;
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a / b + (a % b != 0); // (a + b - 1) / b overflows for a block near INT64_MAX
}

// Block scales (gemm.hpp): [ceil(rows / block_rows), ceil(K / block_k)] float32 factors or
// E8M0 codes (fp8 operands only).
gemm_side check_blocks(const gemm_operand& op, const side_views& names, const matrix_shape& m,
                       gemm_side s, const tensor_view& scales) {
  const std::string arg = names.scales_arg;
  require(op.block_rows >= 1 && op.block_k >= 1, errc::invalid_argument, [&] {
    return arg + ": block scales need block_rows >= 1 and block_k >= 1 (got " +
           std::to_string(op.block_rows) + " x " + std::to_string(op.block_k) +
           "; both 0 for tensor or row scales)";
  });
  require_dtype(scales, names.scales_arg, {dtype::float32, dtype::uint8});
  const bool e8m0 = scales.type == dtype::uint8;
  require(!e8m0 || gemm_is_fp8(s.elem), errc::invalid_argument, [&] {
    return arg + ": uint8 (E8M0) scales are for fp8 operands (MXFP8); give float32 scales for " +
           std::string(names.fmt_arg) + " operands";
  });
  const std::int64_t sr = ceil_div(m.rows, op.block_rows), sc = ceil_div(m.cols, op.block_k);
  require(scales.numel() == sr * sc, errc::invalid_argument, [&] {
    return arg + ": " + std::to_string(op.block_rows) + " x " + std::to_string(op.block_k) +
           " blocks of a " + std::to_string(m.rows) + " x " + std::to_string(m.cols) +
           " operand need " + std::to_string(sr) + " x " + std::to_string(sc) +
           " scales but got shape " + scales.shape_string();
  });
  if (scales.numel() > 0) {
    require_contiguous(scales, names.scales_arg);
    require_same_device(op.codes, names.codes_arg, scales, names.scales_arg);
  }
  s.mode = scale_mode::blocks;
  s.block_scales = scales.numel() == 0 ? nullptr : scales.data;
  s.block_rows = op.block_rows;
  s.scale_cols = sc;
  s.e8m0 = e8m0;
  return s;
}

gemm_side check_side(const gemm_operand& op, const side_views& names, std::int64_t& k) {
  gemm_side s;
  const tensor_view scales = none_if_default(op.scales);
  dtype want;
  s.elem = elem_of(op.fmt, names.fmt_arg, want);
  check_view(op.codes, names.codes_arg);
  require(op.codes.ndim >= 1, errc::invalid_argument, [&] {
    return std::string(names.codes_arg) + ": expected a (rows x K) matrix, got a scalar";
  });
  require_dtype(op.codes, names.codes_arg, {want});
  const matrix_shape m = as_matrix(op.codes, names.codes_arg);
  s.codes = op.codes.data;
  s.rows = m.rows;
  s.row_stride = m.row_stride;
  k = m.cols;

  check_view(scales, names.scales_arg);
  if (op.block_rows != 0 || op.block_k != 0)
    return check_blocks(op, names, m, s, scales);
  require_dtype(scales, names.scales_arg, {dtype::float32});
  const std::int64_t ns = scales.numel();
  require(ns == 0 || ns == 1 || ns == m.rows, errc::invalid_argument, [&] {
    return std::string(names.scales_arg) + ": expected 0 (no scales), 1 (one per tensor) or " +
           std::to_string(m.rows) + " (one per row) elements but got shape " +
           scales.shape_string();
  });
  if (ns > 0) {
    require_contiguous(scales, names.scales_arg);
    require_same_device(op.codes, names.codes_arg, scales, names.scales_arg);
  }
  // One row: a one-element scale is both readings, and reading it as the tensor's is cheaper.
  s.mode = ns == 0 ? scale_mode::none : (ns == 1 ? scale_mode::tensor : scale_mode::rows);
  s.scales = ns == 0 ? nullptr : static_cast<const float*>(scales.data);
  return s;
}

int kind_of(gemm_elem e) {
  return e == gemm_elem::int8 ? 0 : (gemm_is_fp8(e) ? 1 : 2);
}

// Everything but the device memory checks, which need the CUDA runtime.
gemm_problem check(const gemm_operand& a, const gemm_operand& b, const tensor_view& bias_in,
                   const tensor_view& out) {
  gemm_problem p;
  const tensor_view bias = none_if_default(bias_in);
  std::int64_t ka = 0, kb = 0;
  p.a = check_side(a, {"a.codes", "a.scales", "a.fmt"}, ka);
  p.b = check_side(b, {"b.codes", "b.scales", "b.fmt"}, kb);
  const int kind_a = kind_of(p.a.elem), kind_b = kind_of(p.b.elem);
  require(kind_a == kind_b && (kind_a != 2 || p.a.elem == p.b.elem), errc::invalid_argument, [&] {
    return "b.fmt: " + target_name(b.fmt) + " cannot be multiplied with a.fmt " +
           target_name(a.fmt) +
           " (int8 takes int8, fp8 takes fp8 of either e4m3fn or e5m2, a 16-bit format "
           "takes the same format)";
  });
  require(ka == kb, errc::invalid_argument, [&] {
    return "b.codes: K (the last dimension) is " + std::to_string(kb) + " but a.codes has K " +
           std::to_string(ka);
  });
  p.m = p.a.rows;
  p.n = p.b.rows;
  p.k = ka;
  if (a.block_k > 0 && b.block_k > 0)
    require(a.block_k == b.block_k, errc::invalid_argument, [&] {
      return "b.scales: K blocks of " + std::to_string(b.block_k) +
             " but a.scales has K blocks of " + std::to_string(a.block_k) +
             " (the blocked rule needs one K block length)";
    });
  p.kblock = a.block_k > 0 ? a.block_k : b.block_k;
  if (p.a.elem == gemm_elem::int8) {
    const std::int64_t limit = gemm_int8_k_limit;
    require(p.k <= limit, errc::invalid_argument, [&] {
      return "a.codes: K = " + std::to_string(p.k) + " exceeds " + std::to_string(limit) +
             ", the largest K whose int32 sum of " + target_name(a.fmt) + " x " +
             target_name(b.fmt) + " products cannot overflow (split K and add the partial results)";
    });
  }

  check_view(bias, "bias");
  const std::int64_t nb = bias.numel();
  if (nb > 0) {
    require_dtype(bias, "bias", {dtype::float32, dtype::bfloat16, dtype::float16});
    require(nb == p.n, errc::invalid_argument, [&] {
      return "bias: expected " + std::to_string(p.n) +
             " elements (one per row of b) or none, "
             "but got shape " +
             bias.shape_string();
    });
    require_contiguous(bias, "bias");
    require_same_device(a.codes, "a.codes", bias, "bias");
    p.bias = bias.data;
    p.bias_type = bias.type;
  }

  check_view(out, "out");
  require_dtype(out, "out", {dtype::float32, dtype::bfloat16, dtype::float16});
  require(out.ndim >= 1, errc::invalid_argument, "out: expected a (M x N) matrix, got a scalar");
  const matrix_shape om = as_matrix(out, "out");
  require(om.rows == p.m && om.cols == p.n, errc::invalid_argument, [&] {
    return "out: expected " + std::to_string(p.m) + " x " + std::to_string(p.n) +
           " (rows of a x rows of b) but got shape " + out.shape_string();
  });
  p.out = out.data;
  p.out_type = out.type;
  p.out_stride = om.row_stride;

  require_same_device(a.codes, "a.codes", b.codes, "b.codes");
  require_same_device(a.codes, "a.codes", out, "out");

  check_data(a.codes, "a.codes");
  check_data(b.codes, "b.codes");
  check_data(none_if_default(a.scales), "a.scales");
  check_data(none_if_default(b.scales), "b.scales");
  check_data(bias, "bias");
  check_data(out, "out");
  p.dev = a.codes.dev;
  return p;
}

// Why `b` cannot run p on the current device; empty when it can.
std::string refusal(gemm_backend b, const gemm_problem& p) {
  const bool int8 = p.a.elem == gemm_elem::int8;
  const bool fp8 = gemm_is_fp8(p.a.elem);
  if (b != gemm_backend::automatic && b != gemm_backend::simt && p.kblock > 0)
    return "block scales (block_rows, block_k) run on the CUDA cores only (simt): a tensor-core "
           "GEMM cannot scale each K block's partial sum";
  switch (b) {
  case gemm_backend::automatic:
  case gemm_backend::simt: return {};
  case gemm_backend::cublaslt: return cuda::cublaslt_refusal(p);
  case gemm_backend::cutlass:
    if (!cuda::cutlass_sm90_available(p))
      return "this build or device has no CUTLASS sm_90 kernel for the problem (it needs an "
             "sm_90 device, a build for sm_90a with CUTLASS, and the kernels' alignment)";
    return {};
  case gemm_backend::widened:
    if (int8)
      return "widening is for fp8 operands; int8 sums are exact on simt, cublaslt and cutlass";
    if (!fp8)
      return "widening is for fp8 operands; 16-bit operands run on cublaslt or cutlass as "
             "they are";
    return {};
  }
  return "unknown backend";
}

gemm_backend choose(const gemm_problem& p) {
  if (p.k == 0 || p.m == 0 || p.n == 0)
    return gemm_backend::simt; // nothing to multiply: the simt kernel writes round(bias)
  if (p.kblock > 0)
    return gemm_backend::simt; // block scales: the CUDA cores only
  // CUTLASS first where it runs (sm_90: every epilogue fused, the int8 sums at twice bf16's
  // rate); fp8 elsewhere on cuBLASLt's own fp8 (sm_89+) or widened to 16-bit.
  if (refusal(gemm_backend::cutlass, p).empty())
    return gemm_backend::cutlass;
  if (gemm_is_fp8(p.a.elem))
    return refusal(gemm_backend::cublaslt, p).empty() ? gemm_backend::cublaslt
                                                      : gemm_backend::widened;
  if (refusal(gemm_backend::cublaslt, p).empty())
    return gemm_backend::cublaslt;
  return gemm_backend::simt;
}

// Which backend would take p, for the message of an explicit one that cannot.
std::string alternative(const gemm_problem& p) {
  return std::string(gemm_backend_name(choose(p))) + " (what automatic picks here) would";
}

void run(gemm_backend b, const gemm_problem& p, const exec& ex) {
  switch (b) {
  case gemm_backend::simt: return cuda::simt_matmul(p, ex);
  case gemm_backend::cublaslt: return cuda::cublaslt_matmul(p, ex);
  case gemm_backend::cutlass: return cuda::cutlass_sm90_matmul(p, ex);
  case gemm_backend::widened: return cuda::widened_matmul(p, ex);
  case gemm_backend::automatic: break;
  }
  throw error(errc::invalid_argument, "opt.backend: not a backend");
}

void require_device_views(const gemm_operand& a, const gemm_operand& b, const tensor_view& bias,
                          const tensor_view& out) {
  const tensor_view sa = none_if_default(a.scales), sb = none_if_default(b.scales),
                    bv = none_if_default(bias);
  require_device_memory({&a.codes, &b.codes, &sa, &sb, &bv, &out},
                        {"a.codes", "b.codes", "a.scales", "b.scales", "bias", "out"});
}

} // namespace

void scaled_matmul(const gemm_operand& a, const gemm_operand& b, const tensor_view& bias,
                   const tensor_view& out, const gemm_options& opt, const exec& ex) {
  require(opt.backend <= gemm_backend::widened, errc::invalid_argument,
          "opt.backend: not a backend");
  gemm_problem p = check(a, b, bias, out);
  if (opt.accumulation) {
    const emu::accumulation& model = *opt.accumulation;
    require(emu::is_valid(model), errc::invalid_argument,
            "opt.accumulation: not a valid model (block 1..64, fraction_bits 0..40, "
            "promote_every >= 0, known kind and roundings)");
    require(model.kind != emu::accumulation_kind::exact, errc::unsupported,
            "opt.accumulation: exact is the reference's sum (reference::exact_scaled_matmul); no "
            "backend computes it");
    require(p.a.elem != gemm_elem::int8, errc::invalid_argument,
            "opt.accumulation: int8 sums are exact on every backend; a model applies to fp8 and "
            "16-bit operands");
    p.accumulation = model;
  }
  if (opt.fast_accumulation) {
    require(gemm_is_fp8(p.a.elem) && gemm_is_fp8(p.b.elem), errc::invalid_argument,
            "opt.fast_accumulation: a mode of the fp8 tensor cores; these operands are not fp8");
    require(!opt.accumulation, errc::unsupported,
            "opt.fast_accumulation: cuBLASLt's hardware sum; with opt.accumulation (a model, run "
            "on the CPU twin or simt) it has no meaning: pass the model alone, e.g. "
            "hopper_fp8_accumulation(true)");
    require(p.dev.type == device_type::cuda, errc::unsupported,
            "opt.fast_accumulation: cuBLASLt's mode, on CUDA views only; the CPU twin sums fast "
            "accumulation's model with opt.accumulation = hopper_fp8_accumulation(true)");
    require(opt.backend == gemm_backend::automatic || opt.backend == gemm_backend::cublaslt,
            errc::unsupported, [&] {
              return std::string("opt.fast_accumulation: cuBLASLt's mode; opt.backend ") +
                     gemm_backend_name(opt.backend) + " cannot take it (cublaslt or automatic)";
            });
    p.fast_accumulation = true;
  }
  if (p.dev.type != device_type::cuda)
    return cpu::scaled_matmul(p, ex);
  require_device_views(a, b, bias, out);
  if (p.m == 0 || p.n == 0)
    return;
  gemm_backend use = opt.backend;
  if (opt.accumulation) {
    // Only the CUDA cores sum in the model's order; the tensor cores sum in hardware.
    require(use == gemm_backend::automatic || use == gemm_backend::simt, errc::unsupported, [&] {
      return std::string("opt.backend: ") + gemm_backend_name(use) +
             " sums in hardware and cannot take opt.accumulation; simt (or automatic) runs the "
             "model";
    });
    use = gemm_backend::simt;
  } else if (p.fast_accumulation && p.k > 0) {
    const std::string why = refusal(gemm_backend::cublaslt, p);
    require(why.empty(), errc::unsupported,
            [&] { return "opt.fast_accumulation: cuBLASLt cannot take this problem: " + why; });
    use = gemm_backend::cublaslt;
  } else if (use == gemm_backend::automatic) {
    use = choose(p);
    if (use == gemm_backend::cublaslt) {
      try {
        return run(use, p, ex);
      } catch (const error& e) {
        if (e.code() != errc::unsupported)
          throw;
        // cuBLASLt's heuristic had no algorithm (before anything was launched): the backend
        // that takes every problem of this kind.
        use = gemm_is_fp8(p.a.elem) ? gemm_backend::widened : gemm_backend::simt;
      }
    }
  } else if (p.k > 0) {
    const std::string why = refusal(use, p);
    require(why.empty(), errc::unsupported, [&] {
      return std::string("opt.backend: ") + gemm_backend_name(use) +
             " cannot take this problem: " + why + "; " + alternative(p);
    });
  } else {
    use = gemm_backend::simt; // K = 0 launches no GEMM on any backend
  }
  run(use, p, ex);
}

gemm_backend gemm_backend_for(const gemm_operand& a, const gemm_operand& b,
                              const tensor_view& out) {
  const gemm_problem p = check(a, b, tensor_view{}, out);
  if (p.dev.type != device_type::cuda)
    return gemm_backend::simt;
  require_device_views(a, b, tensor_view{}, out);
  return choose(p);
}

} // namespace lowbit::kernels
