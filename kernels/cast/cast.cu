// CUDA kernels of the cast technique: the per-element code of cast_ops.hpp in the shared
// element-wise map (16-byte vector loads, grid-stride, 64-bit indices).
#include "../common/cuda_map.cuh"
#include "../common/dispatch.hpp"
#include "../common/matrix.hpp"
#include "cast_internal.hpp"
#include "cast_ops.hpp"

namespace lowbit::kernels::cuda {

namespace {

template <class FT, class PT, class Code> struct cast_op {
  static constexpr bool needs_position = false;
  FT ft;
  PT pt;
  template <class In>
  __device__ Code operator()(In x, std::int64_t, std::int64_t, std::uint32_t rbits) const {
    return static_cast<Code>(cast_ops::encode_one(ft, pt, x, rbits));
  }
};

template <class FT, class T> struct decode_op {
  static constexpr bool needs_position = false;
  FT ft;
  template <class Code>
  __device__ T operator()(Code c, std::int64_t, std::int64_t, std::uint32_t) const {
    return emu::decode<T>(ft.get(), c);
  }
};

template <class Code, class FT> void with_code(FT, dtype t, auto&& fn) {
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

} // namespace

void cast(const tensor_view& in, const tensor_view& out, const emu::format& fmt,
          const emu::policy& pol, const emu::random_stream& rng, const exec& ex) {
  const matrix_shape im = as_matrix(in, "x"), om = as_matrix(out, "out");
  cast_ops::dispatch_input(in.type, [&](auto in_tag) {
    using In = decltype(in_tag);
    detail::dispatch_hot_format_for<In>(fmt, [&](auto ft) {
      with_code<In>(ft, out.type, [&](auto code_tag) {
        using Code = decltype(code_tag);
        detail::dispatch_policy(pol, [&](auto pt) {
          launch_map(in.ptr<const In>(), im.row_stride, out.ptr<Code>(), om.row_stride, im.rows,
                     im.cols, cast_op<decltype(ft), decltype(pt), Code>{ft, pt}, pt.stochastic(),
                     rng, stream_of(ex));
        });
      });
    });
  });
}

void decode(const tensor_view& codes, const tensor_view& out, const emu::format& fmt,
            const exec& ex) {
  const matrix_shape cm = as_matrix(codes, "codes"), om = as_matrix(out, "out");
  detail::dispatch_hot_format(fmt, [&](auto ft) {
    with_code<void>(ft, codes.type, [&](auto code_tag) {
      using Code = decltype(code_tag);
      const auto run = [&](auto out_tag) {
        using T = decltype(out_tag);
        launch_map(codes.ptr<const Code>(), cm.row_stride, out.ptr<T>(), om.row_stride, cm.rows,
                   cm.cols, decode_op<decltype(ft), T>{ft}, false, {}, stream_of(ex));
      };
      if (out.type == dtype::float32)
        run(float{});
      else
        run(double{});
    });
  });
}

} // namespace lowbit::kernels::cuda
