// The CUTLASS backend of the scaled matmul: which operand pairs and layouts the sm_90 kernels
// take (cutlass_sm90_available), and the dispatch to the kernel of each pair. The kernels are in
// gemm_cutlass_sm90.cuh, instantiated in gemm_cutlass_sm90_<elements>.cu (one translation unit per
// operand pair, compiled in parallel). Built for sm_90a only (cmake/cutlass.cmake).
#include "gemm_cutlass_sm90.cuh"

#include <climits>
#include <cstdint>
#include <optional>
#include <string>

namespace lowbit::kernels::cuda {
namespace {

// bias[n] widened exactly to float32 (bf16 and fp16 values are all float32 values).
__global__ void widen_bias(const std::uint16_t* in, bool is_bf16, float* out, std::int64_t n) {
  const std::int64_t step = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += step) {
    const std::uint16_t b = in[i];
    out[i] = is_bf16 ? __uint_as_float(std::uint32_t{b} << 16) : __half2float(__ushort_as_half(b));
  }
}

// The operand pairs with kernels: int8 x int8, the 16-bit pairs, and the fp8 pairs of the
// training techniques (E4M3 activations and weights; E5M2 gradients times E4M3 codes).
// e4m3 x e5m2 has none: every product of a gradient puts the gradient first (A), so it would only
// add three kernels' compile time.
bool has_kernel(gemm_elem a, gemm_elem b) {
  if (a == b)
    return a == gemm_elem::int8 || a == gemm_elem::bf16 || a == gemm_elem::f16 ||
           a == gemm_elem::e4m3;
  return a == gemm_elem::e5m2 && b == gemm_elem::e4m3;
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
  if (!has_kernel(p.a.elem, p.b.elem))
    return "the CUTLASS kernels take int8 x int8, bfloat16 x bfloat16, float16 x float16, "
           "e4m3 x e4m3 or e5m2 x e4m3 (a x b)";
  if (p.out_type != dtype::float32 && p.out_type != dtype::bfloat16 && p.out_type != dtype::float16)
    return "out must be float32, bfloat16 or float16";
  if (p.m <= 0 || p.n <= 0 || p.k <= 0)
    return "empty problems launch no GEMM";
  // CUTLASS's problem shape holds int extents.
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX)
    return "M, N and K must each be at most " + std::to_string(INT_MAX);
  // TMA reads and writes whole 16-byte units: the base addresses of A, B and out must be 16-byte
  // aligned, and so must their row strides and the contiguous extents (K for A and B, N for out).
  const auto es = static_cast<std::int64_t>(gemm_elem_size(p.a.elem)); // b's is the same
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
  require(why.empty(), errc::unsupported, [&] { return "scaled_matmul (cutlass): " + why; });
  const cudaStream_t stream = stream_of(ex);

  // bias as float32: the caller's when it is float32 already, else widened into scratch (the
  // epilogue's broadcast nodes read float32).
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

  switch (p.a.elem) {
  case gemm_elem::int8: return sm90::run_int8(p, bias, ex);
  case gemm_elem::bf16: return sm90::run_bf16(p, bias, ex);
  case gemm_elem::f16: return sm90::run_f16(p, bias, ex);
  case gemm_elem::e4m3: return sm90::run_e4m3_e4m3(p, bias, ex);
  case gemm_elem::e5m2: return sm90::run_e5m2_e4m3(p, bias, ex); // refusal: b is e4m3
  }
  throw error(errc::invalid_type, "scaled_matmul (cutlass): no kernel for these operands");
}

} // namespace lowbit::kernels::cuda
