// Entry points behind the cast host API; arguments are already checked.
#pragma once

#include <lowbit/kernels/cast.hpp>

namespace lowbit::kernels {
namespace cpu {
void cast(const tensor_view& in, const tensor_view& out, const emu::format& fmt,
          const emu::policy& pol, const emu::random_stream& rng, const exec& ex);
void decode(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
            const exec& ex);
} // namespace cpu
namespace cuda {
void cast(const tensor_view& in, const tensor_view& out, const emu::format& fmt,
          const emu::policy& pol, const emu::random_stream& rng, const exec& ex);
void decode(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
            const exec& ex);
} // namespace cuda
} // namespace lowbit::kernels
