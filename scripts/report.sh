#!/usr/bin/env bash
# The main job: installs lowbit (pip install ., CUDA kernels included when nvcc is found) and
# runs `lowbit report`, which writes a table to stdout and PNG plots to out/report.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
python=${PYTHON:-python3}
"$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore . 
exec "$python" -m lowbit report --out out/report "$@"
