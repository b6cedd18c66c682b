#!/usr/bin/env bash
# Runs on the GPU machine: one build of the GPU tests and the Python module (sm_90, all cores, in
# build/device so that a later call on the same warm machine reuses it), then the activation
# quantization's GPU tests, compute-sanitizer memcheck and racecheck on them, the Python tests of
# lowbit.nn.mesa on CUDA, and bench/mesa_torch.py. Arguments after `--` go to mesa_torch.py.
# Everything lands in $OUT; one line per step, then the benchmark's table, ends the output.
#
#   bash scripts/device/mesa_checks.sh [build|test|bench|all] [-- mesa_torch.py arguments]
#
# MESA_TARGETS (default: the GPU tests and the Python module) names what `build` builds; with
# the Python module alone, `test` runs the Python tests only.
set -uo pipefail
out=${OUT:-/tmp/out}
budget=${MESA_CHECKS_BUDGET_S:-580}
b=$PWD/build/device
what=${1:-all}
shift || true
[[ ${1:-} == "--" ]] && shift
source "$(dirname "$0")/steps.sh"
if [[ $what == build || $what == all ]]; then
  prefix=$PWD/.deps/rapidcheck/usr
  if [[ -f .deps/cutlass.tar.xz && ! -d .deps/cutlass/include ]]; then
    mkdir -p .deps/cutlass && tar xJf .deps/cutlass.tar.xz -C .deps/cutlass
  fi
  run configure 120 cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLOWBIT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWBIT_ENABLE_PYTHON=ON \
    -DLOWBIT_ENABLE_TESTS=ON -DLOWBIT_ENABLE_BENCH=OFF -DCMAKE_PREFIX_PATH="$prefix" \
    -DLOWBIT_CUTLASS_INCLUDE_DIR="$PWD/.deps/cutlass/include"
  # shellcheck disable=SC2086 # a list of targets
  run build 420 cmake --build "$b" -j "$(nproc)" --target ${MESA_TARGETS:-lowbit_gpu_tests lowbit_python_core}
fi
if [[ $what == test || $what == all ]]; then
  tests=$b/proptests/gpu/lowbit_gpu_tests
  if [[ -x $tests ]]; then
    RC_PARAMS="max_success=100" run gpu_actquant 120 "$tests" --gtest_filter='gpu_actquant.*'
  fi
  PYTHONPATH="$b/python" run python_mesa 240 python3 -m pytest -q -p no:cacheprovider -rs \
    -m "torch or gpu" python/tests/test_nn_mesa.py
fi
if [[ $what == bench || $what == all ]]; then
  PYTHONPATH="$b/python" run mesa_bench 400 python3 bench/mesa_torch.py "$out/mesa.json" "$@"
  tail -n 40 "$out/mesa_bench.log"
fi
if [[ ($what == test || $what == all) && -x $b/proptests/gpu/lowbit_gpu_tests ]]; then
  # The sanitizers last: the slowest steps, and the ones a short budget can spare.
  tests=$b/proptests/gpu/lowbit_gpu_tests
  RC_PARAMS="max_success=3" run memcheck_layer_norm 90 compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$tests" --gtest_filter='gpu_actquant.layer_norm*'
  RC_PARAMS="max_success=2" run racecheck_layer_norm 90 compute-sanitizer --tool racecheck \
    --error-exitcode 9 "$tests" --gtest_filter='gpu_actquant.layer_norm*'
  RC_PARAMS="max_success=3" run memcheck_activation 120 compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$tests" --gtest_filter='gpu_actquant.activation*'
fi
printf '%s\n' "${summary[@]}"
