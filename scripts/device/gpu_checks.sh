#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool) with binaries built elsewhere in .deps/bin:
# GPU tests, compute-sanitizer memcheck and racecheck, the GPU benchmarks, PyTorch baselines and
# an Nsight Compute summary of the kernels that must reach memory bandwidth. Everything lands in
# $OUT; the benchmark rows, the PyTorch rows and one line per step are printed last, so that
# the tail of stdout carries the numbers even when only a few files come back.
#
# Time: every step runs under its own timeout, cut to what is left of a budget for the whole
# script (GPU_CHECKS_BUDGET_S, 400 s by default, well under the device's per-command limit);
# a step that would get less than 20 s is skipped and listed as rc=skip.
set -uo pipefail
bin=.deps/bin
out=${OUT:-/tmp/out}
budget=${GPU_CHECKS_BUDGET_S:-400}
export LD_LIBRARY_PATH=$bin:${LD_LIBRARY_PATH:-}
timeout 20 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv \
  > "$out/gpu.txt" 2>&1
source "$(dirname "$0")/steps.sh"
blockwise_tests='gpu_vs_cpu.blockwise_*:gpu_vs_cpu.sram_quantiles*'
# Ordered by importance, so that a short lease or a slow step still leaves the main results:
# the tests, the benchmarks, the sanitizers on the block-wise kernels (new, never run on a GPU
# before), then the large-index and exhaustive sweeps, the other sanitizer runs, Nsight Compute.
export RC_PARAMS="max_success=60"
run gpu_tests 150 $bin/lowbit_gpu_tests --gtest_filter=-gpu_large.*
unset RC_PARAMS
run bench 150 $bin/lowbit_bench_gpu --benchmark_out="$out/bench_gpu.json" \
  --benchmark_out_format=json
run torch 60 python3 bench/torch_baselines.py "$out/torch_baselines.json"
export RC_PARAMS="max_success=8"
run memcheck_blockwise 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter="$blockwise_tests"
# racecheck follows every shared-memory access (the CUB block sort of the quantile kernel, the
# codebook tables and block maximum of quantize): few cases.
export RC_PARAMS="max_success=2"
run racecheck_blockwise 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter="$blockwise_tests"
unset RC_PARAMS
run gpu_large 180 $bin/lowbit_gpu_tests --gtest_filter=gpu_large.*
run gpu_exhaustive 60 $bin/lowbit_gpu_exhaustive
# The group pass with the staging depths of GPUs with less shared memory (two stages on
# A100-class GPUs, one where about 100 KiB fit a block), on this GPU: LOWBIT_GROUP_STAGES caps
# the depth (group_pass.cuh).
group_tests='gpu_vs_cpu.quantize_every_grouping:gpu_vs_cpu.mx_quantize_and_dequantize:gpu_vs_cpu.blockwise_*'
export RC_PARAMS="max_success=30"
run gpu_tests_2_stages 60 env LOWBIT_GROUP_STAGES=2 $bin/lowbit_gpu_tests --gtest_filter="$group_tests"
run gpu_tests_1_stage 60 env LOWBIT_GROUP_STAGES=1 $bin/lowbit_gpu_tests --gtest_filter="$group_tests"
export RC_PARAMS="max_success=2"
run racecheck_1_stage 90 env LOWBIT_GROUP_STAGES=1 compute-sanitizer --tool racecheck \
  --error-exitcode 9 $bin/lowbit_gpu_tests --gtest_filter="$group_tests"
unset RC_PARAMS
export RC_PARAMS="max_success=8"
run memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter="-gpu_large.*:$blockwise_tests"
export RC_PARAMS="max_success=4"
run racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter=gpu_vs_cpu.quantize_every_grouping:gpu_vs_cpu.mx_quantize_and_dequantize
# simt's model kernel stages K through shared memory in every stage of its loop.
export RC_PARAMS="max_success=2"
run racecheck_model 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
  $bin/lowbit_gpu_tests --gtest_filter=gpu_gemm.simt_model_kernel_equals_the_twin
unset RC_PARAMS
# Where the time goes in the kernels that must reach memory bandwidth (one benchmark per ncu run;
# --launch-skip 1 skips the first launch: the benchmark's warm-up for quantize_gpu.cpp's rows,
# the input generation for blockwise_gpu.cpp's; the next three launches are then profiled, e.g.
# amax + scale + cast of current scaling, bucket table + quantize, or the quantile kernels).
for b in quantize_mxfp8_e4m3fn quantize_rows_int8_4096 blockwise_quantize_dynamic_f32_b2048 \
  blockwise_dequantize_dynamic_f32_b256 sram_quantiles_f32_k256 quantize_tensor_current_e4m3fn; do
  run ncu_$b 45 ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section SchedulerStats --section InstructionStats \
    --launch-skip 1 --launch-count 3 $bin/lowbit_bench_gpu --benchmark_filter="^$b/"
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Through|Compute \(SM\) Th|Achieved Occ|Registers Per|Grid Size|Executed Instructions  |Issued Warp Per|No Eligible" \
    "$out/ncu_$b.log" | head -40
done
# The results, last: benchmark rows (name, time per call, counters: GB/s; of_copy = fraction of
# the copy bandwidth of the same run; items_per_second for the quantile row), PyTorch rows, steps.
echo "== lowbit_bench_gpu"
grep -E "^(copy|cast|quant|decode|dequant|blockwise|sram|gemm)" "$out/bench.log" |
  awk '{n = $1; sub(/\/min_time:.*/, "", n); printf "%-46s %9s %s", n, $2, $3
        for (i = 7; i <= NF; i++) if ($i !~ /^bytes_per_second=/) printf " %s", $i
        print ""}'
echo "== bench/torch_baselines.py"
cat "$out/torch.log"
echo "== steps (budget ${budget}s, used ${SECONDS}s)"
printf '%s\n' "${summary[@]}"
