#!/usr/bin/env bash
# Runs on the GPU machine: builds the Python module with the CUDA kernels (sm_90) and runs the
# Python tests marked `torch` or `gpu` (PyTorch CPU and CUDA tensors through DLPack, the caller's
# stream). `build` and `test` are separate steps so that the build can overlap other GPU work.
set -uo pipefail
out=${OUT:-/tmp/out}
b=${LOWBIT_PY_BUILD:-/tmp/lowbit-py}
case ${1:-all} in
  build | all)
    { cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWBIT_ENABLE_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWBIT_ENABLE_PYTHON=ON -DLOWBIT_ENABLE_TESTS=OFF \
        -DLOWBIT_ENABLE_BENCH=OFF -DLOWBIT_ENABLE_REFERENCE=OFF &&
        cmake --build "$b" --target lowbit_python_core -j "$(nproc)"; } > "$out/python_build.log" 2>&1
    echo "python build rc=$?" >> "$out/python_build.log" ;;&
  test | all)
    PYTHONPATH="$b/python" timeout 300 python3 -m pytest python/tests -q -m "torch or gpu" \
      -p no:cacheprovider -rs > "$out/python_gpu_tests.log" 2>&1
    echo "python gpu tests rc=$?" >> "$out/python_gpu_tests.log"
    tail -n 25 "$out/python_gpu_tests.log" ;;
esac
