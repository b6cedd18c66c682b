// The checked form of an optimizer step, shared by the host API, the CPU twin and the CUDA
// launcher, and the block-level pieces both loop the same way: loading and storing parameters
// and states, the update dispatch, and the per-tensor pre-pass (StableAdamW's RMS, LAMB's and
// LARS' norms) in its fixed reduction tree. Everything here has
// passed validation in optim.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/kernels/optim.hpp>

#include "../blockwise/blockwise_ops.hpp"
#include "../residual/residual_ops.hpp"
#include "optim_ops.hpp"

namespace lowbit::kernels {

// Threads of one CUDA block. A work block is one absmax block of one tensor (block elements),
// taken by block / 8 lanes (one warp for blocks of 256, the whole CUDA block for 2048): lane t
// holds eight of its elements in two runs of four, 4t .. 4t + 3 and 4 lanes + 4t .., and the CPU
// twin mirrors the lanes' reductions.
inline constexpr int optim_threads = 256;
inline constexpr int optim_per_lane = 8;
LOWBIT_HD LOWBIT_INLINE int optim_lanes(std::int64_t block) {
  return static_cast<int>(block / optim_per_lane);
}

enum class param_kind : std::uint8_t { f32, bf16, f16 };

// One tensor, as the kernel reads it (trivially copyable: the CUDA launcher copies an array of
// these to the device).
struct optim_item {
  void* param = nullptr;
  const void* grad = nullptr;
  void* s1 = nullptr; // float32 or uint8
  void* s2 = nullptr;
  float* a1 = nullptr; // 8-bit: absmax per block
  float* a2 = nullptr;
  std::int64_t n = 0;
  std::int64_t block0 = 0; // index of its first work block among all tensors'
  param_kind ptype = param_kind::f32;
  bool eight_bit = false;
  // Residual master weight (bf16/f16 parameters only): int8 or int16 [n] with rbits 8 or 16;
  // rbits 0 without one. The parameter and the residual together are the float32 master.
  void* resid = nullptr;
  std::uint8_t rbits = 0;
  // The third state (adam's amsgrad, rmsprop with momentum and centered), of the kind of the
  // other two; null where the call keeps two or fewer.
  void* s3 = nullptr;
  float* a3 = nullptr;
};

// What every element of a call shares (trivially copyable; a kernel parameter).
struct optim_shared {
  optimizer kind = optimizer::adam;
  int states = 0;
  optim_ops::coeffs c;
  // The per-tensor pre-pass (stable_adamw; lamb and lars with the trust ratio on) derives each
  // tensor's pair (eta, decay) from these (tensor_pair); without it every tensor has (eta0,
  // decay0).
  double lr = 0.0, wd = 0.0, eps = 0.0;
  double max_trust_ratio = 0.0, trust_coefficient = 0.0; // lamb, lars
  bool prepass = false;
  float eta0 = 0.0f, decay0 = 1.0f;
  std::int64_t block = 256;
  bool stochastic = false;
  std::uint64_t seed = 0, offset = 0;
};

struct optim_problem {
  optim_shared sh;
  std::vector<optim_item> items;
  std::int64_t total_blocks = 0;
  std::int64_t* skipped = nullptr; // int64 [items], or null
  device dev{};
  blockwise_ops::tables tb_signed, tb_unsigned;
};

namespace optim_detail {

namespace bops = blockwise_ops;

// optimizer_state_signed, for device code too.
LOWBIT_HD LOWBIT_INLINE constexpr bool state_signed(optimizer o, int k) {
  // rmsprop: the square average (state 0), then the momentum buffer and the gradient's average;
  // the others: the first moment or momentum (state 0), then second moments (adam's v and its
  // running maximum).
  return o == optimizer::adagrad ? false : (o == optimizer::rmsprop ? k >= 1 : k == 0);
}

// The Philox streams per tensor of a call: one per state it may keep, at least two (the streams
// of the one- and two-state calls stay where they were).
LOWBIT_HD LOWBIT_INLINE constexpr int random_streams(int states) {
  return states > 2 ? 3 : 2;
}

LOWBIT_HD LOWBIT_INLINE float load_param(param_kind t, const void* p, std::int64_t i) {
  switch (t) {
  case param_kind::bf16:
    return emu::detail::bit_cast<float>(
        static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(p)[i]) << 16);
  case param_kind::f16: {
    constexpr emu::format f16 = emu::float16;
    return emu::decode<float>(f16, static_cast<const std::uint16_t*>(p)[i]);
  }
  default: return static_cast<const float*>(p)[i];
  }
}

// The parameter's dtype's nearest value (ties to even), overflow to Inf.
LOWBIT_HD LOWBIT_INLINE void store_param(param_kind t, void* p, std::int64_t i, float x) {
  switch (t) {
  case param_kind::bf16: {
    constexpr emu::format bf16 = emu::bfloat16;
    static_cast<std::uint16_t*>(p)[i] =
        static_cast<std::uint16_t>(emu::encode(bf16, x, emu::policy{}));
    break;
  }
  case param_kind::f16: {
    constexpr emu::format f16 = emu::float16;
    static_cast<std::uint16_t*>(p)[i] =
        static_cast<std::uint16_t>(emu::encode(f16, x, emu::policy{}));
    break;
  }
  default: static_cast<float*>(p)[i] = x;
  }
}

// The value of a parameter after the store, as float (what the finiteness check must see: a
// finite float may overflow to Inf in float16).
LOWBIT_HD LOWBIT_INLINE float stored_value(param_kind t, float x) {
  switch (t) {
  case param_kind::bf16: {
    constexpr emu::format bf16 = emu::bfloat16;
    return emu::detail::bit_cast<float>(emu::encode(bf16, x, emu::policy{}) << 16);
  }
  case param_kind::f16: {
    constexpr emu::format f16 = emu::float16;
    return emu::decode<float>(f16, emu::encode(f16, x, emu::policy{}));
  }
  default: return x;
  }
}

LOWBIT_HD LOWBIT_INLINE residual_ops::weight_kind resid_kind(param_kind t) {
  return t == param_kind::bf16 ? residual_ops::weight_kind::bf16 : residual_ops::weight_kind::f16;
}

// The parameter element i as the update sees it: with a residual, the float32 value rebuilt from
// the 16-bit weight and its residual (residual_ops.hpp); without, the parameter itself.
LOWBIT_HD LOWBIT_INLINE float load_param(const optim_item& it, std::int64_t i) {
  if (it.rbits == 0)
    return load_param(it.ptype, it.param, i);
  const std::int32_t r = it.rbits == 8 ? static_cast<const std::int8_t*>(it.resid)[i]
                                       : static_cast<const std::int16_t*>(it.resid)[i];
  return residual_ops::join(resid_kind(it.ptype), it.rbits,
                            static_cast<const std::uint16_t*>(it.param)[i], r);
}

// Stores the new value of element i: with a residual, split into the 16-bit weight (nearest,
// ties away from zero) and the residual; without, store_param above.
LOWBIT_HD LOWBIT_INLINE void store_param(const optim_item& it, std::int64_t i, float x) {
  if (it.rbits == 0) {
    store_param(it.ptype, it.param, i, x);
    return;
  }
  const residual_ops::parts s = residual_ops::split(resid_kind(it.ptype), it.rbits, x);
  static_cast<std::uint16_t*>(it.param)[i] = s.w;
  if (it.rbits == 8)
    static_cast<std::int8_t*>(it.resid)[i] = static_cast<std::int8_t>(s.r);
  else
    static_cast<std::int16_t*>(it.resid)[i] = static_cast<std::int16_t>(s.r);
}

// stored_value for the tensor: with a residual, the 16-bit weight the split writes (the value
// the forward pass sees; non-finite exactly when it is, so a block whose weights would overflow
// keeps weight and residual as they are).
LOWBIT_HD LOWBIT_INLINE float stored_value(const optim_item& it, float x) {
  if (it.rbits == 0)
    return stored_value(it.ptype, x);
  const residual_ops::weight_kind k = resid_kind(it.ptype);
  return residual_ops::weight_value(k, residual_ops::split(k, it.rbits, x).w);
}

// State k's value of element i (b its block).
LOWBIT_HD LOWBIT_INLINE float load_state(const optim_item& it, int k, const float* value,
                                         std::int64_t i, std::int64_t b) {
  const void* s = k == 0 ? it.s1 : (k == 1 ? it.s2 : it.s3);
  if (!it.eight_bit)
    return static_cast<const float*>(s)[i];
  const float* a = k == 0 ? it.a1 : (k == 1 ? it.a2 : it.a3);
  return bops::decode(value[static_cast<const std::uint8_t*>(s)[i]], a[b]);
}

// The update of one element by optimizer `kind` (sh.kind; the CUDA kernel passes it as a
// compile-time constant, so that each of its instances holds one update); eta and decay are the
// tensor's pair (StableAdamW: eta and 1 - eta wd; LAMB: lr times the trust ratio; LARS: the
// trust ratio, in eta). S3: the call keeps three states (sh.states == 3: adam and adamw with
// amsgrad, rmsprop with momentum and centered; s3 the third), a compile-time form so that the
// updates of one and two states are what they were without it.
template <bool S3>
LOWBIT_HD LOWBIT_INLINE optim_ops::result_t<S3> update(optimizer kind, const optim_shared& sh,
                                                       float eta, float decay, float p, float g,
                                                       float s1, float s2, float s3) {
  if constexpr (S3) {
    switch (kind) {
    case optimizer::adam: return optim_ops::adam<true>(sh.c, false, p, g, s1, s2, s3);
    case optimizer::adamw: return optim_ops::adam<true>(sh.c, true, p, g, s1, s2, s3);
    default: return optim_ops::rmsprop<true>(sh.c, true, p, g, s1, s2, s3);
    }
  } else {
    switch (kind) {
    case optimizer::adam: return optim_ops::adam<false>(sh.c, false, p, g, s1, s2, s3);
    case optimizer::adamw: return optim_ops::adam<false>(sh.c, true, p, g, s1, s2, s3);
    case optimizer::stable_adamw: return optim_ops::stable_adamw(sh.c, eta, decay, p, g, s1, s2);
    case optimizer::sgd: return optim_ops::sgd(sh.c, sh.states > 0, p, g, s1);
    case optimizer::lion: return optim_ops::lion(sh.c, p, g, s1);
    case optimizer::rmsprop:
      return optim_ops::rmsprop<false>(sh.c, sh.states > 1, p, g, s1, s2, s3);
    case optimizer::lamb: return optim_ops::lamb(sh.c, eta, p, g, s1, s2);
    case optimizer::lars: return optim_ops::lars(sh.c, sh.states > 0, eta, p, g, s1);
    default: return optim_ops::adagrad(sh.c, p, g, s1);
    }
  }
}

// The random bits of element i of state k of tensor j, in a call of `streams` Philox streams per
// tensor (random_streams).
LOWBIT_HD LOWBIT_INLINE std::uint32_t random_bits(const optim_shared& sh, int streams,
                                                  std::int64_t j, int k, std::int64_t i) {
  const emu::random_stream rng{
      sh.seed, sh.offset + static_cast<std::uint64_t>(streams) * static_cast<std::uint64_t>(j) +
                   static_cast<std::uint64_t>(k)};
  return rng.bits(static_cast<std::uint64_t>(i));
}

// The code of state value x in a block of absmax bits amax (finite: poisoned blocks are skipped).
LOWBIT_HD LOWBIT_INLINE std::uint8_t encode_state(const bops::tables& tb, float x,
                                                  std::uint32_t amax, bool stochastic,
                                                  std::uint32_t rbits) {
  const float t = bops::normalized(x, amax);
  return static_cast<std::uint8_t>(stochastic ? bops::stochastic_index(tb.value, t, rbits)
                                              : bops::nearest_index(tb.sum_hi, tb.sum_lo, t));
}

// StableAdamW's eta = lr / max(1, RMS) and decay = 1 - eta wd from the tensor's sum of RMS terms
// (double) over `count` elements, in double, each rounded once to float.
LOWBIT_HD LOWBIT_INLINE void stable_eta(const optim_shared& sh, double total, std::int64_t count,
                                        float& eta, float& decay) {
  double rms = 0.0;
  if (count > 0)
    rms = ::sqrt(total / static_cast<double>(count));
  const double e = sh.lr / (rms > 1.0 ? rms : 1.0);
  eta = static_cast<float>(e);
  decay = static_cast<float>(1.0 - e * sh.wd);
}

// The pre-pass's per-tensor pair from the tensor's two sums (double) over `count` elements, in
// double, each result rounded once to float. LAMB: ratio = ||p|| / ||u|| (1 where either is 0),
// eta = lr min(ratio, max_trust_ratio). LARS: ratio = tc ||p|| / (||g|| + wd ||p|| + eps) (1
// where either norm is 0), eta = min(ratio, max_trust_ratio). decay 1 for both.
LOWBIT_HD LOWBIT_INLINE void tensor_pair(const optim_shared& sh, double s0, double s1,
                                         std::int64_t count, float& eta, float& decay) {
  if (sh.kind == optimizer::stable_adamw) {
    stable_eta(sh, s0, count, eta, decay);
    return;
  }
  const double pn = ::sqrt(s0), qn = ::sqrt(s1);
  double r = 1.0;
  if (pn > 0.0 && qn > 0.0)
    r = sh.kind == optimizer::lamb ? pn / qn
                                   : sh.trust_coefficient * pn / (qn + sh.wd * pn + sh.eps);
  r = r < sh.max_trust_ratio ? r : sh.max_trust_ratio;
  eta = static_cast<float>(sh.kind == optimizer::lamb ? sh.lr * r : r);
  decay = 1.0f;
}

// The pre-pass's two terms of element i (b its block in the tensor; v0, v1 the codebook values
// of states 0 and 1): StableAdamW the RMS term g^2 / max(v_t, eps^2) and 0; LAMB p^2 and u^2
// (u from the new moments, which only the step writes); LARS p^2 and g^2.
//
// A work block is left out where a value its terms or (LAMB) its new moments need is not finite.
// The terms are non-negative and the block's two sums are checked after the block (prepass
// callers), so a term that is Inf or NaN shows there, and so does any input that makes one so:
// a non-finite gradient makes StableAdamW's term NaN (g NaN, or g^2 / v_t = Inf / Inf) and LARS'
// g^2 non-finite; a non-finite parameter makes p^2 so. What the sums cannot show is in big, the
// largest magnitude bits of the values a term stays finite without (>= 0x7F800000: one is Inf
// or NaN): StableAdamW's v_t (an Inf v_t makes the term 0, a NaN one takes the eps^2 floor),
// LAMB's new moments (which a non-finite gradient makes non-finite); nothing for LARS. The
// terms' checks so cost two integer operations per value, not a branch.
struct prepass_terms {
  float a, b;
  std::uint32_t big;
};
// The terms from the element's values (kind: sh.kind, a compile-time constant in the CUDA
// kernel): g the gradient, p the parameter (its master value with a residual; LAMB, LARS), m and v
// the states as loaded (LAMB; StableAdamW v only). StableAdamW's terms take g squared only, so
// maximize (which negates g) changes nothing in them.
LOWBIT_HD LOWBIT_INLINE prepass_terms prepass_values(optimizer kind, const optim_shared& sh,
                                                     float p, float g, float m, float v) {
  namespace ops = optim_ops;
  if (kind == optimizer::stable_adamw) {
    const float vn = ops::stable_v(sh.c, g, v);
    return {ops::stable_rms_term(sh.c, g, vn), 0.0f, bops::abs_bits(vn)};
  }
  const float pp = p * p;
  if (kind == optimizer::lars)
    return {pp, g * g, 0u};
  const ops::lamb_direction_t d = ops::lamb_direction(sh.c, p, g, m, v);
  return {pp, d.u * d.u,
          bops::abs_bits(d.m) > bops::abs_bits(d.v) ? bops::abs_bits(d.m) : bops::abs_bits(d.v)};
}

// Whether a work block's pre-pass leaves it out: big (the largest prepass_terms::big of its
// elements) or one of its two sums not finite.
LOWBIT_HD LOWBIT_INLINE bool prepass_excluded(std::uint32_t big, float sum0, float sum1) {
  return big >= 0x7F800000u || !optim_ops::finite(sum0) || !optim_ops::finite(sum1);
}

// The terms of element i, loaded from the tensor (the CPU twin's form of the pre-pass).
LOWBIT_HD LOWBIT_INLINE prepass_terms prepass_element(const optim_shared& sh, const optim_item& it,
                                                      const float* v0, const float* v1,
                                                      std::int64_t i, std::int64_t b) {
  const float g = load_param(it.ptype, it.grad, i);
  const bool stable = sh.kind == optimizer::stable_adamw, lars = sh.kind == optimizer::lars;
  const float p = stable ? 0.0f : load_param(it, i);
  const float m = stable || lars ? 0.0f : load_state(it, 0, v0, i, b);
  const float v = lars ? 0.0f : load_state(it, 1, v1, i, b);
  return prepass_values(sh.kind, sh, p, g, m, v);
}

// A marker for a work block left out of the per-tensor sums (a value it needs or its partial
// sum not finite; the step leaves the block untouched too): partials are sums of non-negative
// terms, so a negative one is never a sum. Two partials per work block, the marker in the first.
inline constexpr float excluded_partial = -1.0f;

} // namespace optim_detail

namespace cpu {
void optimizer_step(const optim_problem& p, const exec& ex);
} // namespace cpu
namespace cuda {
void optimizer_step(const optim_problem& p, const exec& ex);
} // namespace cuda

} // namespace lowbit::kernels
