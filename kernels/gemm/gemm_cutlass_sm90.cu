// The CUTLASS backend of the scaled matmul: CUTLASS 3 kernels for sm_90 (TMA loads, WGMMA,
// warp-specialized persistent schedules) whose epilogue visitor tree computes the rule of
// gemm.hpp in registers, so the dequantization and the bias cost no pass over the output:
//   D[m, n] = round(((float(acc[m, n]) * sa[m]) * sb[n]) + bias[n])
// Each node of the tree is one float32 operation rounded to nearest (the build has no FMA
// contraction), in the rule's order, so int8 results equal the CPU twin's bit for bit.
// Built for sm_90a only (cmake/cutlass.cmake): WGMMA and TMA exist in that target alone.
#if !defined(LOWBIT_WITH_CUTLASS_SM90)
#error "build this file through cmake/cutlass.cmake (it defines LOWBIT_WITH_CUTLASS_SM90)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/numeric_types.h>

#include "../common/cuda.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels::cuda {
namespace {

namespace fusion = cutlass::epilogue::fusion;
using cute::_0;
using cute::_1;
using cute::_128;
using cute::_2;
using cute::_256;
using cute::_64;
using cute::Shape;
using cute::Stride;

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

// One kernel per (operand element, output element): 3 x 3 instantiations in all, persistent,
// with clusters of 2 CTAs along M that share (multicast) each tile of B, which both need.
//   int8:   128 x 128 x 128 tiles (32 KiB of operands per stage), int32 accumulators, the
//           ping-pong schedule: each consumer warp group owns a whole tile, and one's epilogue
//           runs while the other's MMAs do, which matters at K = 1280 where the epilogue is a
//           large share of a tile's time.
//   16-bit: 128 x 256 x 64 tiles (48 KiB per stage), float32 accumulators, the cooperative
//           schedule: both consumer warp groups split one tile's M.
template <class ElementAB, class ElementD> struct sm90_kernel {
  static constexpr bool is_int8 = std::is_same_v<ElementAB, std::int8_t>;
  using acc_t = std::conditional_t<is_int8, std::int32_t, float>;
  using tile = std::conditional_t<is_int8, Shape<_128, _128, _128>, Shape<_128, _256, _64>>;
  using cluster = Shape<_2, _1, _1>;
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
  using col_stride = Stride<bool, _0, std::int64_t>;
  using row_stride = Stride<_0, bool, std::int64_t>;
  using sa_node = fusion::Sm90ColBroadcast<0, tile, float, float, col_stride, 1>;
  using sb_node = fusion::Sm90RowBroadcast<0, tile, float, float, row_stride, 1>;
  using bias_node = fusion::Sm90RowBroadcast<0, tile, float, float, row_stride, 1>;
  // ((float(acc) * sa) * sb) + bias, rounded to D's type at the root.
  using evt = fusion::Sm90EVT<
      fusion::Sm90Compute<add_and_store<ElementD>::template fn, ElementD, float, rn>,
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, rn>,
                      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, rn>,
                                      fusion::Sm90AccFetch, sa_node>,
                      sb_node>,
      bias_node>;

  // A (M x K) row-major, B (N x K) row-major, i.e. K x N column-major: both K-major ("TN").
  using layout_a = cutlass::layout::RowMajor;
  using layout_b = cutlass::layout::ColumnMajor;
  using layout_d = cutlass::layout::RowMajor;
  static constexpr int align_ab = 16 / sizeof(ElementAB);
  static constexpr int align_d = 16 / sizeof(ElementD);

  using epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, tile, cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, acc_t, float, void, layout_d, align_d,
      ElementD, layout_d, align_d, epilogue_schedule, evt>::CollectiveOp;

  using mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, layout_a, align_ab, ElementAB,
      layout_b, align_ab, acc_t, tile, cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename epilogue::SharedStorage))>,
      mainloop_schedule>::CollectiveOp;

  using kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, mainloop, epilogue,
                                                      cutlass::gemm::PersistentScheduler>;
  using gemm = cutlass::gemm::device::GemmUniversalAdapter<kernel>;
};

void check_status(cutlass::Status s, const char* what) {
  if (s != cutlass::Status::kSuccess)
    throw error(errc::device, std::string("scaled_matmul (cutlass): ") + what +
                                  " failed: " + cutlassGetStatusString(s));
}

// bias[n] widened exactly to float32 (bf16 and fp16 values are all float32 values).
__global__ void widen_bias(const std::uint16_t* in, bool is_bf16, float* out, std::int64_t n) {
  const std::int64_t step = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += step) {
    const std::uint16_t b = in[i];
    out[i] = is_bf16 ? __uint_as_float(std::uint32_t{b} << 16) : __half2float(__ushort_as_half(b));
  }
}

template <class ElementAB, class ElementD> void run(const gemm_problem& p, const exec& ex) {
  using k = sm90_kernel<ElementAB, ElementD>;
  using gemm = typename k::gemm;
  const cudaStream_t stream = stream_of(ex);

  // bias as float32: the caller's when it is float32 already, else widened into scratch.
  const float* bias = static_cast<const float*>(p.bias);
  std::optional<scratch> bias_buf;
  if (p.bias != nullptr && p.bias_type != dtype::float32) {
    bias_buf.emplace(p.n * sizeof(float), stream);
    widen_bias<<<grid_for(p.n, 256), 256, 0, stream>>>(static_cast<const std::uint16_t*>(p.bias),
                                                       p.bias_type == dtype::bfloat16,
                                                       bias_buf->as<float>(), p.n);
    check_launch("widen_bias");
    bias = bias_buf->as<float>();
  }

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
  // Each node's arguments: its children's, then its own (empty for the compute nodes).
  typename k::evt::Arguments fusion_args{
      {                                                        // (acc * sa) * sb
       {{}, {sa, 1.0f, {sa_rows, _0{}, std::int64_t{0}}}, {}}, // acc * sa
       {sb, 1.0f, {_0{}, sb_rows, std::int64_t{0}}},           // sb
       {}},                                                    // multiplies
      {bias, 0.0f, {_0{}, bias != nullptr, std::int64_t{0}}},  // bias
      {}};                                                     // add_and_store

  typename gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), 1},
      {static_cast<const ElementAB*>(p.a.codes), stride_a, static_cast<const ElementAB*>(p.b.codes),
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

template <class ElementAB> void run_out(const gemm_problem& p, const exec& ex) {
  switch (p.out_type) {
  case dtype::float32: return run<ElementAB, float>(p, ex);
  case dtype::bfloat16: return run<ElementAB, cutlass::bfloat16_t>(p, ex);
  case dtype::float16: return run<ElementAB, cutlass::half_t>(p, ex);
  default: break;
  }
  throw error(errc::invalid_type, "scaled_matmul (cutlass): out must be float32, bfloat16 or "
                                  "float16");
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
}

// Why the kernels cannot take p on the current device; empty when they can.
std::string refusal(const gemm_problem& p) {
  const int cc = once_per_device([](int dev) {
    cudaDeviceProp prop{};
    LOWBIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return prop.major * 10 + prop.minor;
  });
  // sm_90a code runs on compute capability 9.0 alone (not on later architectures).
  if (cc != 90)
    return "the CUTLASS kernels are built for sm_90a and need a device of compute capability "
           "9.0 (this one has " +
           std::to_string(cc / 10) + "." + std::to_string(cc % 10) + ")";
  if (p.a.elem != p.b.elem ||
      !(p.a.elem == gemm_elem::int8 || p.a.elem == gemm_elem::bf16 || p.a.elem == gemm_elem::f16))
    return "the CUTLASS kernels take int8 x int8, bfloat16 x bfloat16 or float16 x float16";
  if (p.out_type != dtype::float32 && p.out_type != dtype::bfloat16 && p.out_type != dtype::float16)
    return "out must be float32, bfloat16 or float16";
  if (p.m <= 0 || p.n <= 0 || p.k <= 0)
    return "empty problems launch no GEMM";
  // CUTLASS's problem shape holds int extents.
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX)
    return "M, N and K must each be at most " + std::to_string(INT_MAX);
  // TMA reads and writes whole 16-byte units: the base addresses of A, B and out must be 16-byte
  // aligned, and so must their row strides and the contiguous extents (K for A and B, N for out).
  const std::int64_t es = p.a.elem == gemm_elem::int8 ? 1 : 2;
  const std::int64_t os = static_cast<std::int64_t>(dtype_size(p.out_type));
  if (!aligned16(p.a.codes) || !aligned16(p.b.codes) || !aligned16(p.out))
    return "a, b and out must start at 16-byte aligned addresses";
  if ((p.k * es) % 16 != 0 || (p.a.row_stride * es) % 16 != 0 || (p.b.row_stride * es) % 16 != 0)
    return "K and the row strides of a and b must be multiples of 16 bytes (" +
           std::to_string(16 / es) + " elements)";
  if ((p.n * os) % 16 != 0 || (p.out_stride * os) % 16 != 0)
    return "N and out's row stride must be multiples of 16 bytes (" + std::to_string(16 / os) +
           " elements)";
  // TMA strides are below 2^40 bytes; the batch stride (rows x row stride) is the largest.
  constexpr std::int64_t tma_stride_limit = std::int64_t{1} << 40;
  if (p.a.row_stride * p.m * es >= tma_stride_limit ||
      p.b.row_stride * p.n * es >= tma_stride_limit || p.out_stride * p.m * os >= tma_stride_limit)
    return "an operand spans 2^40 bytes or more (TMA's limit)";
  return {};
}

} // namespace

bool cutlass_sm90_available(const gemm_problem& p) {
  return refusal(p).empty();
}

void cutlass_sm90_matmul(const gemm_problem& p, const exec& ex) {
  const std::string why = refusal(p);
  require(why.empty(), errc::unsupported, "scaled_matmul (cutlass): " + why);
  switch (p.a.elem) {
  case gemm_elem::int8: return run_out<std::int8_t>(p, ex);
  case gemm_elem::bf16: return run_out<cutlass::bfloat16_t>(p, ex);
  case gemm_elem::f16: return run_out<cutlass::half_t>(p, ex);
  default: break;
  }
  throw error(errc::invalid_type, "scaled_matmul (cutlass): operands must be int8, bfloat16 or "
                                  "float16");
}

} // namespace lowbit::kernels::cuda
