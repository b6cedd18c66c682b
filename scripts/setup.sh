#!/usr/bin/env bash
# Installs what lowbit needs on a fresh Debian/Ubuntu machine: compilers and libraries with
# apt-get, Python packages with pip. Idempotent, and silent when everything is already there.
set -euo pipefail

apt_packages=(cmake ninja-build g++ libboost-dev librapidcheck-dev libgtest-dev libbenchmark-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if ! "$python" -c "import numpy, ml_dtypes, pytest, hypothesis, scikit_build_core, pybind11, matplotlib" \
    2>/dev/null; then
  echo "setup: installing Python packages"
  "$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    numpy ml_dtypes pytest hypothesis scikit-build-core pybind11 matplotlib
fi
