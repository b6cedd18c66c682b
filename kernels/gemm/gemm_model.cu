// simt's model kernel: the register-aligned block_fixed_point accumulation models over fp8
// operands (the Hopper presets among them) in float32, with the functions of gemm_internal.hpp
// that the CPU twin runs too, instead of emu::accumulator's doubles one product at a time (simt's
// general kernel). Why the float32 arithmetic gives the model's bits: gemm_internal.hpp and
// docs/techniques/fp8-training.md, "The model in float32".
//
// A block of 256 threads takes a 128 x 64 tile of out, 8 x 4 outputs per thread, and stages 32
// values of K at a time through shared memory (the codes' values and keys, from 256-entry
// tables), the next stage's codes loaded while the current one computes. Per block of k
// products: pass 1, the largest key product; pass 2, the terms, one fused multiply-add each. A
// stage whose codes include NaN or Inf marks its tile for simt's general kernel, which the caller
// runs after this one over the marked tiles alone: NaN and Inf products are summed beside the
// blocks (emu::accumulator), a path too rare to specialise.
#include <cstdint>

#include "../common/cuda.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

constexpr int threads = 256;
constexpr int tm = 8, tn = 4; // outputs per thread: rows x columns
constexpr int bm = model_tile_m, bn = model_tile_n, bk = 32;
static_assert(bm == 16 * tm && bn == 16 * tn && bm * bk == threads * 16 && bn * bk == threads * 8);
constexpr std::uint32_t sign_bit = 0x80000000u, exponent_bits = 0x7F800000u;

struct smem_layout {
  float av[bk][bm], akey[bk][bm]; // A's values and keys (gemm_model_key), k-major
  float bv[bk][bn], bkey[bk][bn];
  float a_value[256], a_key[256], b_value[256], b_key[256]; // code -> value, key
};

// Where A's rows are read 16 codes and B's 8 at a time (aligned rows).
struct load_widths {
  bool a_wide, b_wide;
};

__device__ inline float as_float(std::uint32_t u) {
  return __uint_as_float(u);
}
__device__ inline std::uint32_t bits_of(float x) {
  return __float_as_uint(x);
}

// x ^ y ^ z in one instruction. Written as PTX: from C++, the compiler folds the sign masks of
// x and y into every product's XOR and spends two instructions per product.
__device__ inline std::uint32_t xor3(std::uint32_t x, std::uint32_t y, std::uint32_t z) {
#ifdef __CUDA_ARCH__
  std::uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(r) : "r"(x), "r"(y), "r"(z));
  return r;
#else
  return x ^ y ^ z;
#endif
}

// A thread's N consecutive values of row k of a k-major stage array, in N / 4 16-byte loads.
template <int N, int Cols>
__device__ inline void fragment(const float (*src)[Cols], int k, int at, float (&out)[N]) {
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 v = *reinterpret_cast<const float4*>(&src[k][at + 4 * q]);
    out[4 * q] = v.x;
    out[4 * q + 1] = v.y;
    out[4 * q + 2] = v.z;
    out[4 * q + 3] = v.w;
  }
}

// a * b rounded to its block's grid 2^q (toward zero, or to nearest even), ms = M = 2^(q + 23)
// with the sign of a * b: fma(a, b, M) lies in [|M|, 2|M|), where float32's spacing is 2^q
// (|a b| < 2^(e_max + 2) <= 2^(q + 23)), so the fused multiply-add's one rounding is the term's,
// and fma(a, b, M) - M is the term, exactly.
template <bool Nearest> __device__ inline float grid_term(float a, float b, float ms) {
  return (Nearest ? __fmaf_rn(a, b, ms) : __fmaf_rz(a, b, ms)) - ms;
}

// Stage loading: A's 128 rows x 32 codes (16 per thread), B's 64 x 32 (8 per thread), zeros
// outside the problem.
template <int N> struct codes { std::uint8_t c[N]; };

template <int N>
__device__ inline void load_codes(codes<N>& r, const std::uint8_t* base, std::int64_t rows,
                                  std::int64_t stride, std::int64_t row, std::int64_t k,
                                  std::int64_t kk, bool wide) {
  if (row < rows && wide && kk + N <= k) {
    const std::uint8_t* at = base + row * stride + kk;
    if constexpr (N == 16) {
      const uint4 v = *reinterpret_cast<const uint4*>(at);
      *reinterpret_cast<uint4*>(r.c) = v;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(at);
      *reinterpret_cast<uint2*>(r.c) = v;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < N; ++j)
    r.c[j] = row < rows && kk + j < k ? base[row * stride + kk + j] : std::uint8_t{0};
}

// The codes' values and powers of two into the k-major stage; true where a code is NaN or Inf.
template <int N, int Rows>
__device__ inline bool store_codes(const codes<N>& r, float (*val)[Rows], float (*pw)[Rows],
                                   const float* value, const float* pow2, int row, int kk) {
  bool special = false;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float p = pow2[r.c[j]];
    special |= p < 0.0f;
    val[kk + j][row] = p < 0.0f ? 0.0f : value[r.c[j]];
    pw[kk + j][row] = p < 0.0f ? 0.0f : p;
  }
  return special;
}

template <bool Promote, bool Blocked, bool NearestTerms>
__global__ void __launch_bounds__(threads, 1)
    model_kernel(const gemm_problem p, const gemm_model_args ma, const load_widths lw,
                 std::int64_t tiles_n, std::uint8_t* __restrict__ redo) {
  extern __shared__ float4 smem_raw[];
  smem_layout& sm = *reinterpret_cast<smem_layout*>(smem_raw);
  const int t = static_cast<int>(threadIdx.x);
  {
    const auto code = static_cast<std::uint8_t>(t);
    const emu::product_exponent rule = p.accumulation.exponent;
    const float va = gemm_value(p.a.elem, &code, 0), vb = gemm_value(p.b.elem, &code, 0);
    sm.a_value[t] = va;
    sm.b_value[t] = vb;
    sm.a_key[t] = gemm_model_key(va, gemm_min_exponent(p.a.elem), rule);
    sm.b_key[t] = gemm_model_key(vb, gemm_min_exponent(p.b.elem), rule);
  }
  const std::int64_t m0 = (static_cast<std::int64_t>(blockIdx.x) / tiles_n) * bm;
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) % tiles_n) * bn;
  const int tx = t % 16, ty = t / 16;
  const auto* a_codes = static_cast<const std::uint8_t*>(p.a.codes);
  const auto* b_codes = static_cast<const std::uint8_t*>(p.b.codes);
  const bool a_wide = lw.a_wide, b_wide = lw.b_wide;
  const int a_row = t / 2, a_k = (t % 2) * 16, b_row = t / 4, b_k = (t % 4) * 8;

  float part[tm][tn], acc[tm][tn], total[tm][tn];
#pragma unroll
  for (int i = 0; i < tm; ++i)
#pragma unroll
    for (int j = 0; j < tn; ++j)
      part[i][j] = acc[i][j] = total[i][j] = 0.0f;
  int since = 0; // blocks since the last promotion (the same for every output)
  std::int64_t in_kblock = 0, kblock_index = 0;
  bool any_kblock = false;

  // The end of a block scale's K block (Blocked): the accumulator's finish() into the total.
  const auto end_kblock = [&] {
#pragma unroll
    for (int i = 0; i < tm; ++i)
#pragma unroll
      for (int j = 0; j < tn; ++j) {
        float r = part[i][j];
        if constexpr (Promote)
          r = since > 0 ? acc[i][j] + part[i][j] : acc[i][j];
        const std::int64_t m = m0 + ty * tm + i, n = n0 + tx * tn + j;
        if (m < p.m && n < p.n) {
          float s = r * gemm_block_scale(p.b, n, kblock_index);
          s = s * gemm_block_scale(p.a, m, kblock_index);
          total[i][j] = any_kblock ? total[i][j] + s : s;
        }
        part[i][j] = acc[i][j] = 0.0f;
      }
    any_kblock = true;
    since = 0;
    in_kblock = 0;
    ++kblock_index;
  };

  codes<16> ra;
  codes<8> rb;
  load_codes(ra, a_codes, p.m, p.a.row_stride, m0 + a_row, p.k, a_k, a_wide);
  load_codes(rb, b_codes, p.n, p.b.row_stride, n0 + b_row, p.k, b_k, b_wide);
  __syncthreads(); // the tables
  bool special_tile = false;
  for (std::int64_t k0 = 0; k0 < p.k; k0 += bk) {
    bool special = store_codes(ra, sm.av, sm.akey, sm.a_value, sm.a_key, a_row, a_k);
    special |= store_codes(rb, sm.bv, sm.bkey, sm.b_value, sm.b_key, b_row, b_k);
    if (__syncthreads_or(special)) {
      special_tile = true;
      break;
    }
    if (k0 + bk < p.k) { // the next stage's codes, in flight while this one computes
      load_codes(ra, a_codes, p.m, p.a.row_stride, m0 + a_row, p.k, k0 + bk + a_k, a_wide);
      load_codes(rb, b_codes, p.n, p.b.row_stride, n0 + b_row, p.k, k0 + bk + b_k, b_wide);
    }
    for (int s = 0; s < bk && k0 + s < p.k; s += ma.block) {
      // Pass 1: the block's largest key product, the register's power of two among them.
      float mx[tm][tn];
#pragma unroll
      for (int i = 0; i < tm; ++i)
#pragma unroll
        for (int j = 0; j < tn; ++j)
          mx[i][j] = as_float(bits_of(part[i][j]) & exponent_bits);
      for (int k = s; k < s + ma.block; ++k) {
        float pa[tm], pb[tn];
        fragment(sm.akey, k, ty * tm, pa);
        fragment(sm.bkey, k, tx * tn, pb);
#pragma unroll
        for (int i = 0; i < tm; ++i)
#pragma unroll
          for (int j = 0; j < tn; ++j)
            mx[i][j] = fmaxf(mx[i][j], fabsf(pa[i] * pb[j]));
      }
      // M = 2^(e_max - f + 23) (its bits replace mx's), and the register's aligned term.
      std::uint32_t big[tm][tn];
      float sum[tm][tn];
#pragma unroll
      for (int i = 0; i < tm; ++i)
#pragma unroll
        for (int j = 0; j < tn; ++j) {
          big[i][j] = gemm_model_big(mx[i][j], ma);
          const float ms = as_float(big[i][j] | (bits_of(part[i][j]) & sign_bit));
          sum[i][j] = grid_term<NearestTerms>(part[i][j], 1.0f, ms);
        }
      // Pass 2: the products' terms, each rounded to the grid by one fused multiply-add.
      for (int k = s; k < s + ma.block; ++k) {
        float va[tm], vb[tn];
        fragment(sm.av, k, ty * tm, va);
        fragment(sm.bv, k, tx * tn, vb);
        std::uint32_t sa[tm], sb[tn];
#pragma unroll
        for (int i = 0; i < tm; ++i)
          sa[i] = bits_of(va[i]) & sign_bit;
#pragma unroll
        for (int j = 0; j < tn; ++j)
          sb[j] = bits_of(vb[j]) & sign_bit;
#pragma unroll
        for (int i = 0; i < tm; ++i)
#pragma unroll
          for (int j = 0; j < tn; ++j) {
            const float ms = as_float(xor3(sa[i], sb[j], big[i][j]));
            sum[i][j] = sum[i][j] + grid_term<NearestTerms>(va[i], vb[j], ms);
          }
      }
      // The block's sum (a multiple of 2^q) into the register: 0 where the block had no
      // product and the register was 0.
#pragma unroll
      for (int i = 0; i < tm; ++i)
#pragma unroll
        for (int j = 0; j < tn; ++j)
          part[i][j] = gemm_model_register(sum[i][j], ma);
      if constexpr (Promote) {
        if (++since == ma.promote_every) {
#pragma unroll
          for (int i = 0; i < tm; ++i)
#pragma unroll
            for (int j = 0; j < tn; ++j) {
              acc[i][j] = acc[i][j] + part[i][j];
              part[i][j] = 0.0f;
            }
          since = 0;
        }
      }
      if constexpr (Blocked) {
        in_kblock += ma.block;
        if (in_kblock == p.kblock)
          end_kblock();
      }
    }
    __syncthreads();
  }
  if (special_tile) {
    if (t == 0) {
      redo[0] = 1;
      redo[1 + blockIdx.x] = 1;
    }
    return;
  }
  if constexpr (Blocked)
    if (in_kblock > 0)
      end_kblock();
#pragma unroll
  for (int i = 0; i < tm; ++i)
#pragma unroll
    for (int j = 0; j < tn; ++j) {
      const std::int64_t m = m0 + ty * tm + i, n = n0 + tx * tn + j;
      if (m >= p.m || n >= p.n)
        continue;
      if constexpr (Blocked) {
        gemm_finish_blocks(p, m, n, total[i][j]);
      } else {
        float r = part[i][j];
        if constexpr (Promote)
          r = since > 0 ? acc[i][j] + part[i][j] : acc[i][j];
        gemm_finish(p, m, n, r);
      }
    }
}

template <bool Promote, bool Blocked, bool NearestTerms>
void launch(const gemm_problem& p, const gemm_model_args& ma, const load_widths& lw,
            std::uint8_t* redo, cudaStream_t s) {
  constexpr auto kernel = model_kernel<Promote, Blocked, NearestTerms>;
  constexpr int smem = static_cast<int>(sizeof(smem_layout));
  resident_blocks<kernel>(threads, smem); // opts in to smem bytes of shared memory
  const std::int64_t tiles_n = (p.n + bn - 1) / bn;
  const std::int64_t tiles = ((p.m + bm - 1) / bm) * tiles_n;
  kernel<<<static_cast<unsigned>(tiles), threads, smem, s>>>(p, ma, lw, tiles_n, redo);
  check_launch("model_kernel");
}

template <bool Promote, bool Blocked>
void launch_terms(const gemm_problem& p, const gemm_model_args& ma, const load_widths& lw,
                  std::uint8_t* redo, cudaStream_t s) {
  if (ma.nearest_terms)
    launch<Promote, Blocked, true>(p, ma, lw, redo, s);
  else
    launch<Promote, Blocked, false>(p, ma, lw, redo, s);
}

} // namespace

bool model_kernel_takes(const gemm_problem& p) {
  // One block per tile: the grid holds at most 2^31 - 1 blocks.
  const std::int64_t tiles = ((p.m + bm - 1) / bm) * ((p.n + bn - 1) / bn);
  return gemm_model_takes(p) && tiles <= 2147483647;
}

void model_matmul(const gemm_problem& p, std::uint8_t* redo, const exec& ex) {
  const gemm_model_args ma = gemm_model_args_of(p.accumulation);
  const load_widths lw{p.a.row_stride % 16 == 0 && aligned_to<std::uint8_t>(p.a.codes, 16),
                       p.b.row_stride % 8 == 0 && aligned_to<std::uint8_t>(p.b.codes, 8)};
  const cudaStream_t s = stream_of(ex);
  const bool promote = ma.promote_every > 0, blocked = p.kblock > 0;
  if (promote && blocked)
    launch_terms<true, true>(p, ma, lw, redo, s);
  else if (promote)
    launch_terms<true, false>(p, ma, lw, redo, s);
  else if (blocked)
    launch_terms<false, true>(p, ma, lw, redo, s);
  else
    launch_terms<false, false>(p, ma, lw, redo, s);
}

} // namespace lowbit::kernels::cuda
