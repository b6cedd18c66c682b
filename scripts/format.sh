#!/usr/bin/env bash
# clang-format over the project's C++ and CUDA sources (.clang-format in the root).
#   scripts/format.sh           rewrites the files in place
#   scripts/format.sh --check   changes nothing; lists the files that differ and fails if any do
# The layout depends on clang-format's version: the check uses clang-format 14 (Debian 12's,
# the CI machine's), installed with apt-get where it is missing; CLANG_FORMAT names another.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$lowbit_root"
cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null && "$c" --version | grep -q "version 14\."; then cf=$c; break; fi
  done
fi
if [ -z "$cf" ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "format: installing clang-format-14 (apt-get)" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang-format-14 >/dev/null
  cf=clang-format-14
fi
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cu' '*.cuh' '*.h')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "format: ${#bad[@]} file(s) differ from $($cf --version) (run scripts/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted as $cf wants"
else
  "$cf" -i "${files[@]}"
fi
