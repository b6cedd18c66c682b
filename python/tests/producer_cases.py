"""Inputs shared by the tests of array producers (test_jax.py, test_cupy.py): the same calls on
the producer's arrays must give exactly what they give on numpy arrays."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowbit


def failing_verify_cases(x: np.ndarray, finite: np.ndarray) -> list:
    """(candidate, reference, policy, keyword arguments) for lowbit.verify, each failing its
    policy somewhere (so the reports have worst elements to compare), numpy arrays throughout.
    x: float32 with NaN and Inf; finite: x without them. The last case has bfloat16 arrays."""
    rounded = (finite / np.float32(3)).astype(np.float32)
    rounded[1, 2] = np.nextafter(rounded[1, 2], np.float32(np.inf))  # one ulp off: a failure
    exact = (finite.astype(np.float64) / 3).astype(np.float32)
    codes = lowbit.cast(x, "e4m3fn")
    codes_tz = lowbit.cast(x, "e4m3fn", rounding="toward_zero")
    bf16 = finite.astype(ml_dtypes.bfloat16)
    return [
        (rounded, exact, "ulp:0", {"inputs": finite}),
        (codes_tz, codes, "exact", {"fmt": "e4m3fn", "inputs": x}),
        (finite / 2, finite / 2 + 1e-3, "atol:1e-4", {"inputs": codes, "input_fmt": "e4m3fn"}),
        (x.astype(np.float16), (x * 1.001).astype(np.float16), "ulp:1", {}),
        (bf16, finite, "rtol:2e-3", {"inputs": bf16}),
    ]


def expect_verify_shape_errors(x) -> None:
    """lowbit.verify of a 2-D array x against x[:3], with a policy and with a bound function: a
    ValueError naming both shapes."""
    rows, cols = x.shape
    message = rf"^candidate has shape \({rows}, {cols}\) but reference has shape \(3, {cols}\)"
    for policy in ("exact", lambda r: 0 * r):
        with pytest.raises(ValueError, match=message):
            lowbit.verify(x, x[:3], policy)
