#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool) with binaries built elsewhere in .deps/bin:
# GPU tests, compute-sanitizer memcheck and racecheck, the GPU benchmarks, PyTorch baselines and
# an Nsight Compute summary of the kernels that must reach memory bandwidth. Everything lands in $OUT; a summary table is printed last.
set -uo pipefail
bin=.deps/bin
out=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=$bin:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
summary=()
run() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))")
  tail -n 5 "$out/$name.log"
}
# Ordered by importance, each step bounded, so that a short device lease still returns results.
export RC_PARAMS="max_success=60"
run gpu_tests timeout 150 $bin/lowbit_gpu_tests --gtest_filter=-gpu_large.*
unset RC_PARAMS
run gpu_large timeout 120 $bin/lowbit_gpu_tests --gtest_filter=gpu_large.*
run gpu_exhaustive timeout 60 $bin/lowbit_gpu_exhaustive
run bench timeout 150 $bin/lowbit_bench_gpu --benchmark_out="$out/bench_gpu.json" \
  --benchmark_out_format=json
run torch timeout 60 python3 bench/torch_baselines.py "$out/torch_baselines.json"
grep -E "^(copy|cast|quant|decode|dequant)" "$out/bench.log" | awk '{printf "%-44s %s %s %s\n",$1,$2,$3,$NF}'
cat "$out/torch.log"
export RC_PARAMS="max_success=8"
run memcheck timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter=-gpu_large.*
export RC_PARAMS="max_success=4"
run racecheck timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter=gpu_vs_cpu.quantize_every_grouping:gpu_vs_cpu.mx_quantize_and_dequantize
unset RC_PARAMS
# Where the time goes in the kernels that must reach memory bandwidth (one benchmark per ncu run;
# the first launch is the benchmark's warm-up).
for b in cast_f32_e4m3fn_rne_sat cast_scaled_f32_e4m3fn decode_e4m3fn_f32 quantize_rows_int8_4096; do
  run ncu_$b timeout 45 ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
    --launch-skip 1 --launch-count 2 $bin/lowbit_bench_gpu --benchmark_filter="^$b/"
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Through|Compute \(SM\) Th|Achieved Occ|Registers Per|Block Size|Grid Size" \
    "$out/ncu_$b.log" | head -40
done
printf '%s\n' "${summary[@]}"
