// Host API of the cast technique: argument checks, then the CPU twin or the CUDA kernel.
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>

#include "../common/device_check.hpp"
#include "cast_internal.hpp"

namespace lowbit::kernels {

dtype code_dtype(const emu::format& f) {
  return f.bits() <= 8 ? dtype::uint8 : (f.bits() <= 16 ? dtype::uint16 : dtype::uint32);
}

void cast(const tensor_view& x, const tensor_view& out, const emu::format& fmt,
          const emu::policy& pol, const emu::random_stream& rng, const exec& ex) {
  emu::validate(fmt);
  emu::validate(pol);
  require_valid(x, "x");
  require_valid(out, "out");
  require_dtype(x, "x", {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16});
  require_dtype(out, "out", {code_dtype(fmt)});
  require_same_shape(x, "x", out, "out");
  require_same_device(x, "x", out, "out");
  if (x.numel() == 0)
    return;
  if (x.dev.type == device_type::cuda) {
    require_device_memory({&x, &out}, {"x", "out"});
    return cuda::cast(x, out, fmt, pol, rng, ex);
  }
  cpu::cast(x, out, fmt, pol, rng, ex);
}

void decode(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
            const exec& ex) {
  emu::validate(fmt);
  require_valid(codes, "codes");
  require_valid(out, "out");
  require_dtype(codes, "codes", {code_dtype(fmt)});
  if (fmt.fits_float())
    require_dtype(out, "out", {dtype::float32, dtype::float64});
  else
    require_dtype(out, "out", {dtype::float64});
  require_same_shape(codes, "codes", out, "out");
  require_same_device(codes, "codes", out, "out");
  if (codes.numel() == 0)
    return;
  if (codes.dev.type == device_type::cuda) {
    require_device_memory({&codes, &out}, {"codes", "out"});
    return cuda::decode(codes, out, fmt, ex);
  }
  cpu::decode(codes, out, fmt, ex);
}

} // namespace lowbit::kernels
