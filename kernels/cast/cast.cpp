// Host API of the cast technique: argument checks, then the CPU twin or the CUDA kernel.
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>

#include "../common/device_check.hpp"
#include "cast_internal.hpp"

namespace lowbit::kernels {

dtype code_dtype(const emu::format& f) {
  return f.bits() <= 8 ? dtype::uint8 : (f.bits() <= 16 ? dtype::uint16 : dtype::uint32);
}

void cast(const tensor_view& in, const tensor_view& out, const emu::format& fmt,
          const emu::policy& pol, const emu::random_stream& rng, const exec& ex) {
  emu::validate(fmt);
  emu::validate(pol);
  require_valid(in, "input");
  require_valid(out, "output");
  require_dtype(in, "input", {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16});
  require_dtype(out, "output", {code_dtype(fmt)});
  require_same_shape(in, "input", out, "output");
  require_same_device(in, "input", out, "output");
  if (in.numel() == 0) return;
  if (in.dev.type == device_type::cuda) {
    require_device_memory({&in, &out}, {"input", "output"});
    return cuda::cast(in, out, fmt, pol, rng, ex);
  }
  cpu::cast(in, out, fmt, pol, rng, ex);
}

void decode(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
            const exec& ex) {
  emu::validate(fmt);
  require_valid(codes, "codes");
  require_valid(out, "output");
  require_dtype(codes, "codes", {code_dtype(fmt)});
  if (fmt.fits_float())
    require_dtype(out, "output", {dtype::float32, dtype::float64});
  else
    require_dtype(out, "output", {dtype::float64});
  require_same_shape(codes, "codes", out, "output");
  require_same_device(codes, "codes", out, "output");
  if (codes.numel() == 0) return;
  if (codes.dev.type == device_type::cuda) {
    require_device_memory({&codes, &out}, {"codes", "output"});
    return cuda::decode(codes, out, fmt, ex);
  }
  cpu::decode(codes, out, fmt, ex);
}

}  // namespace lowbit::kernels
