#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool) with binaries built elsewhere in .deps/bin:
# GPU tests, compute-sanitizer memcheck and racecheck, the GPU benchmarks, PyTorch baselines and
# the SASS of the cast kernels. Everything lands in $OUT; a summary table is printed last.
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
run gpu_tests $bin/lowbit_gpu_tests --gtest_filter=-gpu_large.*
run gpu_large $bin/lowbit_gpu_tests --gtest_filter=gpu_large.*
run gpu_exhaustive $bin/lowbit_gpu_exhaustive
export RC_PARAMS="max_success=12"
run memcheck timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter=-gpu_large.*
export RC_PARAMS="max_success=5"
run racecheck timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter=gpu_vs_cpu.quantize_every_grouping:gpu_vs_cpu.mx_quantize_and_dequantize
unset RC_PARAMS
run bench $bin/lowbit_bench_gpu --benchmark_out="$out/bench_gpu.json" --benchmark_out_format=json
run torch python3 bench/torch_baselines.py "$out/torch_baselines.json"
cuobjdump --dump-sass $bin/lowbit_bench_gpu > "$out/sass.txt" 2>&1
grep -E "^(copy|cast|quant|decode|dequant)" "$out/bench.log" | awk '{printf "%-44s %s %s %s\n",$1,$2,$3,$NF}'
cat "$out/torch.log"
printf '%s\n' "${summary[@]}"
