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

// Stands in for the accumulator where no model is asked for: the default kernel keeps no buffer.
struct no_model {};

// Model: the sum runs through p.accumulation's emu::accumulator (the twin's object, fed the same
// products in the same order) instead of acc = acc + prod. Blocked: block scales along K (the
// blocked rule of gemm.hpp): every p.kblock products the block's sum is scaled into the float32
// total and the sum starts afresh, as the twin does.
// redo (Model only; null: every tile): after the model kernel, which marks in redo[1 + t] the
// tiles t of its grid (model_tile_m x model_tile_n, redo_tiles_n along N) whose operands hold
// NaN or Inf, and sets redo[0] when it marked any: only those tiles run here.
template <bool Int, bool Model = false, bool Blocked = false>
__global__ void __launch_bounds__(simt_threads)
    simt_kernel(const gemm_problem p, std::int64_t tiles_n, std::int64_t tiles,
                const std::uint8_t* redo, std::int64_t redo_tiles_n) {
  using acc_t = std::conditional_t<Int, int, float>;
  // One column of padding: the B reads sb[tx][c] of a warp fall in distinct banks.
  __shared__ acc_t sa[tile][tk + 1];
  __shared__ acc_t sb[tile][tk + 1];
  const int tx = static_cast<int>(threadIdx.x) % tile, ty = static_cast<int>(threadIdx.x) / tile;
  if (redo != nullptr && redo[0] == 0)
    return;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t m0 = (t / tiles_n) * tile, n0 = (t % tiles_n) * tile;
    if (redo != nullptr && redo[1 + (m0 / model_tile_m) * redo_tiles_n + n0 / model_tile_n] == 0)
      continue;
    const std::int64_t m = m0 + ty, n = n0 + tx;
    acc_t acc = 0;
    auto model = [&] {
      if constexpr (Model)
        return gemm_accumulator(p);
      else
        return no_model{};
    }();
    const bool inside = m < p.m && n < p.n; // only these read scales
    gemm_block_total total;
    std::int64_t in_block = 0, block = 0;
    const auto end_block = [&]() {
      float sum;
      if constexpr (Model) {
        sum = model.finish();
        model.restart();
      } else {
        sum = static_cast<float>(acc);
        acc = 0;
      }
      if (inside)
        total.add(sum, gemm_block_scale(p.a, m, block), gemm_block_scale(p.b, n, block));
      in_block = 0;
      ++block;
    };
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
        // The model takes the operands (a Hopper-like model places a product by their exponents).
        if constexpr (Model)
          model.add(sa[ty][c], sb[tx][c]);
        else
          acc = acc + sa[ty][c] * sb[tx][c];
        if constexpr (Blocked)
          if (++in_block == p.kblock)
            end_block();
      }
      __syncthreads();
    }
    if constexpr (Blocked)
      if (in_block > 0)
        end_block();
    if (inside) {
      if (p.k == 0)
        gemm_empty_k(p, m, n);
      else if constexpr (Blocked)
        gemm_finish_blocks(p, m, n, total.total);
      else if constexpr (Model)
        gemm_finish(p, m, n, model.finish());
      else
        gemm_finish(p, m, n, static_cast<float>(acc));
    }
  }
}

// The unfused epilogue: acc's rows are 16-byte aligned (acc_ld a multiple of 4, the scratch
// 256-byte aligned), so a thread reads four sums in one 16-byte load, and where out's rows allow
// (wide_out: out aligned to four elements, its stride a multiple of 4) writes the four results in
// one 8- or 16-byte store. One grid-stride loop over all (row, quad) pairs keeps every thread
// busy whatever N is (one division per four outputs), and a warp's loads and stores are
// contiguous. The arithmetic is gemm_finish's.
template <bool Int, class Out>
__global__ void finish_kernel(const gemm_problem p, const void* __restrict__ acc,
                              std::int64_t acc_ld, bool wide_out) {
  using acc_t = std::conditional_t<Int, std::int32_t, float>;
  const std::int64_t quads = (p.n + 3) / 4, total = p.m * quads;
  const bool scalar = gemm_scalar_scales(p);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t m = i / quads, q = i - m * quads;
    const auto* row =
        reinterpret_cast<const vec<acc_t, 4>*>(static_cast<const acc_t*>(acc) + m * acc_ld);
    const float sa = gemm_scale(p.a.scales, p.a.mode, m);
    Out* out = static_cast<Out*>(p.out) + m * p.out_stride;
    const vec<acc_t, 4> v = row[q];
    const std::int64_t n0 = q * 4;
    vec<Out, 4> w;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t n = n0 + j < p.n ? n0 + j : p.n - 1; // past the end: not stored
      const float r =
          gemm_epilogue(static_cast<float>(v.v[j]), sa, gemm_scale(p.b.scales, p.b.mode, n),
                        gemm_bias(p.bias, p.bias_type, n), scalar);
      gemm_store(w.v, p.out_type, j, r);
    }
    if (wide_out && n0 + 4 <= p.n) {
      *reinterpret_cast<vec<Out, 4>*>(out + n0) = w;
    } else {
      for (int j = 0; j < 4 && n0 + j < p.n; ++j)
        out[n0 + j] = w.v[j];
    }
  }
}

template <bool Int>
void launch_finish(const gemm_problem& p, const void* acc, std::int64_t acc_ld, cudaStream_t s) {
  constexpr int threads = 256;
  const unsigned grid = grid_for(p.m * ((p.n + 3) / 4), threads);
  const std::size_t osize = dtype_size(p.out_type);
  const bool wide_out = aligned_to<float>(p.out, 4 * osize) && (p.m <= 1 || p.out_stride % 4 == 0);
  if (osize == 2)
    finish_kernel<Int, std::uint16_t><<<grid, threads, 0, s>>>(p, acc, acc_ld, wide_out);
  else
    finish_kernel<Int, float><<<grid, threads, 0, s>>>(p, acc, acc_ld, wide_out);
  check_launch("finish_kernel");
}

// dst (rows x ld, 16-bit storage) = the exact 16-bit value of each fp8 code; columns K..ld-1 are
// zero. Every e4m3fn and e5m2 value (NaN and Inf included) is a bfloat16 and a float16 value.
// ld is a multiple of 8: a thread writes eight values in one 16-byte store, reading the eight
// codes in one 8-byte load where the source row allows it; the values come from a 256-entry
// table in shared memory, built once per block. One grid-stride loop over all (row, group)
// pairs keeps every thread busy whatever K is (one division per eight values).
constexpr int widen_threads = 256;
__global__ void __launch_bounds__(widen_threads)
    widen_kernel(const std::uint8_t* __restrict__ src, std::int64_t src_stride, gemm_elem from,
                 std::int64_t rows, std::int64_t k, std::int64_t ld, bool to_bf16,
                 std::uint16_t* __restrict__ dst) {
  constexpr emu::format bf = emu::bfloat16, hf = emu::float16;
  __shared__ std::uint16_t table[256];
  {
    const std::uint8_t code = static_cast<std::uint8_t>(threadIdx.x);
    const float v = gemm_value(from, &code, 0);
    table[threadIdx.x] = static_cast<std::uint16_t>(to_bf16 ? emu::encode(bf, v, emu::policy{})
                                                            : emu::encode(hf, v, emu::policy{}));
  }
  __syncthreads();
  using out8 = vec<std::uint16_t, 8>;
  using in8 = vec<std::uint8_t, 8>;
  const std::int64_t groups = ld / 8;
  const bool wide_reads = reinterpret_cast<std::uintptr_t>(src) % 8 == 0 && src_stride % 8 == 0;
  const std::int64_t total = rows * groups;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / groups, g = i - r * groups;
    const std::uint8_t* row = src + r * src_stride;
    out8* out = reinterpret_cast<out8*>(dst + r * ld);
    const std::int64_t c0 = g * 8;
    out8 w;
    if (wide_reads && c0 + 8 <= k) {
      const in8 codes = reinterpret_cast<const in8*>(row)[g];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        w.v[j] = table[codes.v[j]];
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        w.v[j] = c0 + j < k ? table[row[c0 + j]] : std::uint16_t{0};
    }
    out[g] = w;
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
  const bool model = p.accumulation.kind != emu::accumulation_kind::fp32_sequential;
  const cudaStream_t s = stream_of(ex);
  const bool blocked = p.kblock > 0 && p.k > 0;
  if (model && model_kernel_takes(p)) {
    // The model kernel, then the general one over the tiles it left (NaN or Inf operands).
    const std::int64_t redo_tiles_n = (p.n + model_tile_n - 1) / model_tile_n;
    const std::int64_t redo_tiles = ((p.m + model_tile_m - 1) / model_tile_m) * redo_tiles_n;
    scratch redo(static_cast<std::size_t>(1 + redo_tiles), s);
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(redo.as<std::uint8_t>(), 0, 1 + redo_tiles, s));
    model_matmul(p, redo.as<std::uint8_t>(), ex);
    if (blocked)
      simt_kernel<false, true, true>
          <<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, redo.as<std::uint8_t>(), redo_tiles_n);
    else
      simt_kernel<false, true>
          <<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, redo.as<std::uint8_t>(), redo_tiles_n);
    check_launch("simt_kernel");
    return;
  }
  if (blocked) {
    if (p.a.elem == gemm_elem::int8)
      simt_kernel<true, false, true><<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, nullptr, 0);
    else if (model)
      simt_kernel<false, true, true><<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, nullptr, 0);
    else
      simt_kernel<false, false, true><<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, nullptr, 0);
  } else if (p.a.elem == gemm_elem::int8)
    simt_kernel<true><<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, nullptr, 0);
  else if (model)
    simt_kernel<false, true><<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, nullptr, 0);
  else
    simt_kernel<false><<<grid, simt_threads, 0, s>>>(p, tiles_n, tiles, nullptr, 0);
  check_launch("simt_kernel");
}

void finish_matmul(const gemm_problem& p, const void* acc, bool acc_is_int, std::int64_t acc_ld,
                   const exec& ex) {
  if (p.m == 0 || p.n == 0)
    return;
  require(acc_ld % 4 == 0 && aligned_to<float>(acc, 16), errc::invalid_argument,
          "finish_matmul: acc must be 16-byte aligned with a row stride in multiples of 4");
  if (acc_is_int)
    launch_finish<true>(p, acc, acc_ld, stream_of(ex));
  else
    launch_finish<false>(p, acc, acc_ld, stream_of(ex));
}

void broadcast_scales(const float* s, scale_mode mode, std::int64_t n, float* dst, const exec& ex) {
  if (n == 0)
    return;
  constexpr int threads = 256;
  broadcast_kernel<<<grid_for(n, threads), threads, 0, stream_of(ex)>>>(s, mode, n, dst);
  check_launch("broadcast_kernel");
}

__global__ void scale_product_kernel(const float* sa, const float* sb, float* s) {
  s[0] = sa[0] * sb[0];
}

void scale_product(const float* sa, const float* sb, float* s, const exec& ex) {
  scale_product_kernel<<<1, 1, 0, stream_of(ex)>>>(sa, sb, s);
  check_launch("scale_product_kernel");
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
  widen_kernel<<<grid_for(p.m * (ld / 8), widen_threads), widen_threads, 0, s>>>(
      static_cast<const std::uint8_t*>(p.a.codes), p.a.row_stride, p.a.elem, p.m, p.k, ld, to_bf16,
      wa.as<std::uint16_t>());
  check_launch("widen_kernel");
  widen_kernel<<<grid_for(p.n * (ld / 8), widen_threads), widen_threads, 0, s>>>(
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
