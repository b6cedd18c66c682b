// CPU cast throughput of the CPU twin (lowbit::kernels::cast): float32 -> format codes, one and
// two threads, for every rounding mode on e4m3fn and nearest-even on the other named formats.
// The ratio against ml_dtypes is measured by `lowbit report` (same machine, same run).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include <lowbit/emu/names.hpp>
#include <lowbit/kernels/cast.hpp>

namespace {

using namespace lowbit;

std::vector<float> gaussian(std::size_t n) {
  std::vector<float> x(n);
  std::mt19937 gen(42);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x)
    v = d(gen);
  return x;
}

void cast_bench(benchmark::State& state, emu::format fmt, emu::policy pol) {
  const auto n = static_cast<std::int64_t>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  static const std::vector<float> x = gaussian(1 << 24);
  std::vector<std::uint32_t> out(static_cast<std::size_t>(n)); // large enough for any code type
  const auto in = kernels::tensor_view::contiguous(x.data(), kernels::dtype::float32, {n});
  const auto codes = kernels::tensor_view::contiguous(out.data(), kernels::code_dtype(fmt), {n});
  for (auto _ : state) {
    kernels::cast(in, codes, fmt, pol, emu::random_stream{1, 0}, kernels::exec{threads});
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n *
                          static_cast<std::int64_t>(4 + kernels::dtype_size(codes.type)));
}

void register_all() {
  const std::int64_t n = 1 << 24;
  for (emu::rounding r : emu::all_roundings) {
    // Non-saturating, as ml_dtypes' astype (bench/cpu_vs_ml_dtypes.py compares the two).
    emu::policy p{r, emu::overflow::nonsaturating};
    if (r == emu::rounding::stochastic)
      p.random_bits = 8;
    const std::string name = std::string("cast_f32/e4m3fn/") + emu::rounding_name(r);
    benchmark::RegisterBenchmark(name.c_str(), cast_bench, emu::e4m3fn, p)
        ->Args({n, 1})
        ->Args({n, 2})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const auto& f : emu::named_formats) {
    if (f.fmt == emu::e4m3fn)
      continue;
    const std::string name = std::string("cast_f32/") + f.name + "/nearest_even";
    benchmark::RegisterBenchmark(name.c_str(), cast_bench, f.fmt, emu::rne)
        ->Args({n, 1})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

} // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
