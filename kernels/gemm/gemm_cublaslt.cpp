// The cuBLASLt backend of the scaled matmul. Row-major A (M x K) and B (N x K) are, to cuBLASLt's
// column-major eyes, A^T (K x M) and B^T (K x N), and row-major out (M x N) is out^T (N x M); so
// out^T = B A^T runs as cuBLASLt's "TN" matmul with its A = our B (transposed) and its B = our A,
// m = N, n = M, k = K (the layout fp8 and int8 tensor cores take).
//   int8:   int32 sums (exact, whatever the order) into scratch, then the unfused epilogue.
//   16-bit: float32 sums into scratch, then the unfused epilogue (the rule's epilogue exactly).
//   fp8:    scales (tensor-wise as scalars, per-row as outer vectors), bias and out's rounding
//           fused into cuBLASLt's epilogue where it takes them; else float32 sums into scratch
//           and the unfused epilogue.
// The algorithm is the heuristic's first for the descriptors, among those without split-K (one
// sequence per dot product, no workspace reduction), so results are the same run to run; it is
// asked once per device, descriptor set and alignment, and kept.
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "../common/blas.hpp"
#include "../common/cuda.hpp"
#include "gemm_internal.hpp"

namespace lowbit::kernels::cuda {

namespace {

using blas::check;

cudaDataType_t cuda_type(gemm_elem e) {
  switch (e) {
  case gemm_elem::int8: return CUDA_R_8I;
  case gemm_elem::e4m3: return CUDA_R_8F_E4M3;
  case gemm_elem::e5m2: return CUDA_R_8F_E5M2;
  case gemm_elem::bf16: return CUDA_R_16BF;
  case gemm_elem::f16: return CUDA_R_16F;
  }
  return CUDA_R_8I;
}

cudaDataType_t cuda_type(dtype t) {
  switch (t) {
  case dtype::bfloat16: return CUDA_R_16BF;
  case dtype::float16: return CUDA_R_16F;
  case dtype::int32: return CUDA_R_32I;
  default: return CUDA_R_32F;
  }
}

// RAII over cuBLASLt's descriptors.
struct matmul_desc {
  cublasLtMatmulDesc_t d = nullptr;
  matmul_desc(cublasComputeType_t ct, cudaDataType_t st) {
    check(cublasLtMatmulDescCreate(&d, ct, st), "cublasLtMatmulDescCreate");
  }
  ~matmul_desc() { cublasLtMatmulDescDestroy(d); }
  template <class T> void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    check(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), "cublasLtMatmulDescSetAttribute");
  }
};

struct layout {
  cublasLtMatrixLayout_t l = nullptr;
  layout(cudaDataType_t t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
    check(cublasLtMatrixLayoutCreate(&l, t, static_cast<std::uint64_t>(rows),
                                     static_cast<std::uint64_t>(cols), ld),
          "cublasLtMatrixLayoutCreate");
  }
  ~layout() { cublasLtMatrixLayoutDestroy(l); }
};

// The largest power of two (up to 256) that divides the address.
std::uint32_t alignment_of(const void* ptr) {
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0)
    al /= 2;
  return al;
}

struct preference {
  cublasLtMatmulPreference_t p = nullptr;
  // The heuristic assumes 256-byte aligned matrices unless told otherwise, and may pick an
  // algorithm that faults on less: it is told each pointer's actual alignment.
  preference(std::uint64_t workspace, const void* a, const void* b, const void* d) {
    check(cublasLtMatmulPreferenceCreate(&p), "cublasLtMatmulPreferenceCreate");
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(a));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(b));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(d));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(d));
    // No split-K: each dot product is one sequence inside one kernel.
    set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
        static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
  }
  ~preference() { cublasLtMatmulPreferenceDestroy(p); }
  template <class T> void set(cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
    check(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)),
          "cublasLtMatmulPreferenceSetAttribute");
  }
};

// The leading dimension cuBLASLt is told: an operand of one row reads no second row, so any
// ld >= K serves, and one rounded up to 16 keeps the alignment rules out of its way.
std::int64_t ld_of(const gemm_side& s, std::int64_t k) {
  return s.rows <= 1 ? (k + 15) / 16 * 16 : s.row_stride;
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// What cuBLASLt's fp8 epilogue does beyond the sums, where the rule's epilogue fits it.
struct fused {
  const float* scale_a = nullptr; // cuBLASLt's A: our B (null: 1)
  const float* scale_b = nullptr; // cuBLASLt's B: our A
  bool outer = false;             // per-row vectors (N for its A, M for its B), else scalars
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_16BF;
};

// The heuristic's answer depends only on the device, the descriptors and the alignment hints;
// asking it costs tens of microseconds of host time per call, a noticeable part of a
// sub-millisecond matmul, so its first answer for each combination is kept (the same answer it
// would give again: the choice stays deterministic). The cache holds at most max_cached
// combinations; past that, new ones are asked each time.
using algo_key = std::array<std::int64_t, 19>;
constexpr std::size_t max_cached = 4096;

std::mutex& algo_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<algo_key, cublasLtMatmulHeuristicResult_t>& algo_cache() {
  static std::map<algo_key, cublasLtMatmulHeuristicResult_t> cache;
  return cache;
}
bool cached_algo(const algo_key& key, cublasLtMatmulHeuristicResult_t& out) {
  std::lock_guard<std::mutex> lock(algo_mutex());
  const auto it = algo_cache().find(key);
  if (it == algo_cache().end())
    return false;
  out = it->second;
  return true;
}
void remember_algo(const algo_key& key, const cublasLtMatmulHeuristicResult_t& r) {
  std::lock_guard<std::mutex> lock(algo_mutex());
  if (algo_cache().size() < max_cached)
    algo_cache().emplace(key, r);
}

// D (column-major N x M, ld ldd, type dt) = op over p's operands; false when the heuristic has no
// algorithm for these descriptors (nothing launched then).
bool run(const gemm_problem& p, cublasComputeType_t ct, void* d, cudaDataType_t dt,
         std::int64_t ldd, const fused* f, const exec& ex) {
  const bool integer = ct == CUBLAS_COMPUTE_32I;
  matmul_desc desc(ct, integer ? CUDA_R_32I : CUDA_R_32F);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (p.fast_accumulation)
    desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, std::int8_t{1});
  if (f != nullptr) {
    if (f->outer) {
      const std::int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode);
      desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode);
    }
    if (f->scale_a != nullptr)
      desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(f->scale_a));
    if (f->scale_b != nullptr)
      desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(f->scale_b));
    if (f->bias != nullptr) {
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(CUBLASLT_EPILOGUE_BIAS));
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, f->bias);
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(f->bias_type));
    }
  }
  const std::int64_t lda = ld_of(p.b, p.k), ldb = ld_of(p.a, p.k);
  layout la(cuda_type(p.b.elem), p.k, p.n, lda);
  layout lb(cuda_type(p.a.elem), p.k, p.m, ldb);
  layout lc(dt, p.n, p.m, ldd);
  cublasLtHandle_t h = blas::handle();
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  const algo_key key = {
      dev,
      static_cast<std::int64_t>(ct),
      static_cast<std::int64_t>(cuda_type(p.b.elem)),
      static_cast<std::int64_t>(cuda_type(p.a.elem)),
      static_cast<std::int64_t>(dt),
      f == nullptr ? -1 : std::int64_t{f->outer},
      f != nullptr && f->scale_a != nullptr,
      f != nullptr && f->scale_b != nullptr,
      f == nullptr || f->bias == nullptr ? -1 : static_cast<std::int64_t>(f->bias_type),
      p.m,
      p.n,
      p.k,
      lda,
      ldb,
      ldd,
      alignment_of(p.b.codes),
      alignment_of(p.a.codes),
      alignment_of(d),
      std::int64_t{p.fast_accumulation}};
  cublasLtMatmulHeuristicResult_t result{};
  if (!cached_algo(key, result)) {
    preference pref(blas::workspace_bytes(), p.b.codes, p.a.codes, d); // cuBLASLt's A is our B
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc.d, la.l, lb.l, lc.l, lc.l,
                                                             pref.p, 1, &result, &found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
      return false;
    check(st, "cublasLtMatmulAlgoGetHeuristic");
    remember_algo(key, result);
  }
  const cudaStream_t s = stream_of(ex);
  scratch ws(result.workspaceSize > 0 ? result.workspaceSize : 4, s);
  const std::int32_t ione = 1, izero = 0;
  const float fone = 1.0f, fzero = 0.0f;
  const void* alpha = integer ? static_cast<const void*>(&ione) : &fone;
  const void* beta = integer ? static_cast<const void*>(&izero) : &fzero;
  check(cublasLtMatmul(h, desc.d, alpha, p.b.codes, la.l, p.a.codes, lb.l, beta, d, lc.l, d, lc.l,
                       &result.algo, ws.as<void>(), result.workspaceSize, s),
        "cublasLtMatmul");
  return true;
}

[[noreturn]] void no_algorithm(const gemm_problem& p) {
  throw error(errc::unsupported,
              "cublaslt: cuBLASLt has no algorithm without split-K for this problem (M = " +
                  std::to_string(p.m) + ", N = " + std::to_string(p.n) +
                  ", K = " + std::to_string(p.k) + "); simt takes any problem");
}

// Sums into an (M x N) scratch matrix of int32 or float32, then the unfused epilogue.
void unfused(const gemm_problem& p, bool integer, const exec& ex) {
  const std::int64_t ldd = (p.n + 3) / 4 * 4; // 16-byte columns of D
  scratch acc(static_cast<std::size_t>(p.m * ldd) * 4, stream_of(ex));
  if (!run(p, integer ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F, acc.as<void>(),
           integer ? CUDA_R_32I : CUDA_R_32F, ldd, nullptr, ex))
    no_algorithm(p);
  finish_matmul(p, acc.as<void>(), integer, ldd, ex);
}

// cuBLASLt's fp8 bias types: bfloat16 for bfloat16 and float32 out, float16 for float16 out.
bool bias_fits(const gemm_problem& p) {
  if (p.bias == nullptr)
    return true;
  if (p.out_type == dtype::float16)
    return p.bias_type == dtype::float16;
  return p.bias_type == dtype::bfloat16;
}

// The fp8 matmul with its epilogue in cuBLASLt; false when cuBLASLt would not take it.
bool fp8_fused(const gemm_problem& p, const exec& ex) {
  const std::size_t osize = dtype_size(p.out_type);
  const bool out_ok = aligned16(p.out) && (p.m <= 1 || (p.out_stride * osize) % 16 == 0);
  if (!out_ok || !bias_fits(p) || (p.bias != nullptr && !aligned16(p.bias)))
    return false;
  fused f;
  const bool outer = p.a.mode == scale_mode::rows || p.b.mode == scale_mode::rows;
  const cudaStream_t s = stream_of(ex);
  // Outer-vector scaling takes vectors for both operands: a tensor's scale (or none) is broadcast
  // into one, and per-row scales are copied so that both vectors are 16-byte aligned.
  const std::int64_t n_pad = (p.n + 3) / 4 * 4;
  scratch vecs(outer ? static_cast<std::size_t>(n_pad + p.m) * 4 : 4, s);
  if (outer) {
    float* vb = vecs.as<float>();
    float* va = vb + n_pad;
    broadcast_scales(p.b.scales, p.b.mode, p.n, vb, ex);
    broadcast_scales(p.a.scales, p.a.mode, p.m, va, ex);
    f.outer = true;
    f.scale_a = vb;
    f.scale_b = va;
  } else {
    f.scale_a = p.b.mode == scale_mode::tensor ? p.b.scales : nullptr;
    f.scale_b = p.a.mode == scale_mode::tensor ? p.a.scales : nullptr;
  }
  // Without a bias cuBLASLt's epilogue adds nothing, so an exact zero times a negative scale
  // stays -0; the rule adds +0 (gemm_epilogue), which makes it +0. A bias of zeros does the same.
  std::optional<scratch> zeros;
  if (p.bias == nullptr) {
    const std::size_t bytes = static_cast<std::size_t>((p.n + 7) / 8 * 8) * 2;
    zeros.emplace(bytes, s);
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(zeros->as<void>(), 0, bytes, s));
    f.bias = zeros->as<void>();
    f.bias_type = p.out_type == dtype::float16 ? CUDA_R_16F : CUDA_R_16BF;
  } else {
    f.bias = p.bias;
    f.bias_type = cuda_type(p.bias_type);
  }
  const std::int64_t ldd = p.m <= 1 ? (p.n + 15) / 16 * 16 : p.out_stride;
  return run(p, CUBLAS_COMPUTE_32F, p.out, cuda_type(p.out_type), ldd, &f, ex);
}

} // namespace

std::string cublaslt_refusal(const gemm_problem& p) {
  const int cc = compute_capability();
  const gemm_elem ea = p.a.elem, eb = p.b.elem;
  if (gemm_is_fp8(ea)) {
    if (cc < 89)
      return "cuBLASLt's fp8 matmul needs sm_89 or newer (this device is sm_" + std::to_string(cc) +
             ")";
    if (ea == gemm_elem::e5m2 && eb == gemm_elem::e5m2)
      return "cuBLASLt has no e5m2 x e5m2 matmul (e4m3fn with either is taken)";
  }
  if (ea == gemm_elem::int8 && cc < 75)
    return "cuBLASLt's int8 tensor cores need sm_75 or newer (this device is sm_" +
           std::to_string(cc) + ")";
  if (ea == gemm_elem::bf16 && cc < 80)
    return "bfloat16 tensor cores need sm_80 or newer (this device is sm_" + std::to_string(cc) +
           ")";
  if (!gemm_is_16bit(ea)) {
    // 8-bit tensor-core matmuls want 16-byte aligned pointers and leading dimensions.
    const char* names[2] = {"a.codes", "b.codes"};
    const gemm_side* sides[2] = {&p.a, &p.b};
    for (int i = 0; i < 2; ++i) {
      if (!aligned16(sides[i]->codes))
        return std::string(names[i]) + " is not 16-byte aligned";
      if (ld_of(*sides[i], p.k) % 16 != 0)
        return std::string(names[i]) + ": the row stride (" + std::to_string(sides[i]->row_stride) +
               " elements) is not a multiple of 16";
    }
  }
  return {};
}

void cublaslt_matmul(const gemm_problem& p, const exec& ex) {
  if (p.m == 0 || p.n == 0)
    return;
  if (gemm_is_fp8(p.a.elem)) {
    if (fp8_fused(p, ex))
      return;
    return unfused(p, false, ex); // cuBLASLt's epilogue cannot take it: the rule's epilogue
  }
  unfused(p, p.a.elem == gemm_elem::int8, ex);
}

} // namespace lowbit::kernels::cuda
