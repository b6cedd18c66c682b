#!/usr/bin/env bash
# Runs every test on this machine: the C++ property tests (emu vs reference, CPU twins vs
# reference, exhaustive sweeps), the GPU tests (they skip, saying so, without a device) and the
# Python tests. Sets itself up first (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset ci -DPython_EXECUTABLE="$(command -v "${PYTHON:-python3}")" >/dev/null
cmake --build --preset ci
ctest --preset ci -j "$(nproc)"
