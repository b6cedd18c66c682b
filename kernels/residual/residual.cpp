// Host API of residual split/join: argument checks with precise messages, then the CPU twin (the
// per-element code of residual_ops.hpp looped over threads) or the CUDA kernel.
#include <lowbit/kernels/residual.hpp>

#include <string>

#include "../common/cpu.hpp"
#include "../common/device_check.hpp"
#include "residual_internal.hpp"

namespace lowbit::kernels {

dtype residual_dtype(int bits) {
  require(bits >= 1 && bits <= 16, errc::invalid_argument,
          [&] { return "residual: bits = " + std::to_string(bits) + " is outside [1, 16]"; });
  return bits <= 8 ? dtype::int8 : dtype::int16;
}

namespace {

residual_problem checked(const char* fn, const tensor_view& x, const tensor_view& w,
                         const tensor_view& r, int bits) {
  const std::string f = std::string(fn) + ": ";
  const dtype rt = residual_dtype(bits);
  const char* xn = std::string(fn) == "residual_split" ? "x" : "out";
  require_valid(x, xn);
  require_valid(w, "weight");
  require_valid(r, "residual");
  require_dtype(x, xn, {dtype::float32});
  require_dtype(w, "weight", {dtype::bfloat16, dtype::float16});
  require(r.type == rt, errc::invalid_type, [&] {
    return f + "residual: dtype " + dtype_name(r.type) + "; a " + std::to_string(bits) +
           "-bit residual is stored as " + dtype_name(rt);
  });
  require_contiguous(x, xn);
  require_contiguous(w, "weight");
  require_contiguous(r, "residual");
  require(x.numel() == w.numel() && r.numel() == w.numel(), errc::invalid_argument, [&] {
    return f + std::string(xn) + ", weight and residual have " + std::to_string(x.numel()) + ", " +
           std::to_string(w.numel()) + " and " + std::to_string(r.numel()) +
           " elements; expected one count";
  });
  require_same_device(w, "weight", x, xn);
  require_same_device(w, "weight", r, "residual");
  if (w.dev.type == device_type::cuda && w.numel() > 0)
    require_device_memory({&x, &w, &r}, {xn, "weight", "residual"});
  residual_problem p;
  p.x = static_cast<float*>(x.data);
  p.w = static_cast<std::uint16_t*>(w.data);
  p.r = r.data;
  p.n = w.numel();
  p.kind =
      w.type == dtype::bfloat16 ? residual_ops::weight_kind::bf16 : residual_ops::weight_kind::f16;
  p.bits = bits;
  return p;
}

} // namespace

void residual_split(const tensor_view& x, const tensor_view& weight, const tensor_view& residual,
                    int bits, const exec& ex) {
  const residual_problem p = checked("residual_split", x, weight, residual, bits);
  if (p.n == 0)
    return;
  if (weight.dev.type == device_type::cuda)
    cuda::residual_split(p, ex);
  else
    cpu::residual_split(p, ex);
}

void residual_join(const tensor_view& weight, const tensor_view& residual, int bits,
                   const tensor_view& out, const exec& ex) {
  const residual_problem p = checked("residual_join", out, weight, residual, bits);
  if (p.n == 0)
    return;
  if (weight.dev.type == device_type::cuda)
    cuda::residual_join(p, ex);
  else
    cpu::residual_join(p, ex);
}

namespace cpu {

void residual_split(const residual_problem& p, const exec& ex) {
  parallel_for(p.n, ex.threads, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const residual_ops::parts s = residual_ops::split(p.kind, p.bits, p.x[i]);
      p.w[i] = s.w;
      if (p.bits <= 8)
        static_cast<std::int8_t*>(p.r)[i] = static_cast<std::int8_t>(s.r);
      else
        static_cast<std::int16_t*>(p.r)[i] = static_cast<std::int16_t>(s.r);
    }
  });
}

void residual_join(const residual_problem& p, const exec& ex) {
  parallel_for(p.n, ex.threads, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const std::int32_t r = p.bits <= 8 ? static_cast<const std::int8_t*>(p.r)[i]
                                         : static_cast<const std::int16_t*>(p.r)[i];
      p.x[i] = residual_ops::join(p.kind, p.bits, p.w[i], r);
    }
  });
}

} // namespace cpu

} // namespace lowbit::kernels
