// GPU throughput of the fused optimizer steps (lowbit/kernels/optim.hpp) on a model of real
// tensor shapes: 51 ViT-H-sized transformer layers (width 1280, MLP 5120), 12 tensors each (qkv,
// projection, two MLP weights, their biases, two LayerNorms' weights and biases): 612 tensors
// from 1280 to 6,553,600 elements, 1,004,006,400 parameters, one multi-tensor call per step.
// As lowbit.optim does, tensors below 4096 elements keep 32-bit states in the 8-bit rows. Every
// row carries GB/s and `of_copy` for the bytes the step must move (each tensor read or written
// once: parameter read and written, gradient read, states read and written, absmax read and
// written; StableAdamW also reads gradient and second moment once more for its RMS), and
// `bytes_per_param`; the copy bandwidth is measured in the same run.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <lowbit/kernels/optim.hpp>

#include "gpu_bench.hpp"

namespace lowbit::bench {

namespace {

using kernels::dtype;
using kernels::optimizer;

constexpr std::int64_t min_8bit_size = 4096;

std::vector<std::int64_t> vit_h_shapes() {
  const std::int64_t w = 1280, mlp = 5120;
  std::vector<std::int64_t> s;
  for (int layer = 0; layer < 51; ++layer)
    for (std::int64_t n : {3 * w * w, 3 * w, w * w, w, mlp * w, mlp, w * mlp, w, w, w, w, w})
      s.push_back(n);
  return s;
}

std::int64_t aligned(std::int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// One arena per buffer kind, the tensors carved out at 256-byte boundaries.
struct arenas {
  std::vector<std::int64_t> n;
  std::int64_t total = 0;
  unsigned char *p = nullptr, *g = nullptr, *s1 = nullptr, *s2 = nullptr, *a1 = nullptr,
                *a2 = nullptr;
  unsigned char *p16 = nullptr, *g16 = nullptr; // bfloat16 copies (the float32 values truncated)
  unsigned char* res = nullptr;                 // residual master weights (zero: p16 exact)
  std::vector<std::int64_t> off4, off1, offa;   // per tensor: 4-byte, 1-byte and absmax offsets
  std::int64_t bytes4 = 0, bytes1 = 0, bytesa = 0;
  arenas() : n(vit_h_shapes()) {
    for (std::int64_t k : n) {
      off4.push_back(bytes4);
      off1.push_back(bytes1);
      offa.push_back(bytesa);
      bytes4 += aligned(4 * k);
      bytes1 += aligned(k);
      bytesa += aligned(4 * kernels::blockwise_blocks(k, 256));
      total += k;
    }
    ok(cudaMalloc(&p, bytes4));
    ok(cudaMalloc(&g, bytes4));
    ok(cudaMalloc(&s1, bytes4)); // room for 32-bit states; 8-bit ones use the first bytes1
    ok(cudaMalloc(&s2, bytes4));
    ok(cudaMalloc(&a1, bytesa));
    ok(cudaMalloc(&a2, bytesa));
    fill_normal(reinterpret_cast<float*>(p), bytes4 / 4, 1, 0.02f);
    fill_normal(reinterpret_cast<float*>(g), bytes4 / 4, 2, 1e-3f);
    ensure_copy_bandwidth(s1, p, static_cast<std::size_t>(bytes4));
  }
  // The high halves of the float32 values: their bfloat16 truncations, at half the offsets.
  void ensure_16() {
    if (p16 != nullptr)
      return;
    ok(cudaMalloc(&p16, bytes4 / 2));
    ok(cudaMalloc(&g16, bytes4 / 2));
    const auto rows = static_cast<std::size_t>(bytes4 / 4);
    ok(cudaMemcpy2D(p16, 2, p + 2, 4, 2, rows, cudaMemcpyDeviceToDevice));
    ok(cudaMemcpy2D(g16, 2, g + 2, 4, 2, rows, cudaMemcpyDeviceToDevice));
  }
};

arenas& buf() {
  static arenas a;
  return a;
}

struct row {
  optimizer o;
  bool eight;
  dtype pt;
  std::int64_t block;
  int rbits = 0; // a residual master weight of 8 or 16 bits (bfloat16 parameters)
};

// Resets the states (zero codes, zero absmax, zero float states) so every row starts alike.
void reset_states(arenas& A, const row& r) {
  ok(cudaMemset(A.s1, 0, A.bytes4));
  ok(cudaMemset(A.s2, 0, A.bytes4));
  ok(cudaMemset(A.a1, 0, A.bytesa));
  ok(cudaMemset(A.a2, 0, A.bytesa));
  if (r.eight && kernels::optimizer_state_signed(r.o, 0))
    for (std::size_t j = 0; j < A.n.size(); ++j)
      if (A.n[j] >= min_8bit_size)
        ok(cudaMemset(A.s1 + A.off1[j], 127, static_cast<std::size_t>(A.n[j]))); // code of 0
}

void bench_row(benchmark::State& state, row r) {
  arenas& A = buf();
  kernels::optim_hparams h;
  h.step = 10;
  h.weight_decay = 0.01;
  h.momentum = 0.9;
  const int ns = kernels::optimizer_states(r.o, h);
  reset_states(A, r);
  const std::int64_t es = static_cast<std::int64_t>(kernels::dtype_size(r.pt));
  if (es == 2)
    A.ensure_16();
  if (r.rbits != 0 && A.res == nullptr) {
    ok(cudaMalloc(&A.res, A.bytes4 / 2));
    ok(cudaMemset(A.res, 0, A.bytes4 / 2));
  }
  std::vector<kernels::optim_tensor> ts;
  double bytes = 0;
  for (std::size_t j = 0; j < A.n.size(); ++j) {
    const std::int64_t n = A.n[j];
    const bool eight = r.eight && n >= min_8bit_size;
    const std::int64_t blocks = kernels::blockwise_blocks(n, r.block);
    kernels::optim_tensor t;
    if (es == 2) {
      t.param = dev_view(A.p16 + A.off4[j] / 2, r.pt, {n});
      t.grad = dev_view(A.g16 + A.off4[j] / 2, r.pt, {n});
    } else {
      t.param = dev_view(A.p + A.off4[j], r.pt, {n});
      t.grad = dev_view(A.g + A.off4[j], r.pt, {n});
    }
    unsigned char* s[2] = {A.s1, A.s2};
    unsigned char* a[2] = {A.a1, A.a2};
    kernels::tensor_view* sv[2] = {&t.state1, &t.state2};
    kernels::tensor_view* av[2] = {&t.absmax1, &t.absmax2};
    for (int k = 0; k < ns; ++k) {
      if (eight) {
        *sv[k] = dev_view(s[k] + A.off1[j], dtype::uint8, {n});
        *av[k] = dev_view(a[k] + A.offa[j], dtype::float32, {blocks});
      } else {
        *sv[k] = dev_view(s[k] + A.off4[j], dtype::float32, {n});
      }
    }
    if (r.rbits != 0) {
      t.residual = dev_view(A.res + A.off4[j] / 2, r.rbits == 16 ? dtype::int16 : dtype::int8, {n});
      bytes += 2.0 * static_cast<double>(n) * (r.rbits / 8);
    }
    ts.push_back(t);
    const double state_bytes = eight ? 1.0 : 4.0;
    bytes += static_cast<double>(n) * (3.0 * static_cast<double>(es) + 2.0 * ns * state_bytes);
    if (eight)
      bytes += 2.0 * ns * 4.0 * static_cast<double>(blocks);
    if (r.o == optimizer::stable_adamw) // the RMS pass: gradient and second moment again
      bytes += static_cast<double>(n) * (static_cast<double>(es) + state_bytes) +
               (eight ? 4.0 * static_cast<double>(blocks) : 0.0);
    if (r.o == optimizer::lamb) // the norms' pass: parameter, gradient and both moments again
      bytes += static_cast<double>(n) * (2.0 * static_cast<double>(es) + 2.0 * state_bytes) +
               (eight ? 8.0 * static_cast<double>(blocks) : 0.0);
    if (r.o == optimizer::lars) // the norms' pass: parameter and gradient again
      bytes += static_cast<double>(n) * 2.0 * static_cast<double>(es);
  }
  kernels::optim_config cfg;
  cfg.block = r.block;
  // The skip counts of one step, checked to be zero (a skipped block moves fewer bytes).
  std::int64_t* skipped = nullptr;
  ok(cudaMalloc(&skipped, 8 * ts.size()));
  ok(cudaMemset(skipped, 0, 8 * ts.size()));
  kernels::optimizer_step(r.o, h, ts.data(), static_cast<std::int64_t>(ts.size()),
                          dev_view(skipped, dtype::int64, {static_cast<std::int64_t>(ts.size())}),
                          cfg);
  std::vector<std::int64_t> sk(ts.size());
  ok(cudaMemcpy(sk.data(), skipped, 8 * ts.size(), cudaMemcpyDeviceToHost));
  ok(cudaFree(skipped));
  std::int64_t total_skipped = 0;
  for (std::int64_t v : sk)
    total_skipped += v;
  state.counters["skipped_blocks"] = static_cast<double>(total_skipped);
  timed(state, bytes, [&] {
    kernels::optimizer_step(r.o, h, ts.data(), static_cast<std::int64_t>(ts.size()), {}, cfg);
  });
  add_ratio(state, bytes);
  state.counters["bytes_per_param"] = bytes / static_cast<double>(A.total);
  state.counters["params"] = static_cast<double>(A.total);
  state.counters["tensors"] = static_cast<double>(ts.size());
}

void register_optim() {
  const row rows[] = {
      {optimizer::adamw, true, dtype::float32, 256},
      {optimizer::adamw, false, dtype::float32, 256},
      {optimizer::adamw, true, dtype::float32, 2048},
      {optimizer::adamw, true, dtype::bfloat16, 256},
      {optimizer::stable_adamw, true, dtype::float32, 256},
      {optimizer::stable_adamw, false, dtype::float32, 256},
      {optimizer::lion, true, dtype::float32, 256},
      {optimizer::sgd, true, dtype::float32, 256},
      {optimizer::adam, true, dtype::float32, 256},
      {optimizer::lamb, true, dtype::float32, 256},
      {optimizer::lamb, false, dtype::float32, 256},
      {optimizer::lars, true, dtype::float32, 256},
      {optimizer::adamw, false, dtype::bfloat16, 256, 16},
      {optimizer::adamw, true, dtype::bfloat16, 256, 16},
      {optimizer::adamw, true, dtype::bfloat16, 256, 8},
  };
  for (const row& r : rows) {
    const std::string name = std::string("optim_step/") + kernels::optimizer_name(r.o) + "/" +
                             (r.eight ? "8bit" : "32bit") + "/" + kernels::dtype_name(r.pt) +
                             "/block" + std::to_string(r.block) + "/vit_h_51_layers" +
                             (r.rbits ? "/residual" + std::to_string(r.rbits) : "");
    register_gpu(name, [r](benchmark::State& s) { bench_row(s, r); });
  }
}

} // namespace

// Registered before main() (as gemm_gpu.cpp does), so quantize_gpu.cpp's main() runs these rows
// with the others; main() returns before any of them without a device.
[[maybe_unused]] const int optim_registered = (register_optim(), 0);

} // namespace lowbit::bench
