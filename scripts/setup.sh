#!/usr/bin/env bash
# Installs what lowbit needs on a fresh Debian/Ubuntu machine: compilers and libraries with
# apt-get, Python packages with pip into the project's virtual environment (scripts/lib.sh says
# which one and how to choose another; the system interpreter is never touched). Idempotent, and
# silent when everything is already there.
#   scripts/setup.sh [report|test]   the main job's packages, or those of the tests as well
set -euo pipefail
source "$(dirname "$0")/lib.sh"
profile=${1:-test}
case "$profile" in report | test) ;; *) echo "setup: unknown profile '$profile' (report, test)" >&2; exit 2 ;; esac

apt_packages=(cmake ninja-build g++ python3-venv libboost-dev librapidcheck-dev libgtest-dev
              libbenchmark-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]} (apt-get)" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=$(lowbit_python)
if [ -z "${LOWBIT_PYTHON:-}" ] && [ ! -x "$python" ]; then
  venv=$(dirname "$(dirname "$python")")
  base=${LOWBIT_BASE_PYTHON:-python3}
  echo "setup: creating the virtual environment $venv with $(command -v "$base")" >&2
  "$base" -m venv "$venv"
fi

# pip runs only when the pinned list changed since the last run with this interpreter.
requirements="$lowbit_root/scripts/requirements-$profile.txt"
stamp_dir="$lowbit_root/build/setup"
headers="$lowbit_root/scripts/requirements-headers.txt"
key=$(cat "$requirements" "$lowbit_root/scripts/requirements-report.txt" "$headers" | sha256sum |
  cut -c1-16)
stamp="$stamp_dir/$(echo "$python" | sha256sum | cut -c1-16)-$profile"
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
  echo "setup: installing the Python packages of scripts/requirements-$profile.txt into $python" >&2
  "$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    -r "$requirements"
  "$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
    -r "$headers"
  mkdir -p "$stamp_dir"
  echo "$key" > "$stamp"
fi
