#!/usr/bin/env bash
# Runs every test on this machine: the C++ property tests (emu vs reference, CPU twins vs
# reference, exhaustive sweeps), the GPU tests (they skip, saying so, without a device) and the
# Python tests, PyTorch's among them (on the CPU where there is no GPU). Sets itself up first
# (scripts/setup.sh test; scripts/lib.sh says which Python it uses). Builds in build/ci, kept
# between runs, for the GPU it sees (none: the CPU library; LOWBIT_CUDA_ARCHITECTURES chooses
# otherwise). Also builds the wheel (`pip wheel .`) from the same build tree and installs it into
# the virtual environment, so that the Python tests check what pip installs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$lowbit_root"
scripts/setup.sh test
python=$(lowbit_python)
# The interpreter's own path (not a shim), as scikit-build-core passes it: both configures of the
# build tree below then agree.
python=$("$python" -c "import sys; print(sys.executable)")
echo "test: Python $python" >&2
# shellcheck disable=SC2046
lowbit_step "configure build/ci" cmake --preset ci -DPython_EXECUTABLE="$python" $(lowbit_cuda_args) \
  >/dev/null
lowbit_step "build build/ci" cmake --build --preset ci

# The wheel, packed from build/ci itself: scikit-build-core reconfigures it with the ci preset's
# settings (the -C options restore those that pyproject.toml turns off for users' wheels) and
# builds the module target, which is up to date, so nothing is compiled twice (a few seconds).
wheel_dir=build/ci/wheel
rm -rf "$wheel_dir"
lowbit_step "wheel" env CMAKE_GENERATOR=Ninja "$python" -m pip wheel . -q --no-build-isolation \
  --no-deps --disable-pip-version-check -w "$wheel_dir" -C build-dir="$PWD/build/ci" \
  -C cmake.build-type=RelWithDebInfo -C install.strip=true \
  -C cmake.define.LOWBIT_ENABLE_TESTS=ON -C cmake.define.LOWBIT_ENABLE_BENCH=ON \
  -C cmake.define.LOWBIT_ENABLE_REFERENCE=ON
wheel=$(echo "$wheel_dir"/lowbit-*.whl)
"$python" -m pip install -q --no-deps --force-reinstall --disable-pip-version-check "$wheel"
# python/tests/test_wheel.py checks the wheel and the installed package.
LOWBIT_WHEEL="$PWD/$wheel" lowbit_step "tests" ctest --preset ci -j "$(nproc)"
# pytest's own counts (ctest shows a suite's output only when it fails), and how many of the
# tests need torch: they run on the CPU here, their CUDA cases skip without a GPU.
echo "== Python suites (pytest's counts):" >&2
grep -hE "^[0-9]+ (passed|failed)" build/ci/Testing/Temporary/LastTest.log >&2 || true
"$python" -m pytest python/tests -q -p no:cacheprovider -m "torch and not exhaustive" \
  --collect-only 2>/dev/null | tail -n 1 |
  awk '{split($1, n, "/"); print "tests marked torch (run with the suite above): " n[1] " of " n[2]}' >&2 ||
  true
