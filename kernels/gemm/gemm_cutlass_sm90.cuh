// The CUTLASS sm_90 kernels of the scaled matmul, shared by the translation units that instantiate
// them (gemm_cutlass_sm90_<elements>.cu, one per operand element type, so that they compile in
// parallel) and the dispatch (gemm_cutlass_sm90.cu). CUTLASS 3 kernels: TMA loads, WGMMA,
// warp-specialized persistent schedules, and an epilogue visitor tree that computes the rule of
// gemm.hpp in registers, so the dequantization and the bias cost no pass over the output:
//   D[m, n] = round(((float(acc[m, n]) * sa[m]) * sb[n]) + bias[n])
// Each node of the tree is one float32 operation rounded to nearest (the build has no FMA
// contraction), in the rule's order, so the result equals the CPU twin's bit for bit for the same
// float32 accumulator (int8: always, its int32 sum is exact).
// Built for sm_90a only (cmake/cutlass.cmake): WGMMA and TMA exist in that target alone.
#pragma once

#if !defined(LOWBIT_WITH_CUTLASS_SM90)
#error "build this file through cmake/cutlass.cmake (it defines LOWBIT_WITH_CUTLASS_SM90)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/float8.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/numeric_types.h>

#include "../common/cuda.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels::cuda::sm90 {

// The instantiated kernels, one function per operand pair (each defined in its own translation
// unit), each dispatching on out's dtype. bias is p's bias as float32 (null for none): the
// dispatch widens a 16-bit bias first. p has passed the dispatch's refusal checks.
void run_int8(const gemm_problem& p, const float* bias, const exec& ex);
void run_bf16(const gemm_problem& p, const float* bias, const exec& ex);
void run_f16(const gemm_problem& p, const float* bias, const exec& ex);
void run_e4m3_e4m3(const gemm_problem& p, const float* bias, const exec& ex);
void run_e5m2_e4m3(const gemm_problem& p, const float* bias, const exec& ex);

namespace fusion = cutlass::epilogue::fusion;

// The root of the epilogue tree: v + bias, then out's rounding (nearest-even; overflow gives
// Inf) with every NaN written as the positive quiet NaN, as gemm_store writes it (the GPU's own
// conversions write 0x7FFF, and its arithmetic 0x7FFFFFFF, for NaN).
template <class ElementD> struct add_and_store {
  // Called on fragments (cutlass::Array<float, N>); T itself is not used (the visitor also names
  // fn<float> for its arguments type).
  template <class T> struct fn {
    template <int N>
    CUTLASS_DEVICE cutlass::Array<ElementD, N>
    operator()(const cutlass::Array<float, N>& v, const cutlass::Array<float, N>& bias) const {
      cutlass::Array<ElementD, N> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i)
        out[i] = store(v[i] + bias[i]);
      return out;
    }
    CUTLASS_DEVICE static ElementD store(float x) {
      const bool nan = !(x == x);
      if constexpr (std::is_same_v<ElementD, float>) {
        return nan ? __uint_as_float(0x7FC00000u) : x;
      } else if constexpr (std::is_same_v<ElementD, cutlass::bfloat16_t>) {
        return cutlass::bfloat16_t::bitcast(nan ? std::uint16_t{0x7FC0}
                                                : __bfloat16_as_ushort(__float2bfloat16_rn(x)));
      } else {
        static_assert(std::is_same_v<ElementD, cutlass::half_t>);
        return cutlass::half_t::bitcast(nan ? std::uint16_t{0x7E00}
                                            : __half_as_ushort(__float2half_rn(x)));
      }
    }
  };
};

// One kernel per (operand pair, output element), persistent, with clusters of 2 CTAs along M that
// share (multicast) each tile of B, which both need.
//   int8:   128 x 128 x 128 tiles (32 KiB of operands per stage), int32 accumulators, the
//           ping-pong schedule: each consumer warp group owns a whole tile, and one's epilogue
//           runs while the other's MMAs do, which matters at K = 1280 where the epilogue is a
//           large share of a tile's time.
//   fp8:    128 x 128 x 128 tiles (K tile 128 bytes, as int8), float32 accumulators, the
//           cooperative schedule without fast accumulation (KernelTmaWarpSpecializedCooperative,
//           which CUTLASS's builder maps to its FP8 mainloop for fp8 operands): the tensor cores'
//           fp8 MMA keeps only about 14 bits of its running sum, so CUTLASS adds the MMA's
//           accumulators into separate float32 registers every 4 k-blocks
//           (mma_promotion_interval), which bounds the truncated part of each sum to at most
//           4 x 32 = 128 products instead of all of K. The promotion doubles the accumulator
//           registers, so a warp group holds half a 128 x 128 tile (cooperative) rather than a
//           whole one (ping-pong would spill). The fast-accumulation schedules (one truncated sum
//           over all of K) come with the accumulation models of the fp8-training issue, which
//           must bound them first.
//   16-bit: 128 x 256 x 64 tiles (48 KiB per stage), float32 accumulators, the cooperative
//           schedule: both consumer warp groups split one tile's M.
template <class ElementA, class ElementB, class ElementD> struct kernel_of {
  static_assert(sizeof(ElementA) == sizeof(ElementB), "TMA + WGMMA from shared memory: one width");
  static constexpr bool is_int8 = std::is_same_v<ElementA, std::int8_t>;
  static constexpr bool is_8bit = sizeof(ElementA) == 1;
  using acc_t = std::conditional_t<is_int8, std::int32_t, float>;
  using tile = std::conditional_t<is_8bit, cute::Shape<cute::_128, cute::_128, cute::_128>,
                                  cute::Shape<cute::_128, cute::_256, cute::_64>>;
  using cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using mainloop_schedule =
      std::conditional_t<is_int8, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using epilogue_schedule = std::conditional_t<is_int8, cutlass::epilogue::TmaWarpSpecialized,
                                               cutlass::epilogue::TmaWarpSpecializedCooperative>;
  static constexpr auto rn = cutlass::FloatRoundStyle::round_to_nearest;

  // The scales and the bias are float32 vectors broadcast along N (sa, one per row of D) or along
  // M (sb and bias, one per column), read one element at a time (alignment 1: the callers'
  // pointers need no alignment). The bool stride picks at run time between a vector (true) and
  // one scalar at ptr[0] (false: the `tensor` mode); a null pointer reads null_default instead
  // (1 for the `none` mode of scales, +0 for no bias: the CPU twin adds +0 too).
  using col_stride = cute::Stride<bool, cute::_0, std::int64_t>;
  using row_stride = cute::Stride<cute::_0, bool, std::int64_t>;
  using sa_node = fusion::Sm90ColBroadcast<0, tile, float, float, col_stride, 1>;
  using sb_node = fusion::Sm90RowBroadcast<0, tile, float, float, row_stride, 1>;
  using bias_node = fusion::Sm90RowBroadcast<0, tile, float, float, row_stride, 1>;
  // ((float(acc) * sb) * sa) + bias, rounded to D's type at the root (gemm_epilogue; scalar
  // scales come as one factor, sa * sb in sb, and sa none).
  using evt = fusion::Sm90EVT<
      fusion::Sm90Compute<add_and_store<ElementD>::template fn, ElementD, float, rn>,
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, rn>,
                      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, rn>,
                                      fusion::Sm90AccFetch, sb_node>,
                      sa_node>,
      bias_node>;

  // A (M x K) row-major, B (N x K) row-major, i.e. K x N column-major: both K-major ("TN").
  using layout_a = cutlass::layout::RowMajor;
  using layout_b = cutlass::layout::ColumnMajor;
  using layout_d = cutlass::layout::RowMajor;
  static constexpr int align_ab = 16 / sizeof(ElementA);
  static constexpr int align_d = 16 / sizeof(ElementD);

  using epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, tile, cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, acc_t, float, void, layout_d, align_d,
      ElementD, layout_d, align_d, epilogue_schedule, evt>::CollectiveOp;

  using mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, layout_a, align_ab, ElementB,
      layout_b, align_ab, acc_t, tile, cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename epilogue::SharedStorage))>,
      mainloop_schedule>::CollectiveOp;

  using kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, mainloop,
                                                      epilogue, cutlass::gemm::PersistentScheduler>;
  using gemm = cutlass::gemm::device::GemmUniversalAdapter<kernel>;
};

inline void check_status(cutlass::Status s, const char* what) {
  if (s != cutlass::Status::kSuccess)
    throw error(errc::device, std::string("scaled_matmul (cutlass): ") + what +
                                  " failed: " + cutlassGetStatusString(s));
}

template <class ElementA, class ElementB, class ElementD>
void run(const gemm_problem& p, const float* bias, const exec& ex) {
  using k = kernel_of<ElementA, ElementB, ElementD>;
  using gemm = typename k::gemm;
  using cute::_0;
  const cudaStream_t stream = stream_of(ex);

  typename gemm::GemmKernel::StrideA stride_a{};
  cute::get<0>(stride_a) = p.a.row_stride;
  cute::get<2>(stride_a) = p.a.row_stride * p.m; // one batch: never stepped, but TMA encodes it
  typename gemm::GemmKernel::StrideB stride_b{};
  cute::get<0>(stride_b) = p.b.row_stride;
  cute::get<2>(stride_b) = p.b.row_stride * p.n;
  typename gemm::GemmKernel::StrideD stride_d{};
  cute::get<0>(stride_d) = p.out_stride;
  cute::get<2>(stride_d) = p.out_stride * p.m;
  typename gemm::GemmKernel::StrideC stride_c = stride_d; // no C: ignored

  cutlass::KernelHardwareInfo hw;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&hw.device_id));
  hw.sm_count = sm_count();

  const float* sa = p.a.mode == scale_mode::none ? nullptr : p.a.scales;
  const float* sb = p.b.mode == scale_mode::none ? nullptr : p.b.scales;
  const bool sa_rows = p.a.mode == scale_mode::rows, sb_rows = p.b.mode == scale_mode::rows;
  std::optional<scratch> product;
  if (sa != nullptr && sb != nullptr && !sa_rows && !sb_rows) { // one factor sa * sb
    product.emplace(sizeof(float), stream);
    scale_product(sa, sb, product->as<float>(), ex);
    sb = product->as<float>();
    sa = nullptr;
  } else if (sb == nullptr && !sa_rows) { // sa alone: acc * sa
    sb = sa;
    sa = nullptr;
  }
  // Each node's arguments: its children's, then its own (empty for the compute nodes).
  typename k::evt::Arguments fusion_args{
      {                                                        // (acc * sb) * sa
       {{}, {sb, 1.0f, {_0{}, sb_rows, std::int64_t{0}}}, {}}, // acc * sb
       {sa, 1.0f, {sa_rows, _0{}, std::int64_t{0}}},           // sa
       {}},                                                    // multiplies
      {bias, 0.0f, {_0{}, bias != nullptr, std::int64_t{0}}},  // bias
      {}};                                                     // add_and_store

  // The fp8 mainloop's arguments end with mma_promotion_interval, left at CUTLASS's default (4).
  typename gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), 1},
      {static_cast<const ElementA*>(p.a.codes), stride_a, static_cast<const ElementB*>(p.b.codes),
       stride_b},
      {fusion_args, nullptr, stride_c, static_cast<ElementD*>(p.out), stride_d},
      hw};

  gemm op;
  check_status(op.can_implement(args), "can_implement");
  const std::size_t workspace_bytes = gemm::get_workspace_size(args);
  std::optional<scratch> workspace;
  if (workspace_bytes > 0)
    workspace.emplace(workspace_bytes, stream);
  check_status(op.initialize(args, workspace ? workspace->as<void>() : nullptr, stream),
               "initialize");
  check_status(op.run(stream), "run");
  check_launch("cutlass sm90 gemm");
}

// The three output types of one operand pair.
template <class ElementA, class ElementB>
void run_out(const gemm_problem& p, const float* bias, const exec& ex) {
  switch (p.out_type) {
  case dtype::float32: return run<ElementA, ElementB, float>(p, bias, ex);
  case dtype::bfloat16: return run<ElementA, ElementB, cutlass::bfloat16_t>(p, bias, ex);
  case dtype::float16: return run<ElementA, ElementB, cutlass::half_t>(p, bias, ex);
  default: break;
  }
  throw error(errc::invalid_type, "scaled_matmul (cutlass): out must be float32, bfloat16 or "
                                  "float16");
}

} // namespace lowbit::kernels::cuda::sm90
