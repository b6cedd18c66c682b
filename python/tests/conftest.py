"""Shared settings of the Python tests.

The tests import the package that is on sys.path: the installed one, or <build>/python of a CMake
build (ctest sets PYTHONPATH). Helper modules (oracle.py, mlref.py) sit next to the tests.
"""

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings

# No example database: runs from the source tree must not write into it, and every CI run then
# draws fresh examples (a failure prints the example and a reproduction blob).
settings.register_profile(
    "lowbit",
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# A fixed sequence of examples, for bisecting a failure: LOWBIT_HYPOTHESIS_PROFILE=lowbit-fixed.
settings.register_profile("lowbit-fixed", parent=settings.get_profile("lowbit"), derandomize=True)
settings.load_profile(os.environ.get("LOWBIT_HYPOTHESIS_PROFILE", "lowbit"))


# ---- markers: torch, jax, gpu and cupy -----------------------------------------------------------
#
# `torch` tests need PyTorch (CPU tensors are enough); `jax` tests need JAX (CPU arrays; it is not
# a CI dependency); `gpu` tests need PyTorch with CUDA, a device and a lowbit build with CUDA
# kernels; `cupy` tests need CuPy, a device it can use and a lowbit build with CUDA kernels (not
# PyTorch). All are skipped, with the reason, where that is missing, so the CPU-only CI runs them
# as skips and a host with them runs them for real (`pytest -m "torch or jax or gpu or cupy"`).


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: needs PyTorch; skipped where it is not installed")
    config.addinivalue_line("markers", "jax: needs JAX (CPU is enough); skipped where it cannot "
                                       "be imported")
    config.addinivalue_line(
        "markers",
        "gpu: needs PyTorch with CUDA, a CUDA device and a lowbit build with CUDA kernels; "
        "skipped otherwise")
    config.addinivalue_line(
        "markers",
        "cupy: needs CuPy, a CUDA device that CuPy can use and a lowbit build with CUDA kernels; "
        "skipped otherwise")


def _torch_missing():
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    return None


def _jax_missing():
    # Imported, not just found: a jax without a matching jaxlib is installed but unusable (an
    # ImportError, or jax's RuntimeError for a jaxlib of another version).
    try:
        import jax  # noqa: F401
    except Exception as e:
        return f"JAX cannot be imported ({type(e).__name__}: {e})"
    return None


def _gpu_missing():
    reason = _torch_missing()
    if reason:
        return reason
    import torch

    import lowbit._core

    if not lowbit._core.cuda_built():
        return "this lowbit build has no CUDA kernels (LOWBIT_ENABLE_CUDA=OFF)"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    if not lowbit._core.cuda_available():
        return "lowbit sees no CUDA device"
    return None


def _cupy_missing():
    # Imported, not just found: a cupy-cudaNNx wheel of another CUDA major, or without the
    # libraries it loads, is installed but unusable.
    try:
        import cupy
    except Exception as e:
        return f"CuPy cannot be imported ({type(e).__name__}: {e})"
    import lowbit._core

    if not lowbit._core.cuda_built():
        return "this lowbit build has no CUDA kernels (LOWBIT_ENABLE_CUDA=OFF)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, or a driver older than the CuPy wheel's CUDA
        return f"CuPy sees no CUDA device ({type(e).__name__}: {e})"
    if count < 1:
        return "CuPy sees no CUDA device"
    if not lowbit._core.cuda_available():
        return "lowbit sees no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    checks = {"torch": _torch_missing, "jax": _jax_missing, "gpu": _gpu_missing,
              "cupy": _cupy_missing}
    reasons = {}
    for item in items:
        for marker, check in checks.items():
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in reasons:
                reasons[marker] = check()
            if reasons[marker]:
                item.add_marker(pytest.mark.skip(reason=f"{marker}: {reasons[marker]}"))
