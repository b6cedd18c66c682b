// Probe of the fp8 tensor cores' accumulation through cuBLASLt (e4m3 x e4m3, fast accumulation
// on and off), for fitting emu's block_fixed_point model (docs/techniques/fp8-training.md, "The
// probe design"). Each probe is one dot product: a row of A and a row of B with chosen e4m3
// codes; all probes run as one P x P GEMM (no split-K) whose diagonal holds their results.
// Products of powers of two 2^x 2^y (x, y in -9..8) give exact products from 2^-18 to 2^16.
// Output: JSON lines on stdout, one per probe and mode, with the codes, so that a fit can replay
// every probe through the model. Built only with CUDA; not run by the tests.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void blas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cublas status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

// The e4m3fn code of +-2^e (e in -9..8) and of +-1.5 * 2^e (e in -8..8).
std::uint8_t pow2_code(int e, bool negative = false) {
  std::uint8_t c = e >= -6 ? static_cast<std::uint8_t>((e + 7) << 3)
                           : static_cast<std::uint8_t>(1u << (e + 9)); // subnormals
  return negative ? static_cast<std::uint8_t>(c | 0x80) : c;
}
std::uint8_t three_halves_code(int e, bool negative = false) {
  std::uint8_t c = e >= -6 ? static_cast<std::uint8_t>(((e + 7) << 3) | 4)
                           : static_cast<std::uint8_t>(3u << (e + 8));
  return negative ? static_cast<std::uint8_t>(c | 0x80) : c;
}

struct probe {
  std::string family;
  int gap = 0, pos = 0, len = 0;
  std::vector<std::uint8_t> a, b; // K codes each
};

// A product of 2^e (or 1.5 * 2^e) as two e4m3 codes, e in -18..16 (-17..16 for 1.5 * 2^e); the
// JSON holds the codes, so a clamped end of the range is still replayed exactly.
void put(probe& p, int k, int e, bool negative = false, bool three_halves = false) {
  const int lo = three_halves ? -8 : -9;
  const int x = e > 8 ? 8 : (e < lo ? lo : e);
  const int y = e - x < -9 ? -9 : e - x;
  p.a[k] = three_halves ? three_halves_code(x, negative) : pow2_code(x, negative);
  p.b[k] = pow2_code(y);
}

std::vector<probe> make_probes(int kk) {
  std::vector<probe> out;
  auto fresh = [&](const char* fam, int gap, int pos, int len) {
    probe p;
    p.family = fam;
    p.gap = gap;
    p.pos = pos;
    p.len = len;
    p.a.assign(kk, 0);
    p.b.assign(kk, 0);
    return p;
  };
  // f and the term rounding: 2^16 then one product 2^(16-g) (or 1.5 * 2^(16-g)) right after it.
  for (int g = 1; g <= 34; ++g)
    for (int v = 0; v < 3; ++v) {
      probe p = fresh(v == 0 ? "pair" : (v == 1 ? "pair_three_halves" : "pair_negative"), g, 1, 2);
      put(p, 0, 16);
      put(p, 1, 16 - g, v == 2, v == 1);
      out.push_back(p);
    }
  // k: the large product at 0 and one small one at position j (1..K-1): it survives once it
  // leaves the large one's block (and the register's alignment, when that takes part).
  for (int g : {8, 10, 12, 14, 16, 18, 20, 24, 28, 32})
    for (int j = 1; j < kk; ++j) {
      probe p = fresh("single", g, j, j + 1);
      put(p, 0, 16);
      put(p, j, 16 - g);
      out.push_back(p);
    }
  // N and the register: the large product then L - 1 small ones (L = 2..K): how many survive.
  for (int g : {10, 12, 14, 16, 18, 20, 24})
    for (int len = 2; len <= kk; ++len) {
      probe p = fresh("many", g, 1, len);
      put(p, 0, 16);
      for (int j = 1; j < len; ++j)
        put(p, j, 16 - g);
      out.push_back(p);
    }
  // Cancellation: +2^16, -2^16 and small ones after; the register's exponent drops.
  for (int g = 1; g <= 34; ++g) {
    probe p = fresh("cancel", g, 2, 3);
    put(p, 0, 16);
    put(p, 1, 16, true);
    put(p, 2, 16 - g);
    out.push_back(p);
  }
  // The exponent of a subnormal operand: 2^-9 (e4m3's smallest subnormal) times 2^8 is 2^-1,
  // then one product 2^(-1-g) from normal operands. If the multiplier takes the subnormal's
  // exponent as e4m3's minimum (-6), the pair is aligned at 2^2 and the small product survives
  // for g <= f - 3 only; with floor(log2) (-9) it is aligned at 2^-1 and survives for g <= f.
  // The `_seven` variant uses the subnormal 7 * 2^-9 times 2^6 (floor(log2): -7, minimum: -6).
  for (int g = 1; g <= 20; ++g)
    for (int v = 0; v < 2; ++v) {
      probe p = fresh(v == 0 ? "subnormal" : "subnormal_seven", g, 1, 2);
      p.a[0] = v == 0 ? 0x01 : 0x07;
      p.b[0] = pow2_code(v == 0 ? 8 : 6); // 2^-1 or 1.75 * 2^-1
      put(p, 1, -1 - g);
      out.push_back(p);
    }
  // Random codes (finite) to validate a fit.
  std::uint32_t s = 12345u;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return s >> 8;
  };
  for (int r = 0; r < 256; ++r) {
    const int len = 1 + static_cast<int>(next() % static_cast<std::uint32_t>(kk));
    probe p = fresh("random", 0, 0, len);
    for (int j = 0; j < len; ++j) {
      std::uint8_t ca, cb;
      do
        ca = static_cast<std::uint8_t>(next());
      while ((ca & 0x7F) == 0x7F);
      do
        cb = static_cast<std::uint8_t>(next());
      while ((cb & 0x7F) == 0x7F);
      p.a[j] = ca;
      p.b[j] = cb;
    }
    out.push_back(p);
  }
  return out;
}

std::string hex(const std::vector<std::uint8_t>& v, int len) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < len; ++i) {
    s += d[v[i] >> 4];
    s += d[v[i] & 15];
  }
  return s;
}

// D (P x P, column-major) = A B^T over the probes' rows, e4m3 x e4m3, float32 out.
std::vector<float> run_one(const std::vector<probe>& probes, int kk, bool fast) {
  const int p = static_cast<int>((probes.size() + 15) / 16 * 16);
  std::vector<std::uint8_t> ha(static_cast<std::size_t>(p) * kk, 0), hb(ha.size(), 0);
  for (std::size_t i = 0; i < probes.size(); ++i) {
    std::memcpy(&ha[i * kk], probes[i].a.data(), kk);
    std::memcpy(&hb[i * kk], probes[i].b.data(), kk);
  }
  void *da = nullptr, *db = nullptr, *dd = nullptr, *ws = nullptr;
  const std::size_t ws_bytes = 32u << 20;
  cuda_check(cudaMalloc(&da, ha.size()), "cudaMalloc");
  cuda_check(cudaMalloc(&db, hb.size()), "cudaMalloc");
  cuda_check(cudaMalloc(&dd, static_cast<std::size_t>(p) * p * 4), "cudaMalloc");
  cuda_check(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
  cuda_check(cudaMemcpy(da, ha.data(), ha.size(), cudaMemcpyHostToDevice), "copy");
  cuda_check(cudaMemcpy(db, hb.data(), hb.size(), cudaMemcpyHostToDevice), "copy");

  cublasLtHandle_t h;
  blas_check(cublasLtCreate(&h), "cublasLtCreate");
  cublasLtMatmulDesc_t desc;
  blas_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  blas_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
             "ta");
  blas_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)),
             "tb");
  const std::int8_t fast_accum = fast ? 1 : 0;
  blas_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                            sizeof(fast_accum)),
             "fast accumulation");
  // cuBLASLt's A (K x P, op T) holds the probes' A rows, its B (K x P, op N) their B rows.
  cublasLtMatrixLayout_t la, lb, lc, ld;
  blas_check(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, kk, p, kk), "layout");
  blas_check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, kk, p, kk), "layout");
  blas_check(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, p, p, p), "layout");
  blas_check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, p, p, p), "layout");
  cublasLtMatmulPreference_t pref;
  blas_check(cublasLtMatmulPreferenceCreate(&pref), "pref");
  blas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof(ws_bytes)),
             "workspace");
  const std::uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
  blas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &no_split, sizeof(no_split)),
             "no split-K");
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  // C is D's layout and is not read (beta = 0): the combination lowbit's cuBLASLt backend runs.
  blas_check(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 1, &res, &found),
             "heuristic");
  if (found == 0) {
    std::fprintf(stderr, "no cuBLASLt algorithm (fast=%d)\n", fast ? 1 : 0);
    std::exit(1);
  }
  std::int32_t algo_id = -1;
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&res.algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id,
                                       sizeof(algo_id), &written);
  std::fprintf(stderr, "fast=%d P=%d K=%d: cuBLASLt algorithm %d\n", fast ? 1 : 0, p, kk,
               static_cast<int>(algo_id));
  const float one = 1.0f, zero = 0.0f;
  blas_check(cublasLtMatmul(h, desc, &one, da, la, db, lb, &zero, dd, lc, dd, ld, &res.algo, ws,
                            res.workspaceSize, nullptr),
             "matmul");
  cuda_check(cudaDeviceSynchronize(), "sync");
  std::vector<float> d(static_cast<std::size_t>(p) * p);
  cuda_check(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost), "copy back");
  std::vector<float> diag(probes.size());
  for (std::size_t i = 0; i < probes.size(); ++i)
    diag[i] = d[i + i * static_cast<std::size_t>(p)];
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
  cudaFree(ws);
  return diag;
}

// The probes in GEMMs of at most `batch` of them each (0: one GEMM for all): small batches give
// small M and N, where cuBLASLt may pick another kernel.
std::vector<float> run(const std::vector<probe>& probes, int kk, bool fast, std::size_t batch) {
  if (batch == 0)
    batch = probes.size();
  std::vector<float> out;
  for (std::size_t i = 0; i < probes.size(); i += batch) {
    const std::vector<probe> part(
        probes.begin() + static_cast<std::ptrdiff_t>(i),
        probes.begin() + static_cast<std::ptrdiff_t>(std::min(probes.size(), i + batch)));
    const std::vector<float> r = run_one(part, kk, fast);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

} // namespace

// Usage: fp8_accum_probe [K] [batch] (K a multiple of 16, default 256; batch: probes per GEMM,
// default 0: all in one GEMM). The cuBLASLt algorithm of each GEMM goes to stderr.
int main(int argc, char** argv) {
  const int kk = argc > 1 ? std::atoi(argv[1]) : 256;
  const long batch = argc > 2 ? std::atol(argv[2]) : 0;
  if (kk < 16 || kk % 16 != 0) {
    std::fprintf(stderr, "K: a multiple of 16, at least 16\n");
    return 2;
  }
  if (batch < 0) {
    std::fprintf(stderr, "batch: 0 (one GEMM) or the probes per GEMM\n");
    return 2;
  }
  const std::vector<probe> probes = make_probes(kk);
  for (const bool fast : {true, false}) {
    const std::vector<float> r = run(probes, kk, fast, static_cast<std::size_t>(batch));
    for (std::size_t i = 0; i < probes.size(); ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &r[i], 4);
      const probe& p = probes[i];
      std::printf("{\"fast\": %s, \"K\": %d, \"family\": \"%s\", \"gap\": %d, \"pos\": %d, "
                  "\"len\": %d, \"a\": \"%s\", \"b\": \"%s\", \"result_bits\": %u, "
                  "\"result\": %.9g}\n",
                  fast ? "true" : "false", kk, p.family.c_str(), p.gap, p.pos, p.len,
                  hex(p.a, p.len).c_str(), hex(p.b, p.len).c_str(), bits,
                  static_cast<double>(r[i]));
    }
  }
  return 0;
}
