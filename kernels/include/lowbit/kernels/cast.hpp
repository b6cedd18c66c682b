// Element-wise casts between real numbers and format codes, on CPU views (the CPU twin, threaded)
// and CUDA views (the GPU kernel), bit-identical to each other and to lowbit::emu::encode.
//
//   float32 | float64 | float16 | bfloat16  --cast-->  codes  --decode-->  float32 | float64
//
// Codes are stored one per element in the narrowest unsigned type that holds them: uint8 for
// formats of up to 8 bits, uint16 up to 16, uint32 beyond (see code_dtype). Stochastic rounding
// draws element i's random bits from rng.bits(i), i the row-major logical index, so results do
// not depend on memory layout, thread count or launch shape.
#pragma once

#include <lowbit/emu/format.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

// The dtype that holds codes of format f.
dtype code_dtype(const emu::format& f);

// out[i] = emu::encode(fmt, x[i], pol, rng.bits(i)). Same shape; any strides; empty is a no-op.
void cast(const tensor_view& x, const tensor_view& out, const emu::format& fmt,
          const emu::policy& pol, const emu::random_stream& rng = {}, const exec& ex = {});

// out[i] = the exact value of code codes[i]; out is float32 (formats that fit float) or float64.
void decode(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
            const exec& ex = {});

} // namespace lowbit::kernels
