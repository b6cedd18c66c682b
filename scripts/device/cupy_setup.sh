#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: unpacks the carried CuPy bundle
# (.deps_cupy/cupy_site.zip, made by scripts/device/cupy_bundle.sh on a host with network; CuPy
# for CUDA 13 and CPython 3.12) into a temporary directory and puts it on PYTHONPATH, without
# installing anything.
#
#   source scripts/device/cupy_setup.sh; bash scripts/device/python_gpu.sh test
#
# Sourced, it exports PYTHONPATH (and CUDA_PATH, which CuPy needs for the toolkit's headers and
# libnvrtc, when it is unset and a toolkit is found) in the calling shell. Run with bash, it
# prints the export lines instead: eval "$(bash scripts/device/cupy_setup.sh)". Either way it then
# checks that `import cupy` works and reports the devices CuPy sees and whether NVRTC compiles a
# kernel, on stderr. It returns 1, with the reason, when the zip is missing, cannot be unpacked or
# CuPy cannot be imported (device and NVRTC problems are reported, not fatal: the `cupy` tests
# skip or fail with them). LOWBIT_CUPY_ZIP and LOWBIT_CUPY_DIR override the paths.

_lowbit_cupy_setup() {  # $1: "sourced" or "run"
  local zip=${LOWBIT_CUPY_ZIP:-.deps_cupy/cupy_site.zip}
  local dir=${LOWBIT_CUPY_DIR:-${TMPDIR:-/tmp}/lowbit-cupy-site}
  local py=${PYTHON:-python3}
  if [[ ! -f $zip ]]; then
    echo "cupy_setup: $zip is missing (run from the repository root, carry .deps_cupy; make the" \
      "zip with scripts/device/cupy_bundle.sh on a host with network); CuPy is not set up" >&2
    return 1
  fi
  # Unpack once per zip (size and modification time), into a fresh directory.
  local stamp
  stamp=$(stat -c '%s %Y' "$zip") || return 1
  if [[ ! -f $dir/.lowbit_stamp || $(< "$dir/.lowbit_stamp") != "$stamp" ]]; then
    rm -rf "$dir" "$dir.part"
    mkdir -p "$dir.part" || return 1
    if ! "$py" -m zipfile -e "$zip" "$dir.part"; then
      echo "cupy_setup: could not unpack $zip into $dir.part" >&2
      rm -rf "$dir.part"
      return 1
    fi
    echo "$stamp" > "$dir.part/.lowbit_stamp"
    mv "$dir.part" "$dir" || return 1
  fi
  case ":${PYTHONPATH:-}:" in
    *":$dir:"*) ;;
    *) export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" ;;
  esac
  if [[ -z ${CUDA_PATH:-} ]]; then
    local nvcc
    nvcc=$(command -v nvcc || true)
    if [[ -n $nvcc ]]; then
      CUDA_PATH=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
      export CUDA_PATH
    elif [[ -d /usr/local/cuda ]]; then
      export CUDA_PATH=/usr/local/cuda
    fi
  fi
  local rc=0
  "$py" - "$dir" <<'EOF' >&2 || rc=$?
import os, sys
try:
    import cupy
    from cuda import pathfinder
except Exception as e:
    print(f"cupy_setup: `import cupy` fails ({type(e).__name__}: {e}); the cupy tests will skip")
    sys.exit(1)
where = os.path.dirname(os.path.dirname(os.path.realpath(cupy.__file__)))
note = "" if where == os.path.realpath(sys.argv[1]) else f" (NOT the bundle in {sys.argv[1]})"
print(f"cupy_setup: CuPy {cupy.__version__} from {where}{note}, numpy "
      f"{__import__('numpy').__version__}, cuda.pathfinder from "
      f"{os.path.dirname(pathfinder.__file__)}, CUDA_PATH={os.environ.get('CUDA_PATH')}")
try:
    n = cupy.cuda.runtime.getDeviceCount()
    print(f"cupy_setup: CuPy sees {n} CUDA device(s); runtime "
          f"{cupy.cuda.runtime.runtimeGetVersion()}, driver {cupy.cuda.runtime.driverGetVersion()}")
except Exception as e:
    print(f"cupy_setup: CuPy sees no CUDA device ({type(e).__name__}: {e})")
    sys.exit(0)
try:
    got = (cupy.arange(3, dtype=cupy.float32) * 2 + 1).get().tolist()
    assert got == [1.0, 3.0, 5.0], got
    print(f"cupy_setup: NVRTC compiles elementwise kernels (nvrtc {cupy.cuda.nvrtc.getVersion()})")
except Exception as e:
    print(f"cupy_setup: an elementwise kernel fails ({type(e).__name__}: {e}); the cupy tests "
          "that need NVRTC (strided views, dtype conversions, the stream tests) will fail")
EOF
  if ((rc != 0)); then
    return 1
  fi
  if [[ $1 == run ]]; then  # the lines to eval
    echo "export PYTHONPATH=\"$PYTHONPATH\""
    [[ -n ${CUDA_PATH:-} ]] && echo "export CUDA_PATH=\"$CUDA_PATH\""
  fi
  return 0
}

if [[ ${BASH_SOURCE[0]} != "$0" ]]; then
  _lowbit_cupy_setup sourced || { unset -f _lowbit_cupy_setup; return 1; }
  unset -f _lowbit_cupy_setup
  return 0
fi
_lowbit_cupy_setup run
