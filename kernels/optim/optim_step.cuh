// The CUDA kernels of the fused optimizer steps and their launcher (optim.cu has the plan);
// launch_step<K> is instantiated for a few optimizers per translation unit (optim_adam.cu,
// optim_stable.cu, optim_lamb.cu, optim_misc.cu), and launch_step3<K>, the form of three states,
// for the optimizers that have one (optim_three.cu), so that they compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "../common/cuda.hpp"
#include "optim_internal.hpp"
#include "optim_step.hpp"

namespace lowbit::kernels::cuda {

namespace {

namespace d = optim_detail;
namespace bops = blockwise_ops;

constexpr int warps = optim_threads / 32;
constexpr int EPT = optim_per_lane;

__device__ std::int64_t tensor_of(const optim_item* items, std::int64_t count, std::int64_t wb) {
  std::int64_t lo = 0, hi = count; // the last item with block0 <= wb: in [lo, hi)
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (items[mid].block0 <= wb)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// The lanes of one work block: W warps (1: a warp, 8: the CUDA block), their reductions.
template <int W> struct lane_group {
  static constexpr int lanes = 32 * W;
  static constexpr int per_block = warps / W; // groups per CUDA block
  __device__ static int rank() { return static_cast<int>(threadIdx.x) % lanes; }
  __device__ static std::int64_t index() {
    return static_cast<std::int64_t>(blockIdx.x) * per_block + threadIdx.x / lanes;
  }
  __device__ static std::int64_t count() {
    return static_cast<std::int64_t>(gridDim.x) * per_block;
  }
  __device__ static bool any(bool v) {
    if constexpr (W == 1)
      return __any_sync(0xFFFFFFFFu, v) != 0;
    else
      return __syncthreads_or(v) != 0;
  }
  // The maximum of the lanes' values, in every lane (order-free).
  __device__ static std::uint32_t max_of(std::uint32_t v, std::uint32_t* red) {
    for (int off = 16; off > 0; off >>= 1)
      v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    if constexpr (W == 1) {
      return v;
    } else {
      if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = v;
      __syncthreads();
      std::uint32_t m = red[0];
      for (int k = 1; k < W; ++k)
        m = max(m, red[k]);
      __syncthreads();
      return m;
    }
  }
  // The sum of the lanes' values in optim_cpu.cpp's tree (each warp's lanes pairwise by halving
  // strides, then the warps so); the result in rank 0.
  __device__ static float sum_of(float v, float* red) {
    for (int off = 16; off > 0; off >>= 1)
      v = v + __shfl_down_sync(0xFFFFFFFFu, v, off);
    if constexpr (W == 1) {
      return v;
    } else {
      const int w = threadIdx.x / 32, l = threadIdx.x % 32;
      if (l == 0)
        red[w] = v;
      __syncthreads();
      float s = 0.0f;
      if (w == 0) {
        s = l < W ? red[l] : 0.0f;
        for (int off = W / 2; off > 0; off >>= 1)
          s = s + __shfl_down_sync(0xFFFFFFFFu, s, off);
      }
      __syncthreads();
      return s;
    }
  }
};

// The work blocks of this lane group: a contiguous range, so that the tensor of each is found by
// one search at the start and then by stepping forward (the order of work blocks changes no
// result: each is computed alone).
template <int W> struct work_range {
  std::int64_t first, last, j;
  __device__ static work_range of(const optim_item* items, std::int64_t count, std::int64_t total) {
    using grp = lane_group<W>;
    const std::int64_t per = (total + grp::count() - 1) / grp::count();
    const std::int64_t first = grp::index() * per;
    const std::int64_t last = min(total, first + per);
    return {first, last, first < last ? tensor_of(items, count, first) : 0};
  }
  __device__ std::int64_t advance(const optim_item* items, std::int64_t count, std::int64_t j,
                                  std::int64_t wb) const {
    while (j + 1 < count && items[j + 1].block0 <= wb)
      ++j;
    return j;
  }
};

// The buffers a kernel reads of a tensor, as a mask for prefetch_next.
enum : unsigned { pf_param = 1, pf_grad = 2, pf_resid = 4, pf_s1 = 8, pf_s2 = 16 };

// A hint that changes no result: one lane of the group asks L2 for the spans of work block wb
// (the group's next) in the buffers `what` names, while the group computes the present block, so
// that the next block's loads wait for L2 instead of memory. sm_90's bulk prefetch
// (cp.async.bulk.prefetch.L2: 16-byte aligned, whole 16-byte units), hence only for full blocks
// of tensors whose buffers are 16-byte aligned (the vector bit of its form); nothing on earlier
// GPUs.
// prefetch_block: block b of tensor `it` (vec: its form's vector bit); prefetch_next: work block
// wb of the call, whichever tensor holds it. S3: the third state too (the step kernel's form of
// three states; a compile-time form, as the mask alone left the other forms' code changed).
template <int W, bool S3 = false>
__device__ __forceinline__ void prefetch_block(const optim_item& it, bool vec, std::int64_t b,
                                               std::int64_t block, unsigned what) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (lane_group<W>::rank() != 0)
    return;
  const std::int64_t first = b * block;
  if (!vec || first + block > it.n)
    return;
  const auto span = [&](const void* base, int esize) {
    const auto at = __cvta_generic_to_global(static_cast<const char*>(base) + first * esize);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at),
                 "r"(static_cast<unsigned>(block * esize))
                 : "memory");
  };
  const int pe = it.ptype == param_kind::f32 ? 4 : 2, se = it.eight_bit ? 1 : 4;
  if ((what & pf_param) != 0)
    span(it.param, pe);
  if ((what & pf_grad) != 0)
    span(it.grad, pe);
  if ((what & pf_resid) != 0 && it.rbits != 0)
    span(it.resid, it.rbits / 8);
  if ((what & pf_s1) != 0)
    span(it.s1, se);
  if ((what & pf_s2) != 0)
    span(it.s2, se);
  if constexpr (S3)
    span(it.s3, se);
#endif
}
template <int W, bool S3 = false>
__device__ __forceinline__ void prefetch_next(const work_range<W>& range, const optim_item* items,
                                              const std::uint8_t* forms, std::int64_t count,
                                              std::int64_t j, std::int64_t wb, std::int64_t block,
                                              unsigned what) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (lane_group<W>::rank() != 0 || wb >= range.last)
    return;
  j = range.advance(items, count, j, wb);
  prefetch_block<W, S3>(items[j], (forms[j] & 1u) != 0, wb - items[j].block0, block, what);
#endif
}

// A call's tensor table as the kernels read it: in the kernels' parameters for calls of up to
// inline_items tensors (a step per parameter inside the backward pass then uploads and
// allocates nothing), else in device memory. `eight`: some tensor keeps 8-bit states (the
// codebook tables are loaded into shared memory only then).
constexpr int inline_items = 4;
struct step_items {
  const optim_item* table = nullptr; // device memory, or null: `inl`
  const std::uint8_t* table_forms = nullptr;
  bool eight = false;
  optim_item inl[inline_items];
  std::uint8_t inl_forms[inline_items] = {};
  __device__ const optim_item* items() const { return table != nullptr ? table : inl; }
  __device__ const std::uint8_t* forms() const {
    return table != nullptr ? table_forms : inl_forms;
  }
};

__device__ void load_tables(const bops::tables* src, bops::tables* dst) {
  const auto* s = reinterpret_cast<const float*>(src);
  auto* t = reinterpret_cast<float*>(dst);
  constexpr int n = 2 * static_cast<int>(sizeof(bops::tables) / sizeof(float));
  for (int k = threadIdx.x; k < n; k += blockDim.x)
    t[k] = s[k];
  __syncthreads();
}

// One CUDA block per tensor: the tensor's pair (eta, decay) from its block partials.
__global__ void __launch_bounds__(optim_threads)
    tensor_pair_kernel(optim_shared sh, const __grid_constant__ step_items si, const float* partial,
                       float* eta_decay) {
  const optim_item* items = si.items();
  __shared__ double lane0[optim_threads], lane1[optim_threads];
  __shared__ unsigned long long cnt[optim_threads];
  const optim_item it = items[blockIdx.x];
  const std::int64_t blocks = (it.n + sh.block - 1) / sh.block;
  double s0 = 0.0, s1 = 0.0;
  std::int64_t c = 0;
  for (std::int64_t b = threadIdx.x; b < blocks; b += optim_threads) {
    const float* v = partial + 2 * (it.block0 + b);
    if (v[0] == d::excluded_partial)
      continue;
    s0 = s0 + static_cast<double>(v[0]);
    s1 = s1 + static_cast<double>(v[1]);
    c += min(sh.block, it.n - b * sh.block);
  }
  lane0[threadIdx.x] = s0;
  lane1[threadIdx.x] = s1;
  cnt[threadIdx.x] = static_cast<unsigned long long>(c);
  __syncthreads();
  for (int off = optim_threads / 2; off > 0; off >>= 1) {
    if (static_cast<int>(threadIdx.x) < off) {
      lane0[threadIdx.x] = lane0[threadIdx.x] + lane0[threadIdx.x + off];
      lane1[threadIdx.x] = lane1[threadIdx.x] + lane1[threadIdx.x + off];
      cnt[threadIdx.x] += cnt[threadIdx.x + off];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float e = 0.0f, dc = 0.0f;
    d::tensor_pair(sh, lane0[0], lane1[0], static_cast<std::int64_t>(cnt[0]), e, dc);
    eta_decay[2 * blockIdx.x] = e;
    eta_decay[2 * blockIdx.x + 1] = dc;
  }
}

// The stochastically rounded code of state q's value x of element i of tensor j, in a call of
// Streams Philox streams per tensor (d::random_streams), out of line: Philox's rounds, inlined
// for each of a lane's elements, would grow the kernel's body several times over for a mode that
// is rarely on.
template <int Streams>
__device__ __noinline__ std::uint8_t stochastic_code(const bops::tables& tq, float x,
                                                     std::uint32_t amax, const optim_shared& sh,
                                                     std::int64_t j, int q, std::int64_t i) {
  return d::encode_state(tq, x, amax, true, d::random_bits(sh, Streams, j, q, i));
}

// ---- the step kernel ----------------------------------------------------------------------------
//
// A lane holds EPT consecutive elements of its work block (lane r: elements 8r .. 8r + 7), so
// that a full block of a tensor whose buffers are 16-byte aligned (optim_launch_item::vec) moves
// in vector loads and stores (32 bytes of float32 per lane and buffer, 8 of codes); other blocks
// (a tensor's last, or unaligned buffers) take the elements one at a time. The step has no
// order-dependent sum (the block maxima and the skip decision are order-free), so the mapping
// changes no result. Each tensor's form (parameter dtype, residual width, 8-bit or 32-bit states)
// is a template argument of the block's code, chosen once per work block, so that the code a
// block runs holds one load, one update and one store per element and nothing else.

// The elements a lane holds in its work block: two runs of four, at 4r and at 4 lanes + 4r for
// lane r, so that each vector access of a warp covers one contiguous stretch (512 bytes of
// float32, 256 of 16-bit values, 128 of codes). `vec`: both runs lie inside the tensor and its
// buffers are 16-byte aligned (optim.cu's launcher checks them per tensor), so each run moves
// in one vector access; otherwise the elements move one at a time.
static_assert(EPT == 8, "a lane holds two runs of four elements");
struct lane_slots {
  std::int64_t o[2]; // the runs' first elements
  int valid[2];      // how many of each run lie inside the tensor
  bool vec;
  __device__ std::int64_t index(int k) const { return o[k >> 2] + (k & 3); }
  __device__ bool in(int k) const { return (k & 3) < valid[k >> 2]; }
  template <int W> __device__ static lane_slots of(std::int64_t i0, std::int64_t n, bool vec_item) {
    const int r = lane_group<W>::rank();
    lane_slots ls;
    for (int h = 0; h < 2; ++h) {
      ls.o[h] = i0 + 4 * (h * lane_group<W>::lanes + r);
      const std::int64_t left = n - ls.o[h];
      ls.valid[h] = left >= 4 ? 4 : (left > 0 ? static_cast<int>(left) : 0);
    }
    ls.vec = vec_item && ls.valid[1] == 4; // (then the first run is whole too)
    return ls;
  }
};

template <class T> __device__ __forceinline__ std::uint32_t bits32(T v) {
  if constexpr (sizeof(T) == 4)
    return __float_as_uint(v);
  else
    return static_cast<std::uint32_t>(static_cast<std::make_unsigned_t<T>>(v));
}
template <class T> __device__ __forceinline__ T from_bits(std::uint32_t u) {
  if constexpr (sizeof(T) == 4)
    return __uint_as_float(u);
  else
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(u));
}

// The lane's elements of a T buffer into v (slots 0-3 the first run, 4-7 the second), and back.
// Streaming accesses (each byte is read once and written once per step).
template <class T>
__device__ __forceinline__ void load_lane(const void* base, const lane_slots& ls, T (&v)[EPT]) {
  const T* p = static_cast<const T*>(base);
  if (ls.vec) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const T* q = p + ls.o[h];
      if constexpr (sizeof(T) == 4) {
        const float4 w = __ldcs(reinterpret_cast<const float4*>(q));
        v[4 * h] = from_bits<T>(__float_as_uint(w.x));
        v[4 * h + 1] = from_bits<T>(__float_as_uint(w.y));
        v[4 * h + 2] = from_bits<T>(__float_as_uint(w.z));
        v[4 * h + 3] = from_bits<T>(__float_as_uint(w.w));
      } else if constexpr (sizeof(T) == 2) {
        const uint2 w = __ldcs(reinterpret_cast<const uint2*>(q));
        v[4 * h] = from_bits<T>(w.x & 0xFFFFu);
        v[4 * h + 1] = from_bits<T>(w.x >> 16);
        v[4 * h + 2] = from_bits<T>(w.y & 0xFFFFu);
        v[4 * h + 3] = from_bits<T>(w.y >> 16);
      } else {
        const unsigned w = __ldcs(reinterpret_cast<const unsigned*>(q));
#pragma unroll
        for (int c = 0; c < 4; ++c)
          v[4 * h + c] = from_bits<T>((w >> (8 * c)) & 0xFFu);
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < EPT; ++k)
    v[k] = ls.in(k) ? p[ls.index(k)] : T{};
}

template <class T>
__device__ __forceinline__ void store_lane(void* base, const lane_slots& ls, const T (&v)[EPT]) {
  T* p = static_cast<T*>(base);
  if (ls.vec) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      T* q = p + ls.o[h];
      const T* u = v + 4 * h;
      if constexpr (sizeof(T) == 4) {
        __stcs(reinterpret_cast<float4*>(q),
               make_float4(__uint_as_float(bits32(u[0])), __uint_as_float(bits32(u[1])),
                           __uint_as_float(bits32(u[2])), __uint_as_float(bits32(u[3]))));
      } else if constexpr (sizeof(T) == 2) {
        __stcs(reinterpret_cast<uint2*>(q),
               make_uint2((bits32(u[0]) & 0xFFFFu) | (bits32(u[1]) << 16),
                          (bits32(u[2]) & 0xFFFFu) | (bits32(u[3]) << 16)));
      } else {
        unsigned w = 0;
#pragma unroll
        for (int c = 0; c < 4; ++c)
          w |= (bits32(u[c]) & 0xFFu) << (8 * c);
        __stcs(reinterpret_cast<unsigned*>(q), w);
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < EPT; ++k)
    if (ls.in(k))
      p[ls.index(k)] = v[k];
}

template <param_kind PK>
using param_bits = std::conditional_t<PK == param_kind::f32, float, std::uint16_t>;

// A parameter (or gradient) element's value from its stored bits, and back.
template <param_kind PK> __device__ __forceinline__ float param_value(param_bits<PK> b) {
  if constexpr (PK == param_kind::f32)
    return b;
  else if constexpr (PK == param_kind::bf16)
    return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
  else {
    constexpr emu::format f16 = emu::float16;
    return emu::decode<float>(f16, b);
  }
}

// The parameter dtype's nearest value's bits (ties to even), overflow to Inf.
template <param_kind PK> __device__ __forceinline__ std::uint16_t param_code(float x) {
  constexpr emu::format f = PK == param_kind::bf16 ? emu::bfloat16 : emu::float16;
  return static_cast<std::uint16_t>(emu::encode(f, x, emu::policy{}));
}

// What a work block's code needs of its CUDA block besides the shared tables below: where the
// bucket tables of states 0, 1 and 2 lie.
struct step_shared {
  // Per state: the shared-memory address of the signed map's bucket table or of the unsigned
  // map's pair table, less bops::bucket_bias (bops::entry_address).
  std::uint32_t bucket_base[3];
};

// The codes of state q's lane values sv in a block of absmax bits amax (finite, every |sv| <=
// amax): bops::encode_state's nearest entry. The division by the absmax goes through one
// reciprocal per block, bops::scaled_divisor (folded where the absmax allows, else scaled): the
// correctly rounded quotient wherever it is at least 2^-42, and below 2^-40 in magnitude where it
// is not, which lies in a bucket 0; both dynamic maps' buckets 0 hold the index of zero (the
// launcher checks it), which is then nearest_index's answer too. The entry comes from the signed
// map's bucket table (Signed: one step word a bucket) or the unsigned map's pair table (two step
// words a bucket, one 8-byte load; its nonnegative buckets alone, t <= -0 read as +0, whose index
// the launcher checks they have), without a branch either way.
template <bool Signed>
__device__ __forceinline__ void nearest_codes(std::uint32_t bucket_base, std::uint32_t amax,
                                              const float (&sv)[EPT], std::uint8_t (&c)[EPT]) {
  const float a = amax == 0 ? 1.0f : __uint_as_float(amax); // all zero: x / 1 keeps x
  const bops::scaled_divisor div = bops::scaled_divisor::make(a);
  const auto code = [&](float t) -> std::uint8_t {
    if constexpr (Signed) {
      const std::uint32_t bits = __float_as_uint(t);
      const std::uint32_t mask = bops::sign_mask(bits);
      const std::uint32_t at = bops::entry_address(bops::signed_base(bucket_base, mask), bits);
      std::uint32_t e;
      asm volatile("ld.shared.u32 %0, [%1];" : "=r"(e) : "r"(at));
      return static_cast<std::uint8_t>(bops::step_bucket_word(e, bits, mask) >> 24);
    } else {
      const auto bits = static_cast<std::uint32_t>(max(__float_as_int(t), 0)); // t <= -0: +0
      const std::uint32_t at = bops::entry_address(bucket_base, bits);
      std::uint32_t e0, e1;
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(e0), "=r"(e1) : "r"(at));
      return static_cast<std::uint8_t>(bops::pair_index(e0, e1, bits & 0x1FFFFu));
    }
  };
  if (div.folded) {
#pragma unroll
    for (int k = 0; k < EPT; ++k)
      c[k] = code(div.folded_quotient(sv[k]));
  } else {
#pragma unroll
    for (int k = 0; k < EPT; ++k)
      c[k] = code(div.scaled(sv[k]));
  }
}

// The step kernel's shared memory: the two dynamic maps' tables (signed, unsigned), the signed
// map's bucket table and the unsigned map's pair table (optim.cu's bucket_tables, as uploaded),
// and the lane groups' reduction slots. At file scope, so that block_step reads the tables by
// their shared addresses (no generic pointer per lookup).
__shared__ bops::tables step_tb[2];
__shared__ alignas(16) std::uint32_t step_bk[2 * bops::bucket_count];
__shared__ std::uint32_t step_red[warps];

// The number of states optimizer K keeps where it is fixed (-1: sgd and lars, one with momentum,
// none without; rmsprop, one or two) in the step kernel's forms of at most two states (the form
// of three states, S3, has three).
constexpr int fixed_states(optimizer k) {
  switch (k) {
  case optimizer::adam:
  case optimizer::adamw:
  case optimizer::stable_adamw:
  case optimizer::lamb: return 2;
  case optimizer::sgd:
  case optimizer::lars:
  case optimizer::rmsprop: return -1;
  default: return 1;
  }
}

// A lane's eight codes of an 8-bit state, packed four to a word (slot k: byte k % 4 of word
// k / 4), as the vector path loads and stores them.
__device__ __forceinline__ void load_codes(const void* base, const lane_slots& ls,
                                           std::uint32_t (&w)[2]) {
  const auto* p = static_cast<const std::uint8_t*>(base);
  if (ls.vec) {
    w[0] = __ldcs(reinterpret_cast<const unsigned*>(p + ls.o[0]));
    w[1] = __ldcs(reinterpret_cast<const unsigned*>(p + ls.o[1]));
    return;
  }
  w[0] = w[1] = 0;
#pragma unroll
  for (int k = 0; k < EPT; ++k)
    if (ls.in(k))
      w[k >> 2] |= static_cast<std::uint32_t>(p[ls.index(k)]) << (8 * (k & 3));
}
__device__ __forceinline__ std::uint32_t code_at(const std::uint32_t (&w)[2], int k) {
  return (w[k >> 2] >> (8 * (k & 3))) & 0xFFu;
}

// One work block of tensor j, of the form <PK, RB, E8>: parameter dtype, residual bits (0: none),
// 8-bit states; S3: the call keeps three states (the kernel's form, step_kernel).
template <int W, optimizer K, bool S3, param_kind PK, int RB, bool E8>
__device__ __forceinline__ void block_step(const optim_shared& sh, const optim_item& it,
                                           bool vec_item, std::int64_t j, std::int64_t b, float eta,
                                           float decay, bool bad, const step_shared& ss,
                                           std::int64_t* skipped) {
  using grp = lane_group<W>;
  using PB = param_bits<PK>;
  using RT = std::conditional_t<RB == 8, std::int8_t, std::int16_t>;
  constexpr int T0 = d::state_signed(K, 0) ? 0 : 1, T1 = d::state_signed(K, 1) ? 0 : 1,
                T2 = d::state_signed(K, 2) ? 0 : 1;
  const int r = grp::rank();
  constexpr int NS = S3 ? 3 : fixed_states(K);
  const int ns = NS >= 0 ? NS : sh.states;
  const std::int64_t i0 = b * sh.block;
  const lane_slots ls = lane_slots::of<W>(i0, it.n, vec_item);
  PB pb[EPT], gb[EPT];
  load_lane<PB>(it.param, ls, pb);
  load_lane<PB>(it.grad, ls, gb);
  RT rb[EPT];
  if constexpr (RB != 0)
    load_lane<RT>(it.resid, ls, rb);
  // The states: 8-bit codes packed in words, or float32 values.
  std::uint32_t w1[2] = {0, 0}, w2[2] = {0, 0}, w3[2] = {0, 0};
  float f1[EPT], f2[EPT], f3[EPT];
  float a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  if constexpr (E8) {
    if (ns > 0) {
      load_codes(it.s1, ls, w1);
      a1 = it.a1[b];
    }
    if (ns > 1) {
      load_codes(it.s2, ls, w2);
      a2 = it.a2[b];
    }
    if constexpr (S3) {
      load_codes(it.s3, ls, w3);
      a3 = it.a3[b];
    }
  } else {
    if (ns > 0)
      load_lane<float>(it.s1, ls, f1);
    if (ns > 1)
      load_lane<float>(it.s2, ls, f2);
    if constexpr (S3)
      load_lane<float>(it.s3, ls, f3);
  }
  float s1[EPT], s2[EPT], s3[EPT];
  // The lane's largest magnitude bits of everything that must be finite: big of the gradient and
  // the stored parameter, m1, m2 and m3 of the new states (also the lane's part of their absmax):
  // Inf or NaN among them makes one >= 0x7F800000.
  std::uint32_t big = 0, m1 = 0, m2 = 0, m3 = 0;
#pragma unroll
  for (int k = 0; k < EPT; ++k) {
    float p0;
    if constexpr (RB != 0)
      p0 = residual_ops::join(d::resid_kind(PK), RB, pb[k], rb[k]);
    else
      p0 = param_value<PK>(pb[k]);
    const float g = param_value<PK>(gb[k]);
    float x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
    if constexpr (E8) {
      // value * absmax (bops::decode less its NaN canonicalization: a NaN state makes the
      // block's update non-finite, and such a block writes nothing).
      if (ns > 0)
        x1 = step_tb[T0].value[code_at(w1, k)] * a1;
      if (ns > 1)
        x2 = step_tb[T1].value[code_at(w2, k)] * a2;
      if constexpr (S3)
        x3 = step_tb[T2].value[code_at(w3, k)] * a3;
    } else {
      if (ns > 0)
        x1 = f1[k];
      if (ns > 1)
        x2 = f2[k];
      if constexpr (S3)
        x3 = f3[k];
    }
    const optim_ops::result_t<S3> res = d::update<S3>(K, sh, eta, decay, p0, g, x1, x2, x3);
    s1[k] = ns > 0 ? res.s1 : 0.0f;
    s2[k] = ns > 1 ? res.s2 : 0.0f;
    if constexpr (S3)
      s3[k] = res.s3;
    if (ls.vec || ls.in(k)) {
      // The parameter's new stored bits (and residual) replace the loaded ones at once: a
      // skipped block stores nothing, so they are needed only to store, and the value the
      // check sees is the one the store writes (d::stored_value).
      float stored;
      if constexpr (RB != 0) {
        const residual_ops::parts sp = residual_ops::split(d::resid_kind(PK), RB, res.p);
        pb[k] = sp.w;
        rb[k] = static_cast<RT>(sp.r);
        stored = residual_ops::weight_value(d::resid_kind(PK), sp.w);
      } else if constexpr (PK == param_kind::f32) {
        pb[k] = res.p;
        stored = res.p;
      } else {
        pb[k] = param_code<PK>(res.p);
        stored = param_value<PK>(pb[k]);
      }
      big = max(big, max(bops::abs_bits(g), bops::abs_bits(stored)));
      m1 = max(m1, bops::abs_bits(s1[k]));
      m2 = max(m2, bops::abs_bits(s2[k]));
      if constexpr (S3)
        m3 = max(m3, bops::abs_bits(s3[k]));
    } else {
      s1[k] = s2[k] = 0.0f; // out of range: no part in the absmax
      if constexpr (S3)
        s3[k] = 0.0f;
    }
  }
  bad |= max(big, max(m1, m2)) >= 0x7F800000u;
  if constexpr (S3)
    bad |= m3 >= 0x7F800000u;
  if (grp::any(bad)) {
    if (r == 0 && skipped != nullptr)
      atomicAdd(reinterpret_cast<unsigned long long*>(skipped + j), 1ull);
    return;
  }
  // The parameter (and residual).
  if constexpr (RB != 0)
    store_lane<RT>(it.resid, ls, rb);
  store_lane<PB>(it.param, ls, pb);
  // The states.
  const auto store_state = [&](auto qc, const float(&sv)[EPT], std::uint32_t m) {
    constexpr int q = decltype(qc)::value;
    void* dst = q == 0 ? it.s1 : (q == 1 ? it.s2 : it.s3);
    if constexpr (!E8) {
      store_lane<float>(dst, ls, sv);
    } else {
      constexpr int tq = q == 0 ? T0 : (q == 1 ? T1 : T2);
      const std::uint32_t amax = grp::max_of(m, step_red);
      if (r == 0)
        (q == 0 ? it.a1 : (q == 1 ? it.a2 : it.a3))[b] = __uint_as_float(amax);
      std::uint8_t code[EPT];
      if (sh.stochastic) {
#pragma unroll
        for (int k = 0; k < EPT; ++k)
          code[k] = ls.in(k) ? stochastic_code<d::random_streams(NS)>(step_tb[tq], sv[k], amax, sh,
                                                                      j, q, ls.index(k))
                             : 0;
      } else {
        nearest_codes<d::state_signed(K, q)>(ss.bucket_base[q], amax, sv, code);
      }
      store_lane<std::uint8_t>(dst, ls, code);
    }
  };
  if (ns > 0)
    store_state(std::integral_constant<int, 0>{}, s1, m1);
  if (ns > 1)
    store_state(std::integral_constant<int, 1>{}, s2, m2);
  if constexpr (S3)
    store_state(std::integral_constant<int, 2>{}, s3, m3);
}

// A tensor's form as a type: parameter dtype, residual bits (0: none), 8-bit states.
template <param_kind PK, int RB, bool E8> struct form_t {
  static constexpr param_kind pk = PK;
  static constexpr int rb = RB;
  static constexpr bool e8 = E8;
};

// f(form_t<...>{}) for form number n (form_of's numbering), so that the work block's code holds
// the loads and stores of its tensor's form and nothing else.
template <class F> __device__ __forceinline__ void with_form(unsigned n, F&& f) {
  switch (n) {
  case 0: f(form_t<param_kind::f32, 0, false>{}); break;
  case 1: f(form_t<param_kind::f32, 0, true>{}); break;
  case 2: f(form_t<param_kind::bf16, 0, false>{}); break;
  case 3: f(form_t<param_kind::bf16, 0, true>{}); break;
  case 4: f(form_t<param_kind::f16, 0, false>{}); break;
  case 5: f(form_t<param_kind::f16, 0, true>{}); break;
  case 6: f(form_t<param_kind::bf16, 8, false>{}); break;
  case 7: f(form_t<param_kind::bf16, 8, true>{}); break;
  case 8: f(form_t<param_kind::bf16, 16, false>{}); break;
  case 9: f(form_t<param_kind::bf16, 16, true>{}); break;
  case 10: f(form_t<param_kind::f16, 8, false>{}); break;
  case 11: f(form_t<param_kind::f16, 8, true>{}); break;
  case 12: f(form_t<param_kind::f16, 16, false>{}); break;
  default: f(form_t<param_kind::f16, 16, true>{}); break;
  }
}

// Runs body(f, it, vec, wb) for the group's work blocks in order, one tensor's run of them at a
// time: the tensor is found, its item read and its form dispatched (with_form) once per run, not
// per work block (a work block of 256 elements gives each lane eight, and that per-block work had
// been about half of a pre-pass's instructions). The next work block is prefetched first (S3:
// with the third state, prefetch_block).
template <int W, bool S3 = false, class Body>
__device__ __forceinline__ void for_work_blocks(const work_range<W>& range, const optim_item* items,
                                                const std::uint8_t* forms, std::int64_t count,
                                                std::int64_t block, unsigned reads, Body&& body) {
  std::int64_t j = range.j;
  for (std::int64_t wb = range.first; wb < range.last;) {
    j = range.advance(items, count, j, wb);
    const optim_item& it = items[j];
    const std::int64_t next0 = j + 1 < count ? items[j + 1].block0 : range.last;
    const std::int64_t end = next0 < range.last ? next0 : range.last;
    const unsigned f = forms[j];
    const bool vec = (f & 1u) != 0;
    with_form(f >> 1, [&](auto fm) {
      for (; wb < end; ++wb) {
        if (wb + 1 < end)
          prefetch_block<W, S3>(it, vec, wb + 1 - it.block0, block, reads);
        else
          prefetch_next<W, S3>(range, items, forms, count, j, wb + 1, block, reads);
        body(fm, it, vec, j, wb);
      }
    });
  }
}

// The pre-pass of one work block of tensor `it` in form F: its two partial sums (partial[2 wb],
// partial[2 wb + 1]) or excluded_partial in the first, in the tree optim_cpu.cpp mirrors: each
// lane sums its eight elements (lane_slots, as the step holds them) in slot order, then the lanes
// pairwise by halving strides. Only what optimizer K's terms need is read: StableAdamW the
// gradient and v, LARS the parameter and the gradient, LAMB all.
template <int W, optimizer K, class F>
__device__ __forceinline__ void block_prepass(const optim_shared& sh, const optim_item& it,
                                              bool vec_item, std::int64_t b, std::int64_t wb,
                                              float* partial, float* red) {
  using grp = lane_group<W>;
  using PB = param_bits<F::pk>;
  using RT = std::conditional_t<F::rb == 8, std::int8_t, std::int16_t>;
  constexpr bool stable = K == optimizer::stable_adamw, lars = K == optimizer::lars;
  constexpr int T0 = d::state_signed(K, 0) ? 0 : 1;
  const int r = grp::rank();
  const lane_slots ls = lane_slots::of<W>(b * sh.block, it.n, vec_item);
  PB gb[EPT], pb[EPT];
  RT rb[EPT];
  load_lane<PB>(it.grad, ls, gb);
  if constexpr (!stable) {
    load_lane<PB>(it.param, ls, pb);
    if constexpr (F::rb != 0)
      load_lane<RT>(it.resid, ls, rb);
  }
  std::uint32_t w1[2] = {0, 0}, w2[2] = {0, 0};
  float f1[EPT], f2[EPT];
  float am = 0.0f, av = 0.0f;
  if constexpr (!stable && !lars) {
    if constexpr (F::e8) {
      load_codes(it.s1, ls, w1);
      am = it.a1[b];
    } else {
      load_lane<float>(it.s1, ls, f1);
    }
  }
  if constexpr (!lars) {
    if constexpr (F::e8) {
      load_codes(it.s2, ls, w2);
      av = it.a2[b];
    } else {
      load_lane<float>(it.s2, ls, f2);
    }
  }
  float s0 = 0.0f, s1 = 0.0f;
  std::uint32_t big = 0;
  const auto term = [&](int k) {
    const float g = param_value<F::pk>(gb[k]);
    float p = 0.0f, m = 0.0f, v = 0.0f;
    if constexpr (!stable) {
      if constexpr (F::rb != 0)
        p = residual_ops::join(d::resid_kind(F::pk), F::rb, pb[k], rb[k]);
      else
        p = param_value<F::pk>(pb[k]);
    }
    // value * absmax (bops::decode less its NaN canonicalization: a NaN makes the terms
    // non-finite, which excludes the block either way).
    if constexpr (!stable && !lars) {
      if constexpr (F::e8)
        m = step_tb[T0].value[code_at(w1, k)] * am;
      else
        m = f1[k];
    }
    if constexpr (!lars) {
      if constexpr (F::e8)
        v = step_tb[1].value[code_at(w2, k)] * av;
      else
        v = f2[k];
    }
    const d::prepass_terms e = d::prepass_values(K, sh, p, g, m, v);
    big = max(big, e.big);
    s0 = s0 + e.a;
    s1 = s1 + e.b;
  };
  // Full blocks of aligned tensors without a range check per element.
  if (ls.vec) {
#pragma unroll
    for (int k = 0; k < EPT; ++k)
      term(k);
  } else {
#pragma unroll
    for (int k = 0; k < EPT; ++k)
      if (ls.in(k))
        term(k);
  }
  // One vote: only whether some lane's big reaches Inf matters.
  big = grp::any(big >= 0x7F800000u) ? 0x7F800000u : 0u;
  const float sum0 = grp::sum_of(s0, red);
  const float sum1 = stable ? 0.0f : grp::sum_of(s1, red);
  if (r == 0) {
    const bool out = d::prepass_excluded(big, sum0, sum1);
    partial[2 * wb] = out ? d::excluded_partial : sum0;
    partial[2 * wb + 1] = out ? 0.0f : sum1;
  }
}

// The pre-pass kernel of optimizer K: every work block's two partial sums.
template <int W, optimizer K>
__global__ void __launch_bounds__(optim_threads)
    prepass_kernel(optim_shared sh, const __grid_constant__ step_items si, std::int64_t count,
                   std::int64_t total, const bops::tables* tabs, float* partial) {
  __shared__ float red[warps];
  const optim_item* items = si.items();
  const std::uint8_t* forms = si.forms();
  if (si.eight)
    load_tables(tabs, step_tb); // synchronizes
  const work_range<W> range = work_range<W>::of(items, count, total);
  constexpr unsigned reads = K == optimizer::stable_adamw ? pf_grad | pf_s2
                             : K == optimizer::lars       ? pf_param | pf_grad | pf_resid
                                                    : pf_param | pf_grad | pf_resid | pf_s1 | pf_s2;
  for_work_blocks(range, items, forms, count, sh.block, reads,
                  [&](auto f, const optim_item& it, bool vec, std::int64_t, std::int64_t wb) {
                    block_prepass<W, K, decltype(f)>(sh, it, vec, wb - it.block0, wb, partial, red);
                  });
}

// One instance per optimizer K (sh.kind) and state form (S3: three states, sh.states == 3, only
// for the optimizers that may keep them): the body holds one update per tensor form, which keeps
// the code a work block runs small enough for the instruction caches.
template <int W, optimizer K, bool S3>
__global__ void __launch_bounds__(optim_threads, 3)
    step_kernel(optim_shared sh, const __grid_constant__ step_items si, std::int64_t count,
                std::int64_t total, const bops::tables* tabs, const std::uint32_t* bks,
                const float* eta_decay, const float* partial, std::int64_t* skipped) {
  const optim_item* items = si.items();
  const std::uint8_t* forms = si.forms();
  if (si.eight) { // a call of 32-bit states only needs no codebook
    for (int k = threadIdx.x; k < 2 * static_cast<int>(bops::bucket_count); k += blockDim.x)
      step_bk[k] = bks[k];
    load_tables(tabs, step_tb); // synchronizes
  }
  constexpr int T0 = d::state_signed(K, 0) ? 0 : 1, T1 = d::state_signed(K, 1) ? 0 : 1,
                T2 = d::state_signed(K, 2) ? 0 : 1;
  const std::uint32_t bases[2] = {
      static_cast<std::uint32_t>(__cvta_generic_to_shared(step_bk)) - bops::bucket_bias,
      static_cast<std::uint32_t>(__cvta_generic_to_shared(step_bk + bops::bucket_count)) -
          bops::bucket_bias};
  const step_shared ss{{bases[T0], bases[T1], bases[T2]}};
  const work_range<W> range = work_range<W>::of(items, count, total);
  constexpr int NS = S3 ? 3 : fixed_states(K);
  const int ns = NS >= 0 ? NS : sh.states;
  const unsigned reads =
      pf_param | pf_grad | pf_resid | (ns > 0 ? pf_s1 : 0u) | (ns > 1 ? pf_s2 : 0u);
  for_work_blocks<W, S3>(
      range, items, forms, count, sh.block, reads,
      [&](auto fm, const optim_item& it, bool vec, std::int64_t j, std::int64_t wb) {
        using F = decltype(fm);
        float eta = sh.eta0, decay = sh.decay0;
        if (eta_decay != nullptr) {
          eta = eta_decay[2 * j];
          decay = eta_decay[2 * j + 1];
        }
        // A block the pre-pass left out of its tensor's sums is left untouched too.
        const bool bad = partial != nullptr && partial[2 * wb] == d::excluded_partial;
        block_step<W, K, S3, F::pk, F::rb, F::e8>(sh, it, vec, j, wb - it.block0, eta, decay, bad,
                                                  ss, skipped);
      });
}

// A tensor's form as with_form numbers it: parameter dtype and residual width, then
// 8-bit states.
unsigned form_of(const optim_item& it) {
  unsigned pr = 0; // f32, bf16, f16, bf16 + 8, bf16 + 16, f16 + 8, f16 + 16
  if (it.rbits == 0)
    pr = it.ptype == param_kind::f32 ? 0u : (it.ptype == param_kind::bf16 ? 1u : 2u);
  else
    pr = (it.ptype == param_kind::bf16 ? 3u : 5u) + (it.rbits == 16 ? 1u : 0u);
  return 2 * pr + (it.eight_bit ? 1u : 0u);
}

// CUDA blocks for `total` work blocks taken by groups of W warps: as many as fit on the device
// at once (each group walks its range), fewer where there are fewer work blocks.
template <int W, auto kernel> unsigned grid_of(std::int64_t total) {
  const std::int64_t cap =
      static_cast<std::int64_t>(sm_count()) * resident_blocks<kernel>(optim_threads, 0);
  const std::int64_t need = (total + lane_group<W>::per_block - 1) / lane_group<W>::per_block;
  return static_cast<unsigned>(need < cap ? need : cap);
}

// S3: the step kernel's form of three states (launch_step3).
template <int W, optimizer K, bool S3> void launch(const optim_problem& p, const exec& ex) {
  const cudaStream_t s = stream_of(ex);
  const std::int64_t count = static_cast<std::int64_t>(p.items.size());
  // The codebooks' tables stay on the device (resident_tables); each call uploads only the
  // tensor table and, per tensor, its form and whether every buffer is 16-byte aligned (its full
  // blocks then move in vectors).
  const step_tables rt = resident_tables(p);
  const bops::tables* tabs = rt.tabs;
  const std::uint32_t* bks = rt.buckets;
  // The tensor table with each tensor's form and whether every buffer is 16-byte aligned (its
  // full blocks then move in vectors): in the kernels' parameters for a few tensors, else
  // uploaded. One scratch allocation holds the uploaded table and the pre-pass's work-block
  // partials and tensor pairs.
  const bool pre = p.sh.prepass;
  const auto aligned = [](const void* q) {
    return (reinterpret_cast<std::uintptr_t>(q) & 15u) == 0;
  };
  std::vector<unsigned char> form(p.items.size());
  step_items si;
  for (std::size_t k = 0; k < p.items.size(); ++k) {
    const optim_item& it = p.items[k];
    const bool vec = aligned(it.param) && aligned(it.grad) && aligned(it.s1) && aligned(it.s2) &&
                     aligned(it.s3) && aligned(it.resid);
    form[k] = static_cast<unsigned char>(2 * form_of(it) + (vec ? 1u : 0u));
    si.eight = si.eight || it.eight_bit;
  }
  const bool inline_table = count <= inline_items;
  const std::size_t items_bytes = sizeof(optim_item) * p.items.size();
  const std::size_t pre_off = inline_table ? 0 : (items_bytes + p.items.size() + 255) / 256 * 256;
  const std::size_t pre_bytes =
      pre ? sizeof(float) * static_cast<std::size_t>(2 * p.total_blocks + 2 * count) : 0;
  std::optional<scratch> mem;
  if (pre_off + pre_bytes > 0)
    mem.emplace(pre_off + pre_bytes, s);
  if (inline_table) {
    std::copy(p.items.begin(), p.items.end(), si.inl);
    std::copy(form.begin(), form.end(), si.inl_forms);
  } else {
    std::vector<unsigned char> host(items_bytes + p.items.size());
    std::memcpy(host.data(), p.items.data(), items_bytes);
    std::memcpy(host.data() + items_bytes, form.data(), form.size());
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(mem->as<unsigned char>(), host.data(), host.size(),
                                      cudaMemcpyHostToDevice, s));
    si.table = mem->as<const optim_item>();
    si.table_forms = mem->as<unsigned char>() + items_bytes;
  }
  float *eta_decay = nullptr, *partial = nullptr;
  constexpr bool may_prepass =
      K == optimizer::stable_adamw || K == optimizer::lamb || K == optimizer::lars;
  require(may_prepass || !pre, errc::unsupported,
          "optimizer step: a pre-pass for an element-wise optimizer");
  if constexpr (may_prepass) {
    if (pre) {
      partial = reinterpret_cast<float*>(mem->as<unsigned char>() + pre_off);
      eta_decay = partial + 2 * p.total_blocks;
      constexpr auto pre_kernel = prepass_kernel<W, K>;
      pre_kernel<<<grid_of<W, pre_kernel>(p.total_blocks), optim_threads, 0, s>>>(
          p.sh, si, count, p.total_blocks, tabs, partial);
      check_launch("prepass_kernel");
      tensor_pair_kernel<<<static_cast<unsigned>(count), optim_threads, 0, s>>>(p.sh, si, partial,
                                                                                eta_decay);
      check_launch("tensor_pair_kernel");
    }
  }
  require((p.sh.states == 3) == S3, errc::unsupported,
          "optimizer step: the kernel's state form differs from the call's state count");
  constexpr auto kernel = step_kernel<W, K, S3>;
  kernel<<<grid_of<W, kernel>(p.total_blocks), optim_threads, 0, s>>>(
      p.sh, si, count, p.total_blocks, tabs, bks, eta_decay, partial, p.skipped);
  check_launch("step_kernel");
}

template <optimizer K, bool S3> void launch_form(const optim_problem& p, const exec& ex) {
  if (optim_lanes(p.sh.block) == optim_threads)
    launch<warps, K, S3>(p, ex); // blocks of 2048: the CUDA block
  else
    launch<1, K, S3>(p, ex); // blocks of 256: a warp
}

} // namespace

template <optimizer K> void launch_step(const optim_problem& p, const exec& ex) {
  launch_form<K, false>(p, ex);
}

template <optimizer K> void launch_step3(const optim_problem& p, const exec& ex) {
  static_assert(K == optimizer::adam || K == optimizer::adamw || K == optimizer::rmsprop,
                "three states: adam and adamw with amsgrad, rmsprop with momentum and centered");
  launch_form<K, true>(p, ex);
}

} // namespace lowbit::kernels::cuda
