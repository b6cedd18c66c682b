# Sourced by setup.sh, test.sh and report.sh: which Python they use, and how the build is chosen.
#
# Python: a project-local virtual environment, .venv in the repository root, made with the
# python3 on PATH the first time and reused after; nothing is ever installed into the system
# interpreter (PEP 668). To use another interpreter:
#   LOWBIT_BASE_PYTHON=/usr/bin/python3.12   the interpreter that creates .venv (default python3)
#   LOWBIT_VENV=/path/to/venv                 the virtual environment to make or reuse
#   LOWBIT_PYTHON=/path/to/python             an interpreter you manage yourself (conda, your own
#                                             venv): used as it is, packages installed into it
# CUDA: the kernels are built for the GPU that nvidia-smi sees, and not at all where it sees none
# (cmake/cuda.cmake decides). LOWBIT_CUDA_ARCHITECTURES="75;80;90" builds those instead (with or
# without a GPU), LOWBIT_CUDA_ARCHITECTURES=off builds the CPU library only.

lowbit_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The interpreter the scripts run (its absolute path, printed on stdout).
lowbit_python() {
  if [ -n "${LOWBIT_PYTHON:-}" ]; then
    command -v "$LOWBIT_PYTHON" || { echo "lowbit: LOWBIT_PYTHON=$LOWBIT_PYTHON not found" >&2; return 1; }
  else
    echo "${LOWBIT_VENV:-$lowbit_root/.venv}/bin/python"
  fi
}

# CMake arguments that follow LOWBIT_CUDA_ARCHITECTURES (none: cmake/cuda.cmake's choice).
lowbit_cuda_args() {
  case "${LOWBIT_CUDA_ARCHITECTURES:-}" in
    "") ;;
    off | OFF) echo "-DLOWBIT_ENABLE_CUDA=OFF" ;;
    *) echo "-DLOWBIT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$LOWBIT_CUDA_ARCHITECTURES" ;;
  esac
}

# Runs a command with a line saying what it does and, after, how long it took.
lowbit_step() {
  local what=$1 t0=$SECONDS
  shift
  echo "== $what" >&2
  "$@"
  echo "== $what: done in $((SECONDS - t0)) s" >&2
}
