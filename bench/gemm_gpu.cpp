// GPU throughput of the scaled matmul (lowbit::kernels::scaled_matmul) on each backend, beside a
// plain cuBLASLt bf16 GEMM of the same shape measured in the same run: the baseline that
// SwitchBack and fp8 training have to beat (bf16 in, bf16 out, fp32 accumulation, no scales).
//
// Rows are named gemm/<M>x<N>x<K>/<backend>; gemm/<shape>/baseline_bf16 is the baseline, and
// every other row of the shape carries `vs_bf16`, the baseline's time over its own (above 1:
// faster than bf16). Each lowbit row has row-wise scales on both operands, a float32 bias and
// bf16 output, as a SwitchBack layer computes it. Counters: TFLOPs = 2 M N K / time.
// e5m2_e4m3_cutlass (an E5M2 gradient times E4M3 codes, as fp8 training's input gradient) runs
// at 65536x1280x5120 alone, the input gradient of the MLP up-projection. The *_hopper_model*
// rows run emu::hopper_fp8_accumulation (slow, or fast) on the CUDA cores, bit for bit what the
// H200's fp8 tensor cores sum: 8192^3 in e4m3, and e5m2 x e4m3 at 65536x1280x5120.
//
// Shapes: 8192^3, and the ViT-H layers of the SwitchBack paper (width 1280, MLP 5120) at 65536
// tokens: 65536x5120x1280 (MLP up-projection forward; input gradient of the down-projection),
// 65536x1280x5120 (down-projection forward; input gradient of the up-projection) and
// 65536x1280x1280 (attention projection, forward and input gradient). Operands are quantized on
// the device from Gaussian data, so the codes and their scales are real ones.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <lowbit/emu/accumulate.hpp>
#include <lowbit/emu/error.hpp>
#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/kernels/gemm.hpp>
#include <lowbit/kernels/quantize.hpp>

#include "gpu_bench.hpp"

namespace {

using namespace lowbit;
using namespace lowbit::bench;
using kernels::dtype;

struct shape {
  std::int64_t m, n, k;
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * k; }
};

void ok_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(s));
}

// Device buffers of one shape, made when a row of a new shape runs (rows are registered shape
// by shape) and kept until the next shape's. Both operands exist in every element type: int8
// and e4m3 codes with row scales, and bf16 values; A also in e5m2 codes (a gradient's format).
struct operands {
  shape s{0, 0, 0};
  void* x = nullptr;                     // float32 staging, max(M, N) x K
  void *a8 = nullptr, *b8 = nullptr;     // int8 codes
  void *af8 = nullptr, *bf8 = nullptr;   // e4m3fn codes
  void* ae5 = nullptr;                   // e5m2 codes of A
  void *a16 = nullptr, *b16 = nullptr;   // bf16 values
  void *sa8 = nullptr, *sb8 = nullptr;   // int8 row scales (float32)
  void *saf8 = nullptr, *sbf8 = nullptr; // e4m3 row scales
  void* sae5 = nullptr;                  // e5m2 row scales of A
  void* bias = nullptr;                  // float32 [N]
  void* out = nullptr;                   // bf16 M x N

  void release() {
    for (void* p : {x, a8, b8, af8, bf8, ae5, a16, b16, sa8, sb8, saf8, sbf8, sae5, bias, out})
      if (p != nullptr)
        ok(cudaFree(p));
    *this = operands{};
  }

  // One operand (rows x K) from Gaussian data of stream `seed`, in the three element types, and in
  // e5m2 codes where ce5 is not null.
  void make(std::int64_t rows, std::uint64_t seed, void* c8, void* cf8, void* c16, void* s8,
            void* sf8, void* ce5 = nullptr, void* se5 = nullptr) {
    const std::int64_t k = s.k;
    fill_normal(static_cast<float*>(x), rows * k, seed, 1.0f);
    const auto xv = dev_view(x, dtype::float32, {rows, k});
    const auto rows_g = kernels::grouping::per_row();
    kernels::quantize(xv, dev_view(c8, dtype::int8, {rows, k}),
                      dev_view(s8, dtype::float32, {rows}), kernels::target::of(emu::int8_sym),
                      rows_g, emu::rne);
    kernels::quantize(xv, dev_view(cf8, dtype::uint8, {rows, k}),
                      dev_view(sf8, dtype::float32, {rows}), kernels::target::of(emu::e4m3fn),
                      rows_g, emu::rne_sat);
    if (ce5 != nullptr)
      kernels::quantize(xv, dev_view(ce5, dtype::uint8, {rows, k}),
                        dev_view(se5, dtype::float32, {rows}), kernels::target::of(emu::e5m2),
                        rows_g, emu::rne_sat);
    kernels::cast(xv, dev_view(c16, dtype::uint16, {rows, k}), emu::bfloat16, emu::rne);
  }

  void ensure(const shape& want) {
    if (want.m == s.m && want.n == s.n && want.k == s.k)
      return;
    release();
    s = want;
    const std::int64_t m = s.m, n = s.n, k = s.k, big = (m > n ? m : n) * k;
    ok(cudaMalloc(&x, big * 4));
    ok(cudaMalloc(&a8, m * k));
    ok(cudaMalloc(&b8, n * k));
    ok(cudaMalloc(&af8, m * k));
    ok(cudaMalloc(&bf8, n * k));
    ok(cudaMalloc(&ae5, m * k));
    ok(cudaMalloc(&a16, m * k * 2));
    ok(cudaMalloc(&b16, n * k * 2));
    ok(cudaMalloc(&sa8, m * 4));
    ok(cudaMalloc(&sb8, n * 4));
    ok(cudaMalloc(&saf8, m * 4));
    ok(cudaMalloc(&sbf8, n * 4));
    ok(cudaMalloc(&sae5, m * 4));
    ok(cudaMalloc(&bias, n * 4));
    ok(cudaMalloc(&out, m * n * 2));
    make(m, 11, a8, af8, a16, sa8, saf8, ae5, sae5);
    make(n, 12, b8, bf8, b16, sb8, sbf8);
    fill_normal(static_cast<float*>(bias), n, 13, 0.1f);
    ok(cudaDeviceSynchronize());
  }
};

operands& ops() {
  static operands o;
  return o;
}

// Baseline time per shape (ms), set by the baseline row, read by the other rows of the shape.
std::map<std::string, double>& baseline_ms() {
  static std::map<std::string, double> m;
  return m;
}

// Times fn (gpu_bench.hpp's timed_ms); returns the mean time of
// one call in ms and sets the TFLOPs counter (and vs_bf16 when the shape's baseline ran).
template <class Fn> double time_gemm(benchmark::State& state, const shape& s, Fn fn) {
  const double mean_ms = timed_ms(state, fn);
  if (mean_ms > 0)
    state.counters["TFLOPs"] = s.flops() / (mean_ms / 1e3) / 1e12;
  const auto it = baseline_ms().find(s.name());
  if (it != baseline_ms().end() && mean_ms > 0)
    state.counters["vs_bf16"] = it->second / mean_ms;
  return mean_ms;
}

// The baseline: D (M x N, row-major) = A (M x K) B^T, both bf16 and K-major, one cuBLASLt
// matmul with the heuristic's first algorithm. In cuBLASLt's column-major terms this is
// D^T (N x M) = B^T(op T on a K x N matrix) x A^T (K x M): the "TN" case of every fast path.
struct plain_bf16 {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* workspace = nullptr;
  std::size_t workspace_bytes = std::size_t{32} << 20;

  explicit plain_bf16(const shape& s) {
    ok_blas(cublasLtCreate(&handle), "cublasLtCreate");
    ok_blas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    ok_blas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
            "TRANSA");
    ok_blas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)),
            "TRANSB");
    ok_blas(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k), "layout B");
    ok_blas(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.m, s.k), "layout A");
    ok_blas(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, s.n, s.m, s.n), "layout D");
    ok(cudaMalloc(&workspace, workspace_bytes));
    cublasLtMatmulPreference_t pref = nullptr;
    ok_blas(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    ok_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace_bytes, sizeof(workspace_bytes)),
            "MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    ok_blas(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, &result, &found),
            "AlgoGetHeuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0)
      throw std::runtime_error("cuBLASLt has no bf16 algorithm for " + s.name());
    algo = result.algo;
  }
  ~plain_bf16() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
    cudaFree(workspace);
  }
  plain_bf16(const plain_bf16&) = delete;
  plain_bf16& operator=(const plain_bf16&) = delete;

  void run(const void* a, const void* b, void* d) {
    const float alpha = 1.0f, beta = 0.0f;
    ok_blas(cublasLtMatmul(handle, desc, &alpha, b, la, a, lb, &beta, d, ld, d, ld, &algo,
                           workspace, workspace_bytes, nullptr),
            "cublasLtMatmul");
  }
};

void bm_baseline(benchmark::State& state, shape s) {
  auto& o = ops();
  o.ensure(s);
  plain_bf16 g(s);
  const double ms = time_gemm(state, s, [&] { g.run(o.a16, o.b16, o.out); });
  baseline_ms()[s.name()] = ms;
}

enum class kind { int8, e4m3, e5m2_e4m3, bf16 };

void bm_lowbit(benchmark::State& state, shape s, kind el, kernels::gemm_backend backend,
               std::optional<emu::accumulation> model = std::nullopt) {
  auto& o = ops();
  o.ensure(s);
  kernels::gemm_operand a, b;
  switch (el) {
  case kind::int8:
    a = {dev_view(o.a8, dtype::int8, {s.m, s.k}), kernels::target::of(emu::int8_sym),
         dev_view(o.sa8, dtype::float32, {s.m})};
    b = {dev_view(o.b8, dtype::int8, {s.n, s.k}), kernels::target::of(emu::int8_sym),
         dev_view(o.sb8, dtype::float32, {s.n})};
    break;
  case kind::e4m3:
    a = {dev_view(o.af8, dtype::uint8, {s.m, s.k}), kernels::target::of(emu::e4m3fn),
         dev_view(o.saf8, dtype::float32, {s.m})};
    b = {dev_view(o.bf8, dtype::uint8, {s.n, s.k}), kernels::target::of(emu::e4m3fn),
         dev_view(o.sbf8, dtype::float32, {s.n})};
    break;
  case kind::e5m2_e4m3:
    a = {dev_view(o.ae5, dtype::uint8, {s.m, s.k}), kernels::target::of(emu::e5m2),
         dev_view(o.sae5, dtype::float32, {s.m})};
    b = {dev_view(o.bf8, dtype::uint8, {s.n, s.k}), kernels::target::of(emu::e4m3fn),
         dev_view(o.sbf8, dtype::float32, {s.n})};
    break;
  case kind::bf16:
    // bf16 values with the int8 row scales: a 16-bit layer that dequantizes in its epilogue.
    a = {dev_view(o.a16, dtype::bfloat16, {s.m, s.k}), kernels::target::of(emu::bfloat16),
         dev_view(o.sa8, dtype::float32, {s.m})};
    b = {dev_view(o.b16, dtype::bfloat16, {s.n, s.k}), kernels::target::of(emu::bfloat16),
         dev_view(o.sb8, dtype::float32, {s.n})};
    break;
  }
  const auto bias = dev_view(o.bias, dtype::float32, {s.n});
  const auto out = dev_view(o.out, dtype::bfloat16, {s.m, s.n});
  kernels::gemm_options opt;
  opt.backend = backend;
  opt.accumulation = model;
  try {
    kernels::scaled_matmul(a, b, bias, out, opt); // refusals surface here, before timing
  } catch (const lowbit::error& e) {
    state.SkipWithError(e.what());
    return;
  }
  time_gemm(state, s, [&] { kernels::scaled_matmul(a, b, bias, out, opt); });
}

void register_gemm() {
  using kernels::gemm_backend;
  const std::vector<shape> shapes = {
      {8192, 8192, 8192}, {65536, 5120, 1280}, {65536, 1280, 5120}, {65536, 1280, 1280}};
  struct row {
    const char* name;
    kind el;
    gemm_backend backend;
    const char* only = nullptr; // the one shape of the row (null: every shape)
    std::optional<emu::accumulation> model = std::nullopt;
  };
  const std::vector<row> rows = {
      {"int8_cutlass", kind::int8, gemm_backend::cutlass},
      {"int8_cublaslt", kind::int8, gemm_backend::cublaslt},
      {"e4m3_cutlass", kind::e4m3, gemm_backend::cutlass},
      {"e4m3_cublaslt", kind::e4m3, gemm_backend::cublaslt},
      {"e4m3_widened", kind::e4m3, gemm_backend::widened},
      {"e5m2_e4m3_cutlass", kind::e5m2_e4m3, gemm_backend::cutlass, "65536x1280x5120"},
      {"bf16_cutlass", kind::bf16, gemm_backend::cutlass},
      {"bf16_cublaslt", kind::bf16, gemm_backend::cublaslt},
      // The Hopper accumulation model on the CUDA cores (simt's model kernel), both modes.
      {"e4m3_hopper_model_simt", kind::e4m3, gemm_backend::simt, "8192x8192x8192",
       emu::hopper_fp8_accumulation(false)},
      {"e4m3_hopper_model_fast_simt", kind::e4m3, gemm_backend::simt, "8192x8192x8192",
       emu::hopper_fp8_accumulation(true)},
      {"e5m2_e4m3_hopper_model_simt", kind::e5m2_e4m3, gemm_backend::simt, "65536x1280x5120",
       emu::hopper_fp8_accumulation(false)},
  };
  for (const shape& s : shapes) {
    const std::string prefix = "gemm/" + s.name() + "/";
    // The baseline first: the shape's other rows divide its time by theirs.
    register_gpu(prefix + "baseline_bf16", [s](benchmark::State& st) { bm_baseline(st, s); });
    for (const row& r : rows)
      if (r.only == nullptr || s.name() == r.only)
        register_gpu(prefix + r.name,
                     [s, r](benchmark::State& st) { bm_lowbit(st, s, r.el, r.backend, r.model); });
  }
}

// Registered before main() (as Google Benchmark's own macros do), so quantize_gpu.cpp's main()
// runs these rows with the others; main() returns before any of them without a device.
[[maybe_unused]] const int registered = (register_gemm(), 0);

} // namespace
