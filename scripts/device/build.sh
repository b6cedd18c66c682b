#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool): builds the GPU tests, the GPU benchmarks and the
# Python module for its GPU with all its cores, and puts the binaries where gpu_checks.sh and
# python_gpu.sh look (.deps/bin, and LOWBIT_PY_BUILD for the module). rapidcheck is not
# installed there: the device call carries Debian's package unpacked in .deps/rapidcheck
# (made here by `dpkg -L librapidcheck-dev`, see docs/benchmarks.md), and CUTLASS's headers in
# .deps/cutlass.tar.xz (cutlass_library/source/include of PyPI's nvidia-cutlass wheel, packed
# with `tar cJf .deps/cutlass.tar.xz -C <that directory>/.. include`), unpacked here.
set -euo pipefail
out=${OUT:-/tmp/out}
b=${LOWBIT_DEVICE_BUILD:-/tmp/lowbit-device}
prefix=$PWD/.deps/rapidcheck/usr
if [[ -f .deps/cutlass.tar.xz && ! -d .deps/cutlass/include ]]; then
  mkdir -p .deps/cutlass && tar xJf .deps/cutlass.tar.xz -C .deps/cutlass
fi
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWBIT_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DLOWBIT_ENABLE_PYTHON=ON -DLOWBIT_ENABLE_TESTS=ON \
  -DLOWBIT_ENABLE_BENCH=ON -DCMAKE_PREFIX_PATH="$prefix" \
  -DLOWBIT_CUTLASS_INCLUDE_DIR="$PWD/.deps/cutlass/include" > "$out/device_build.log" 2>&1
cmake --build "$b" -j "$(nproc)" --target lowbit_gpu_tests lowbit_gpu_exhaustive lowbit_bench_gpu \
  lowbit_python_core >> "$out/device_build.log" 2>&1
mkdir -p .deps/bin
cp "$b"/proptests/gpu/lowbit_gpu_* "$b"/bench/lowbit_bench_gpu .deps/bin/
echo "device build: $(ls .deps/bin | tr '\n' ' ')"
