#!/usr/bin/env bash
# Runs on a host WITH network access (not on the GPU machine): makes .deps_cupy/cupy_site.zip, a
# trimmed CuPy for CUDA 13 and CPython 3.12 (x86_64 Linux) that scripts/device/cupy_setup.sh
# unpacks on the GPU machine, which has no network. The zip must stay well under the 64 MiB that
# can be carried there, so what `import cupy` and basic use (asarray, asnumpy, elementwise ops,
# streams, DLPack, cupy.random) do not need is left out:
#
# - cupy/cuda/thrust*.so: optional in CuPy (cupy/cuda/__init__.py falls back to an "unavailable"
#   module); cupy.sort, argsort, lexsort, partition and friends then raise;
# - cupy/cuda/cufft*.so: loaded only when an FFT runs;
# - cupy_backends/cuda/libs/{cusolver,cusparse,cutensor,nccl}*.so and cupyx/_cutensor*.so,
#   cupyx/_cusolver*.so: loaded only by linalg solvers, sparse matrices, cuTENSOR and NCCL;
# - the DWARF debug sections of every shared object (strip --strip-debug: the loaded segments,
#   GPU fat binaries included, stay byte for byte the same).
#
# Everything else stays, CuPy's bundled CCCL headers included (NVRTC compiles every elementwise
# kernel against them). cuda-pathfinder (a requirement of CuPy 14, which finds libnvrtc and the
# CUDA libraries) and fastrlock (a requirement of CuPy <= 13, tiny) are bundled as well; numpy
# is expected on the GPU machine.
#
# Usage: bash scripts/device/cupy_bundle.sh [cupy-cuda13x version, default: newest]
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:+==$1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dl() {
  python3 -m pip download "$1" --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$work/dl" -q
}
dl "cupy-cuda13x$version"
dl cuda-pathfinder
dl fastrlock
mkdir -p "$work/site"
for w in "$work"/dl/*.whl; do
  python3 -m zipfile -e "$w" "$work/site"
done
cd "$work/site"
rm -f cupy/cuda/thrust.cpython-*.so cupy/cuda/cufft.cpython-*.so \
  cupy_backends/cuda/libs/{cusolver,cusparse,cutensor,nccl}.cpython-*.so \
  cupyx/_cutensor.cpython-*.so cupyx/_cusolver.cpython-*.so
find . -name '*.so' -exec strip --strip-debug {} +
# RECORD lists only the files that are still there (the hashes of stripped files are dropped).
python3 - <<'EOF'
import csv, glob, hashlib, os
for record in glob.glob("*.dist-info/RECORD"):
    with open(record, newline="") as f:
        rows = [r for r in csv.reader(f) if r and (r[0].endswith("RECORD") or os.path.isfile(r[0]))]
    for r in rows:
        if r[0].endswith(".so"):
            r[1:] = ["", ""]
    with open(record, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
EOF
cd - > /dev/null
mkdir -p .deps_cupy
rm -f .deps_cupy/cupy_site.zip
python3 - "$work/site" .deps_cupy/cupy_site.zip <<'EOF'
import os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".pyc"):
                continue
            path = os.path.join(root, name)
            z.write(path, os.path.relpath(path, src))
EOF
ls -l .deps_cupy/cupy_site.zip
