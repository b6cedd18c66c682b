#!/usr/bin/env bash
# Runs every test on this machine: the C++ property tests (emu vs reference, CPU twins vs
# reference, exhaustive sweeps), the GPU tests (they skip, saying so, without a device) and the
# Python tests. Sets itself up first (scripts/setup.sh). Also builds the wheel (`pip wheel .`)
# from the same build tree and installs it, so that the Python tests check what pip installs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
python=$(command -v "${PYTHON:-python3}")
# The interpreter's own path (not a shim), as scikit-build-core passes it: both configures of the
# build tree below then agree.
python=$("$python" -c "import sys; print(sys.executable)")
cmake --preset ci -DPython_EXECUTABLE="$python" >/dev/null
cmake --build --preset ci

# The wheel, packed from build/ci itself: scikit-build-core reconfigures it with the ci preset's
# settings (the -C options restore those that pyproject.toml turns off for users' wheels) and
# builds the module target, which is up to date, so nothing is compiled twice (a few seconds).
wheel_dir=build/ci/wheel
rm -rf "$wheel_dir"
CMAKE_GENERATOR=Ninja "$python" -m pip wheel . -q --no-build-isolation --no-deps \
  --disable-pip-version-check -w "$wheel_dir" -C build-dir="$PWD/build/ci" \
  -C cmake.build-type=RelWithDebInfo -C install.strip=true \
  -C cmake.define.LOWBIT_ENABLE_TESTS=ON -C cmake.define.LOWBIT_ENABLE_BENCH=ON \
  -C cmake.define.LOWBIT_ENABLE_REFERENCE=ON
wheel=$(echo "$wheel_dir"/lowbit-*.whl)
"$python" -m pip install -q --no-deps --force-reinstall --disable-pip-version-check \
  --root-user-action=ignore "$wheel"
# python/tests/test_wheel.py checks the wheel and the installed package.
LOWBIT_WHEEL="$PWD/$wheel" ctest --preset ci -j "$(nproc)"
