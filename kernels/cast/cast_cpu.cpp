// CPU twin of the cast kernels: the per-element code of cast_ops.hpp, looped over threads.
#include "../common/cpu.hpp"
#include "../common/dispatch.hpp"
#include "cast_internal.hpp"
#include "cast_ops.hpp"

#include <lowbit/emu/fp.hpp>

#include <type_traits>

namespace lowbit::kernels::cpu {

namespace {

// Calls fn(code_type_tag): the storage type of the codes, a constant for fixed formats.
template <class FT, class Fn> void with_code_type(FT, dtype t, Fn&& fn) {
  if constexpr (std::is_same_v<FT, detail::runtime_format>) {
    if (t == dtype::uint8)
      return fn(std::uint8_t{});
    if (t == dtype::uint16)
      return fn(std::uint16_t{});
    return fn(std::uint32_t{});
  } else {
    return fn(emu::detail::code_storage<FT::get().bits()>{});
  }
}

void cast_any(const tensor_view& in, const tensor_view& out, const emu::format& fmt,
              const emu::policy& pol, const emu::random_stream& rng, const exec& ex) {
  const bool flat = in.is_contiguous() && out.is_contiguous();
  cast_ops::dispatch_input(in.type, [&](auto tag) {
    using T = decltype(tag);
    detail::dispatch_format(fmt, [&](auto ft_ref) {
      with_code_type(ft_ref, out.type, [&](auto code_tag) {
        using C = decltype(code_tag);
        detail::dispatch_policy(pol, [&](auto pt_ref) {
          parallel_for(in.numel(), ex.threads, [&](std::int64_t b, std::int64_t e) {
            // Local copies: stores through the (char-sized) codes may alias anything reached
            // through a reference, which would make the compiler reload the pointers and the
            // policy, and recompute its constants, after every element.
            const auto pt = pt_ref;
            const auto ft = ft_ref;
            const T* __restrict__ src = in.ptr<const T>();
            C* __restrict__ dst = out.ptr<C>();
            if (flat) {
              if (pt.stochastic()) {
                for (std::int64_t i = b; i < e;) {
                  const emu::philox_block blk = rng.block(static_cast<std::uint64_t>(i) >> 2);
                  for (int j = static_cast<int>(i & 3); j < 4 && i < e; ++j, ++i)
                    dst[i] = static_cast<C>(cast_ops::encode_one(ft, pt, src[i], blk.v[j]));
                }
              } else {
                for (std::int64_t i = b; i < e; ++i)
                  dst[i] = static_cast<C>(cast_ops::encode_one(ft, pt, src[i], 0u));
              }
            } else {
              for_each_pair(in, out, b, e, [&](std::int64_t i, std::int64_t oi, std::int64_t oo) {
                const std::uint32_t r =
                    pt.stochastic() ? rng.bits(static_cast<std::uint64_t>(i)) : 0u;
                dst[oo] = static_cast<C>(cast_ops::encode_one(ft, pt, src[oi], r));
              });
            }
          });
        });
      });
    });
  });
}

template <class C, class T>
void decode_typed(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
                  const exec& ex) {
  const bool flat = codes.is_contiguous() && out.is_contiguous();
  detail::dispatch_format(fmt, [&](auto ft_ref) {
    parallel_for(codes.numel(), ex.threads, [&](std::int64_t b, std::int64_t e) {
      const auto ft = ft_ref; // local copies, as in cast_any
      const C* __restrict__ src = codes.ptr<const C>();
      T* __restrict__ dst = out.ptr<T>();
      if (flat) {
        for (std::int64_t i = b; i < e; ++i)
          dst[i] = emu::decode<T>(ft.get(), src[i]);
      } else {
        for_each_pair(codes, out, b, e, [&](std::int64_t, std::int64_t oc, std::int64_t oo) {
          dst[oo] = emu::decode<T>(ft.get(), src[oc]);
        });
      }
    });
  });
}

} // namespace

void cast(const tensor_view& in, const tensor_view& out, const emu::format& fmt,
          const emu::policy& pol, const emu::random_stream& rng, const exec& ex) {
  cast_any(in, out, fmt, pol, rng, ex);
}

void decode(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
            const exec& ex) {
  const auto with_out = [&](auto code_tag) {
    using C = decltype(code_tag);
    if (out.type == dtype::float32)
      decode_typed<C, float>(codes, out, fmt, ex);
    else
      decode_typed<C, double>(codes, out, fmt, ex);
  };
  switch (codes.type) {
  case dtype::uint8: return with_out(std::uint8_t{});
  case dtype::uint16: return with_out(std::uint16_t{});
  default: return with_out(std::uint32_t{});
  }
}

} // namespace lowbit::kernels::cpu
