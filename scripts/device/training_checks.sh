#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool), after build.sh: the checks of the training
# techniques (the GEMM layer, the low-precision linears, the optimizers, residual master weights,
# Mesa's activation quantization, fp8 training): their GPU tests, the sanitizer on them, their
# benchmarks, the Python tests with CUDA tensors, the layer benchmarks against bf16 nn.Linear and
# the peers, and the small training runs. Everything lands in $OUT; one line per step and the
# numbers are printed last.
#
# The peers (torchao, bitsandbytes, torch-optimi) come unpacked from their PyPI wheels in
# .deps/py (nothing can be downloaded there; bitsandbytes keeps only its CUDA 13.0 and CPU
# libraries), put on PYTHONPATH for the benchmarks alone, never installed.
#   GPU_CHECKS_BUDGET_S   seconds for the whole script (default 480)
#   TRAIN_STEPS           steps of each training run (default 300)
#   STEPS                 which steps to run (default all): a list of the names below
#   PY_MARK               the Python tests' marker expression (default "torch or gpu")
#   GPU_FILTER            the GPU tests' gtest filter; BENCH_FILTER the GPU benchmarks' filter
#   TRAIN_TOKENS          tokens of optim_torch.py's training step (default 4096)
set -uo pipefail
bin=.deps/bin
out=${OUT:-/tmp/out}
budget=${GPU_CHECKS_BUDGET_S:-480}
steps=${STEPS:-gpu_tests memcheck bench python linear optim train trajectories residual mesa float8 train_fp8}
pybuild=${LOWBIT_DEVICE_BUILD:-/tmp/lowbit-device}/python
export LD_LIBRARY_PATH=$bin:${LD_LIBRARY_PATH:-}
source "$(dirname "$0")/steps.sh"
want() { [[ " $steps " == *" $1 "* ]]; }
ao=$PWD/.deps/py
filter=${GPU_FILTER:-'gpu_gemm.*:gpu_optim.*:gpu_residual.*:gpu_actquant.*'}
if want gpu_tests; then
  run gpu_tests 150 env RC_PARAMS="max_success=100" $bin/lowbit_gpu_tests --gtest_filter="$filter"
fi
if want memcheck; then
  run memcheck 150 env RC_PARAMS="max_success=5" compute-sanitizer --tool memcheck \
    --error-exitcode 9 $bin/lowbit_gpu_tests --gtest_filter="$filter"
fi
if want bench; then
  run bench 200 $bin/lowbit_bench_gpu --benchmark_filter="${BENCH_FILTER:-^(copy|gemm|optim)}" \
    --benchmark_out="$out/bench_training.json" --benchmark_out_format=json
fi
if want python; then
  tests=$(ls python/tests/test_gemm.py python/tests/test_nn*.py python/tests/test_optim*.py \
    python/tests/test_residual*.py python/tests/test_torch_arrays.py 2> /dev/null)
  run python 200 env PYTHONPATH="$pybuild" python3 -m pytest -q -p no:cacheprovider -rs \
    -m "${PY_MARK:-torch or gpu}" $tests
fi
if want linear; then
  run linear 240 env PYTHONPATH="$pybuild:$ao" python3 bench/linear_torch.py "$out/linear_torch.json"
fi
if want optim && [[ -f bench/optim_torch.py ]]; then
  run optim 180 env PYTHONPATH="$pybuild:$ao" python3 bench/optim_torch.py --device cuda \
    --layers 51 --steps 20 --train-tokens "${TRAIN_TOKENS:-4096}" --json "$out/optim_torch.json"
fi
if want train; then
  run train 300 env PYTHONPATH="$pybuild" python3 bench/train_tiny.py --out "$out" \
    --steps "${TRAIN_STEPS:-300}"
fi
if want trajectories && [[ -f bench/optim_trajectories.py ]]; then
  run trajectories 200 env PYTHONPATH="$pybuild" python3 bench/optim_trajectories.py \
    --device cuda --steps 500 --out "$out"
fi
if want residual && [[ -f bench/residual_torch.py ]]; then
  run residual 150 env PYTHONPATH="$pybuild" python3 bench/residual_torch.py \
    --json "$out/residual_torch.json"
fi
if want mesa && [[ -f bench/mesa_torch.py ]]; then
  run mesa 200 env PYTHONPATH="$pybuild" python3 bench/mesa_torch.py "$out/mesa_torch.json" \
    --plot "$out/mesa_training.png"
fi
if want float8 && [[ -f bench/float8_torch.py ]]; then
  run float8 150 env PYTHONPATH="$pybuild" python3 bench/float8_torch.py "$out/float8_torch.json"
fi
if want train_fp8 && [[ -f bench/train_fp8.py ]]; then
  run train_fp8 240 env PYTHONPATH="$pybuild" python3 bench/train_fp8.py --out "$out" \
    --steps "${TRAIN_STEPS:-300}"
fi
echo "== benchmarks"
[[ -f $out/bench.log ]] && grep -E "^(copy|gemm|optim)" "$out/bench.log" |
  awk '{n = $1; sub(/\/min_time:.*/, "", n); sub(/\/manual_time/, "", n); printf "%-60s %9s %s", n, $2, $3
        for (i = 7; i <= NF; i++) if ($i !~ /^bytes_per_second=/) printf " %s", $i
        print ""}'
echo "== steps (budget ${budget}s, used ${SECONDS}s)"
printf '%s\n' "${summary[@]}"
