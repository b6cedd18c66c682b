#!/usr/bin/env bash
# Runs on the GPU machine: builds the Python module with the CUDA kernels (sm_90) and runs the
# Python tests marked `torch`, `gpu` or `cupy` (PyTorch CPU and CUDA tensors and CuPy arrays
# through DLPack, the caller's stream). `build` and `test` are separate steps so that the build can
# overlap other GPU work. The `cupy` tests skip, with the reason, unless CuPy imports: source
# scripts/device/cupy_setup.sh first (it puts the carried CuPy on PYTHONPATH, which `test` keeps).
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
    PYTHONPATH="$b/python${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 -m pytest python/tests \
      -q -m "torch or gpu or cupy" \
      -p no:cacheprovider -rs > "$out/python_gpu_tests.log" 2>&1
    echo "python gpu tests rc=$?" >> "$out/python_gpu_tests.log"
    tail -n 25 "$out/python_gpu_tests.log" ;;&
  host | all)
    # The host-side suites that failed only on the GPU machine (verify reports, fuzzing with
    # PyTorch present), with Python's fault handler, and a native backtrace under gdb when one
    # of them crashes and gdb is there.
    PYTHONPATH="$b/python" timeout 240 python3 -X faulthandler -m pytest -q -p no:cacheprovider \
      python/tests/test_verify.py python/tests/test_verify_dlpack.py python/tests/test_fuzz.py \
      python/tests/test_cli_verify.py python/tests/test_report.py -rf \
      > "$out/python_host_tests.log" 2>&1
    rc=$?
    echo "python host tests rc=$rc" >> "$out/python_host_tests.log"
    if ((rc > 1)) && command -v gdb > /dev/null; then
      PYTHONPATH="$b/python" timeout 120 gdb -batch -ex run -ex bt --args python3 -m pytest -q \
        -p no:cacheprovider python/tests/test_verify.py python/tests/test_report.py -x \
        > "$out/python_host_gdb.log" 2>&1
      grep -E "^#[0-9]+" "$out/python_host_gdb.log" | head -30
    fi
    grep -iE "passed|failed|error|Fatal|Segmentation|File \"" "$out/python_host_tests.log" | head -40 ;;
esac
