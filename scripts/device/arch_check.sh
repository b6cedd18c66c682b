#!/usr/bin/env bash
# Runs on the GPU machine: builds the kernel library for sm_75 and sm_80 (the emulation path uses
# no fp8 instructions, so it must compile for GPUs without them). Prints one line with the result.
set -uo pipefail
out=${OUT:-/tmp/out}
b=/tmp/lowbit-arch
{ cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWBIT_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="75;80" -DLOWBIT_ENABLE_PYTHON=OFF -DLOWBIT_ENABLE_TESTS=OFF \
    -DLOWBIT_ENABLE_BENCH=OFF -DLOWBIT_ENABLE_REFERENCE=OFF &&
    cmake --build "$b" --target lowbit_kernels -j "$(nproc)"; } > "$out/arch_check.log" 2>&1
echo "sm_75/sm_80 kernel build rc=$?"
