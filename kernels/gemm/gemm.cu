// The scaled matmul's CUDA-core kernels: simt (the CPU twin's order, bit-identical to it), the
// unfused epilogue that ends the cuBLASLt paths, and the exact widening of fp8 codes to 16-bit
// values for the tensor cores of GPUs without fp8 (or where cuBLASLt's fp8 cannot take the
// problem).
#include <type_traits>

#include "../common/cuda.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels::cuda {

int compute_capability() {
  return once_per_device([](int dev) {
    int major = 0, minor = 0;
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major * 10 + minor;
  });
}

namespace {

// The simt kernel: a block computes a tile x tile patch of out, one output per thread, staging
// tk columns of A's and B's rows through shared memory; each output's sum still runs k = 0, 1,
// ..., K-1 in order, one product and one addition at a time (the library builds with
// --fmad=false), which is the CPU twin's arithmetic.
constexpr int tile = 16;
constexpr int tk = 32;
constexpr int simt_threads = tile * tile;

template <bool Int>
__global__ void __launch_bounds__(simt_threads)
    simt_kernel(const gemm_problem p, std::int64_t tiles_n, std::int64_t tiles) {
  using acc_t = std::conditional_t<Int, int, float>;
  // One column of padding: the B reads sb[tx][c] of a warp fall in distinct banks.
  __shared__ acc_t sa[tile][tk + 1];
  __shared__ acc_t sb[tile][tk + 1];
  const int tx = static_cast<int>(threadIdx.x) % tile, ty = static_cast<int>(threadIdx.x) / tile;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t m0 = (t / tiles_n) * tile, n0 = (t % tiles_n) * tile;
    const std::int64_t m = m0 + ty, n = n0 + tx;
    acc_t acc = 0;
    for (std::int64_t k0 = 0; k0 < p.k; k0 += tk) {
      for (int i = static_cast<int>(threadIdx.x); i < tile * tk; i += simt_threads) {
        const int r = i / tk, c = i % tk;
        const std::int64_t kk = k0 + c, ra = m0 + r, rb = n0 + r;
        if constexpr (Int) {
          const auto* a = static_cast<const std::int8_t*>(p.a.codes);
          const auto* b = static_cast<const std::int8_t*>(p.b.codes);
          sa[r][c] = ra < p.m && kk < p.k ? int{a[ra * p.a.row_stride + kk]} : 0;
          sb[r][c] = rb < p.n && kk < p.k ? int{b[rb * p.b.row_stride + kk]} : 0;
        } else {
          sa[r][c] =
              ra < p.m && kk < p.k ? gemm_value(p.a.elem, p.a.codes, ra * p.a.row_stride + kk) : 0;
          sb[r][c] =
              rb < p.n && kk < p.k ? gemm_value(p.b.elem, p.b.codes, rb * p.b.row_stride + kk) : 0;
        }
      }
      __syncthreads();
      const int kn = p.k - k0 < tk ? static_cast<int>(p.k - k0) : tk;
      for (int c = 0; c < kn; ++c) {
        const acc_t prod = sa[ty][c] * sb[tx][c];
        acc = acc + prod;
      }
      __syncthreads();
    }
    if (m < p.m && n < p.n) {
      if (p.k == 0)
        gemm_empty_k(p, m, n);
      else
        gemm_finish(p, m, n, static_cast<float>(acc));
    }
  }
}

template <bool Int>
__global__ void finish_kernel(const gemm_problem p, const void* __restrict__ acc,
                              std::int64_t acc_ld) {
  const std::int64_t total = p.m * p.n;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t m = i / p.n, n = i % p.n;
    float v;
    if constexpr (Int)
      v = static_cast<float>(static_cast<const std::int32_t*>(acc)[m * acc_ld + n]);
    else
      v = static_cast<const float*>(acc)[m * acc_ld + n];
    gemm_finish(p, m, n, v);
  }
}

// dst (rows x ld, 16-bit storage) = the exact 16-bit value of each fp8 code; columns K..ld-1 are
// zero. Every e4m3fn and e5m2 value (NaN and Inf included) is a bfloat16 and a float16 value.
__global__ void widen_kernel(const std::uint8_t* __restrict__ src, std::int64_t src_stride,
                             gemm_elem from, std::int64_t rows, std::int64_t k, std::int64_t ld,
                             bool to_bf16, std::uint16_t* __restrict__ dst) {
  constexpr emu::format bf = emu::bfloat16, hf = emu::float16;
  const std::int64_t total = rows * ld;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / ld, c = i % ld;
    std::uint16_t w = 0;
    if (c < k) {
      const float v = gemm_value(from, src, r * src_stride + c);
      w = static_cast<std::uint16_t>(to_bf16 ? emu::encode(bf, v, emu::policy{})
                                             : emu::encode(hf, v, emu::policy{}));
    }
    dst[i] = w;
  }
}

__global__ void broadcast_kernel(const float* __restrict__ s, scale_mode mode, std::int64_t n,
                                 float* __restrict__ dst) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    dst[i] = gemm_scale(s, mode, i);
}

std::int64_t round_up(std::int64_t x, std::int64_t to) {
  return (x + to - 1) / to * to;
}

} // namespace

void simt_matmul(const gemm_problem& p, const exec& ex) {
  if (p.m == 0 || p.n == 0)
    return;
  const std::int64_t tiles_n = (p.n + tile - 1) / tile;
  const std::int64_t tiles = ((p.m + tile - 1) / tile) * tiles_n;
  const unsigned grid = grid_for(tiles, 1, 8);
  if (p.a.elem == gemm_elem::int8)
    simt_kernel<true><<<grid, simt_threads, 0, stream_of(ex)>>>(p, tiles_n, tiles);
  else
    simt_kernel<false><<<grid, simt_threads, 0, stream_of(ex)>>>(p, tiles_n, tiles);
  check_launch("simt_kernel");
}

void finish_matmul(const gemm_problem& p, const void* acc, bool acc_is_int, std::int64_t acc_ld,
                   const exec& ex) {
  if (p.m == 0 || p.n == 0)
    return;
  constexpr int threads = 256;
  const unsigned grid = grid_for(p.m * p.n, threads);
  if (acc_is_int)
    finish_kernel<true><<<grid, threads, 0, stream_of(ex)>>>(p, acc, acc_ld);
  else
    finish_kernel<false><<<grid, threads, 0, stream_of(ex)>>>(p, acc, acc_ld);
  check_launch("finish_kernel");
}

void broadcast_scales(const float* s, scale_mode mode, std::int64_t n, float* dst, const exec& ex) {
  if (n == 0)
    return;
  constexpr int threads = 256;
  broadcast_kernel<<<grid_for(n, threads), threads, 0, stream_of(ex)>>>(s, mode, n, dst);
  check_launch("broadcast_kernel");
}

void widened_matmul(const gemm_problem& p, const exec& ex) {
  if (p.m == 0 || p.n == 0)
    return;
  // bfloat16 where its tensor cores exist (sm_80+), float16 before: both hold every fp8 value.
  const bool to_bf16 = compute_capability() >= 80;
  const std::int64_t ld = round_up(p.k, 8); // 16-byte rows for the tensor-core paths
  const cudaStream_t s = stream_of(ex);
  scratch wa(static_cast<std::size_t>(p.m * ld) * 2, s),
      wb(static_cast<std::size_t>(p.n * ld) * 2, s);
  constexpr int threads = 256;
  widen_kernel<<<grid_for(p.m * ld, threads), threads, 0, s>>>(
      static_cast<const std::uint8_t*>(p.a.codes), p.a.row_stride, p.a.elem, p.m, p.k, ld, to_bf16,
      wa.as<std::uint16_t>());
  check_launch("widen_kernel");
  widen_kernel<<<grid_for(p.n * ld, threads), threads, 0, s>>>(
      static_cast<const std::uint8_t*>(p.b.codes), p.b.row_stride, p.b.elem, p.n, p.k, ld, to_bf16,
      wb.as<std::uint16_t>());
  check_launch("widen_kernel");

  gemm_problem q = p;
  const gemm_elem w = to_bf16 ? gemm_elem::bf16 : gemm_elem::f16;
  q.a.codes = wa.as<std::uint16_t>();
  q.b.codes = wb.as<std::uint16_t>();
  q.a.row_stride = q.b.row_stride = ld;
  q.a.elem = q.b.elem = w;
  if (cutlass_sm90_available(q))
    return cutlass_sm90_matmul(q, ex);
  if (cublaslt_refusal(q).empty()) {
    try {
      return cublaslt_matmul(q, ex);
    } catch (const error& e) {
      if (e.code() != errc::unsupported)
        throw;
      // cuBLASLt found no algorithm: the CUDA cores take the widened operands (same values).
    }
  }
  simt_matmul(q, ex);
}

} // namespace lowbit::kernels::cuda
