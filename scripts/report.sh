#!/usr/bin/env bash
# The main job: builds and installs lowbit into the project's virtual environment (scripts/lib.sh
# says which Python; CUDA kernels for the GPU it sees, none without one) and runs `lowbit report`,
# which writes a table to stdout and PNG plots to out/report. The build tree, build/report, is
# kept, so a second run rebuilds nothing and starts the report within seconds.
#   scripts/report.sh [lowbit report options]     (scripts/report.sh --help lists them)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$lowbit_root"
scripts/setup.sh report
python=$(lowbit_python)
python=$("$python" -c "import sys; print(sys.executable)")
# The build first, with ninja's progress on the terminal; pip then packs the same tree (the
# module is up to date, so it compiles nothing) and installs it.
build=build/report
# shellcheck disable=SC2046
lowbit_step "configure $build" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLOWBIT_ENABLE_PYTHON=ON -DLOWBIT_ENABLE_TESTS=OFF -DLOWBIT_ENABLE_BENCH=OFF \
  -DLOWBIT_ENABLE_REFERENCE=OFF -DBUILD_SHARED_LIBS=OFF -DPython_EXECUTABLE="$python" \
  $(lowbit_cuda_args) >/dev/null
lowbit_step "build $build" cmake --build "$build" --target lowbit_python_core
lowbit_step "install" env CMAKE_GENERATOR=Ninja "$python" -m pip install -q --no-build-isolation \
  --no-deps --disable-pip-version-check -C build-dir="$PWD/$build" -C cmake.build-type=Release .
exec "$python" -m lowbit report --out out/report "$@"
