#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), after build.sh: the checks of the training
# techniques (the GEMM layer, the low-precision linears, the optimizers): their GPU tests, the
# sanitizer on them, their benchmarks, the Python tests with CUDA tensors, the layer benchmark
# against bf16 nn.Linear and torchao, and the small training runs. Everything lands in $OUT; one
# line per step and the numbers are printed last.
#
# The peers (torchao, bitsandbytes, torch-optimi) come unpacked from their PyPI wheels in
# .deps/py (nothing can be downloaded there; bitsandbytes keeps only its CUDA 13.0 and CPU
# libraries), put on PYTHONPATH for the benchmarks alone, never installed.
#   GPU_CHECKS_BUDGET_S   seconds for the whole script (default 480)
#   TRAIN_STEPS           steps of each training run (default 300)
#   STEPS                 which steps to run (default all): a list of the names below
#   PY_MARK               the Python tests' marker expression (default "torch or gpu")
set -uo pipefail
bin=.deps/bin
out=${OUT:-/tmp/out}
budget=${GPU_CHECKS_BUDGET_S:-480}
steps=${STEPS:-gpu_tests memcheck bench python linear optim train}
pybuild=${LOWBIT_DEVICE_BUILD:-/tmp/lowbit-device}/python
export LD_LIBRARY_PATH=$bin:${LD_LIBRARY_PATH:-}
source "$(dirname "$0")/steps.sh"
want() { [[ " $steps " == *" $1 "* ]]; }
ao=$PWD/.deps/py
filter='gpu_gemm.*:gpu_optim.*'
if want gpu_tests; then
  run gpu_tests 150 env RC_PARAMS="max_success=100" $bin/lowbit_gpu_tests --gtest_filter="$filter"
fi
if want memcheck; then
  run memcheck 150 env RC_PARAMS="max_success=5" compute-sanitizer --tool memcheck \
    --error-exitcode 9 $bin/lowbit_gpu_tests --gtest_filter="$filter"
fi
if want bench; then
  run bench 200 $bin/lowbit_bench_gpu --benchmark_filter='^(copy|gemm|optim)' \
    --benchmark_out="$out/bench_training.json" --benchmark_out_format=json
fi
if want python; then
  tests=$(ls python/tests/test_gemm.py python/tests/test_nn*.py python/tests/test_optim*.py \
    2> /dev/null)
  run python 200 env PYTHONPATH="$pybuild" python3 -m pytest -q -p no:cacheprovider -rs \
    -m "${PY_MARK:-torch or gpu}" $tests
fi
if want linear; then
  run linear 240 env PYTHONPATH="$pybuild:$ao" python3 bench/linear_torch.py "$out/linear_torch.json"
fi
if want optim && [[ -f bench/optim_torch.py ]]; then
  run optim 180 env PYTHONPATH="$pybuild:$ao" python3 bench/optim_torch.py --device cuda \
    --layers 51 --steps 20 --json "$out/optim_torch.json"
fi
if want train; then
  run train 300 env PYTHONPATH="$pybuild" python3 bench/train_tiny.py --out "$out" \
    --steps "${TRAIN_STEPS:-300}"
fi
echo "== benchmarks"
[[ -f $out/bench.log ]] && grep -E "^(copy|gemm|optim)" "$out/bench.log" |
  awk '{n = $1; sub(/\/min_time:.*/, "", n); sub(/\/manual_time/, "", n); printf "%-60s %9s %s", n, $2, $3
        for (i = 7; i <= NF; i++) if ($i !~ /^bytes_per_second=/) printf " %s", $i
        print ""}'
echo "== steps (budget ${budget}s, used ${SECONDS}s)"
printf '%s\n' "${summary[@]}"
