"""lowbit.verify: compare a candidate array against a reference under a policy.

>>> import numpy as np, lowbit
>>> report = lowbit.verify(np.float32([1, 2]), np.float32([1, 2.0000002]), "ulp:1")
>>> report.ok, report.max_ulp_error
(True, 1.0)

The comparison is the C++ ``lowbit::verify::compare`` (one implementation for C++, Python and
the ``lowbit verify`` command); this module turns inputs into host arrays (numpy arrays and CPU
DLPack producers are read in place, CUDA arrays copied to the host on the caller's stream),
evaluates Python bound functions into arrays of allowed errors, and wraps the C++ report.
docs/verification.md defines every policy and every field of the report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from lowbit import _core, _dtypes, _interop
from lowbit._api import _renamed
from lowbit._core import Format

FormatLike = Union[str, Format]
# A policy string ("exact", "exact:strict", "ulp:1", "ulp:2@e4m3fn", "atol:1e-3,rtol:1e-2") or a
# bound function: fn(reference) or fn(reference, inputs) -> allowed absolute errors.
PolicyLike = Union[str, Callable[..., Any]]

def _host_array(value: Any, name: str) -> Any:
    """An argument as a host array the comparison reads in place: numpy arrays and CPU DLPack
    producers as they are, CUDA arrays copied to the host on the caller's current stream
    (lowbit._interop.to_host), anything else converted with numpy."""
    if _interop.is_array(value):
        return _interop.to_host(name, value)
    return np.asarray(value)


def _typed_codes(a: Any, fmt: Optional[FormatLike], name: str,
                 arg: str) -> tuple[Any, Optional[FormatLike]]:
    """Arrays of ml_dtypes' 8-bit and narrower types (float8_e4m3fn, float4_e2m1fn, ...) and of
    torch's float8 types hold one code of a lowbit format per byte: they become those codes, and
    the format they imply."""
    if _interop.is_jax(a) and a.dtype.name.startswith(("float8_", "float6_", "float4_")):
        # JAX's narrow float dtypes are ml_dtypes' (which DLPack exports under codes numpy and
        # lowbit do not read); a host JAX array is a read-only numpy view without a copy. CUDA
        # JAX arrays arrive here as host copies of torch or cupy already.
        a = np.asarray(a)
    # 16-bit floats are values here (candidates in bfloat16 are compared as numbers).
    view, implied = _dtypes.codes_of(a, name, wide=False)
    if implied is None:
        return a, fmt
    if fmt is not None and _dtypes.resolve_format(fmt, arg) != implied:
        dtype = str(a.dtype).removeprefix("torch.")
        raise ValueError(f"{name}: dtype {dtype} holds {implied.name} codes, but {arg} is "
                         f"{_dtypes.resolve_format(fmt, arg).name}")
    return view, implied


def _values(a: Any, fmt: Optional[FormatLike], name: str) -> np.ndarray:
    """Exact float64 values of a host array, for a bound function."""
    a = _interop.to_numpy(name, a)
    if a.dtype.kind == "u":
        if fmt is None:
            raise ValueError(
                f"{name}: dtype {a.dtype} holds codes of a number format; name the format "
                "(fmt=...)"
            )
        from lowbit._api import decode

        return decode(a, fmt, dtype="float64")
    return a.astype(np.float64)


@dataclass(frozen=True)
class Element:
    """One element of :attr:`Report.worst`: where, the values and bit patterns, the errors."""

    index: tuple[int, ...]
    flat_index: int
    input: Optional[float]
    input_hex: Optional[str]
    candidate: float
    candidate_hex: str
    reference: float
    reference_hex: str
    abs_error: float
    rel_error: float
    ulp_error: float
    allowed: float
    failed: bool
    nan_mismatch: bool

    @property
    def expected(self) -> float:
        """The reference value (the value the candidate should have had)."""
        return self.reference


@dataclass(frozen=True)
class Bucket:
    """Histogram bucket: ulp distances d with lo < d <= hi (the first bucket is d == 0)."""

    label: str
    lo: float
    hi: float
    count: int


_ELEMENT_FIELDS = [f for f in Element.__dataclass_fields__]
# Fields of to_json() that hold numbers: JSON has no Inf/NaN, so they travel as strings.
_FLOAT_KEYS = {"max_abs_error", "max_rel_error", "max_ulp_error", "input", "candidate",
               "reference", "abs_error", "rel_error", "ulp_error", "allowed", "lo", "hi"}


def _floats(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: (float(v) if k in _FLOAT_KEYS and v is not None else _floats(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_floats(v) for v in obj]
    return obj


class Report:
    """The result of :func:`verify`; true when the candidate passed.

    Counts: ``total = checked + nan_matches + nan_mismatches``; ``failed`` counts every element
    the policy rejects (NaN mismatches included). ``max_abs_error``, ``max_rel_error`` and
    ``max_ulp_error`` are over the checked elements (no NaN on either side); ulp distances are
    counted on ``grid``. ``worst`` lists up to ``worst`` elements, failing ones first;
    ``histogram`` the non-empty buckets of ulp distances, whose counts sum to ``checked``.
    ``str(report)`` is the readable form, :meth:`to_json` the machine-readable one.
    """

    def __init__(self, core: Any) -> None:
        self._core = core
        self.worst = [Element(**{f: getattr(e, f) for f in _ELEMENT_FIELDS}) for e in core.worst]
        self.histogram = [Bucket(b.label, b.lo, b.hi, b.count) for b in core.histogram]

    ok = property(lambda self: bool(self._core.ok), doc="True when no element failed.")
    policy = property(lambda self: self._core.policy, doc="The policy, as canonical text.")
    grid = property(lambda self: self._core.grid, doc="Where ulp distances are counted.")
    candidate_dtype = property(lambda self: self._core.candidate_dtype)
    reference_dtype = property(lambda self: self._core.reference_dtype)
    input_dtype = property(lambda self: self._core.input_dtype)
    shape = property(lambda self: self._core.shape)
    total = property(lambda self: self._core.total)
    checked = property(lambda self: self._core.checked)
    nan_matches = property(lambda self: self._core.nan_matches)
    nan_mismatches = property(lambda self: self._core.nan_mismatches)
    failed = property(lambda self: self._core.failed)
    max_abs_error = property(lambda self: self._core.max_abs_error)
    max_rel_error = property(lambda self: self._core.max_rel_error)
    max_ulp_error = property(lambda self: self._core.max_ulp_error)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self._core.to_string().rstrip("\n")

    def __repr__(self) -> str:
        state = "passed" if self.ok else f"FAILED {self.failed}/{self.total}"
        return f"<lowbit.verify.Report {state} policy={self.policy!r} grid={self.grid!r}>"

    def to_json(self, indent: Optional[int] = None) -> str:
        """The report as JSON (non-finite numbers are the strings "inf", "-inf", "nan")."""
        text = self._core.to_json()
        if indent is None:
            return text
        return json.dumps(json.loads(text), indent=indent)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as Python objects, with non-finite numbers back as floats."""
        return _floats(json.loads(self._core.to_json()))


@_renamed(format="fmt", input_format="input_fmt")
def verify(
    candidate: Any,
    reference: Any,
    policy: PolicyLike = "exact",
    *,
    fmt: Optional[FormatLike] = None,
    inputs: Any = None,
    input_fmt: Optional[FormatLike] = None,
    worst: int = 10,
) -> Report:
    """Compares ``candidate`` against ``reference`` (same shape) under ``policy``.

    >>> codes = lowbit.cast(np.array([1.0, 0.3], np.float32), "e4m3fn")
    >>> lowbit.verify(codes, np.array([56, 42], np.uint8), "ulp:1", fmt="e4m3fn").ok
    True

    candidate, reference:
        numpy arrays (lists and numbers are converted with numpy) or DLPack producers: torch
        tensors, cupy arrays, JAX arrays, ... CPU arrays are read in place; CUDA arrays are
        copied to the host first, on the caller's current stream (the call waits for the copy).
        The report is the same whichever library holds the arrays.
    policy:
        ``"exact"`` (same bits; any NaN matches any NaN), ``"exact:strict"`` (NaNs too),
        ``"ulp:N"`` (at most N steps of the grid of ``fmt``, or of the candidate's dtype),
        ``"atol:X"``, ``"rtol:Y"``, ``"atol:X,rtol:Y"`` (``|c - r| <= atol + rtol*|r|``), each
        optionally followed by ``@<format>``; or a bound function called as
        ``fn(reference_values)`` or, with ``inputs``, ``fn(reference_values, input_values)``
        (float64 arrays of the exact values) that returns the allowed absolute error per
        element (an array that broadcasts to the shape, or a scalar).
    fmt:
        The format of code arrays (uint8/uint16/uint32) and of the ulp grid. Arrays of
        ml_dtypes' float8/float6/float4 types (numpy or JAX arrays) and torch's float8 types are
        codes of the format their dtype names.
    inputs:
        The inputs the candidate was computed from (an array like ``candidate``); shown beside
        the worst elements.
    input_fmt:
        The format of code inputs (otherwise they show as plain integers).
    worst:
        How many elements :attr:`Report.worst` keeps.

    Raises TypeError/ValueError for arrays or policies that cannot be compared; a difference is
    never an exception (see :func:`assert_verified`).
    """
    if isinstance(worst, bool) or not isinstance(worst, (int, np.integer)):
        raise TypeError(f"worst: expected an integer, got {type(worst).__name__}")
    worst = min(int(worst), 2 ** 62)  # beyond any array's size: keeps every element
    if not isinstance(policy, str) and not callable(policy):
        raise TypeError(
            "policy: expected a string such as 'exact', 'ulp:1' or 'atol:1e-3,rtol:1e-2', or a "
            f"bound function, got {type(policy).__name__}"
        )
    c = _host_array(candidate, "candidate")
    r = _host_array(reference, "reference")
    x = None if inputs is None else _host_array(inputs, "inputs")
    c, fmt = _typed_codes(c, fmt, "candidate", "fmt")
    r, fmt = _typed_codes(r, fmt, "reference", "fmt")
    if x is not None:
        x, input_fmt = _typed_codes(x, input_fmt, "inputs", "input_fmt")
    if isinstance(policy, str):
        return Report(_core.verify(c, r, policy, fmt, x, input_fmt, int(worst), None, ""))
    shape = _interop.shape_of("reference", r)
    if _interop.shape_of("candidate", c) != shape:
        # The C++ says the same for strings; a bound function would otherwise see the wrong shape.
        raise ValueError(f"candidate has shape {_interop.shape_of('candidate', c)} but reference "
                         f"has shape {shape}; they must match")
    ref_values = _values(r, fmt, "reference")
    if x is None:
        allowed = policy(ref_values)
    else:  # code inputs without a format are plain integers, as in the report
        x_numpy = _interop.to_numpy("inputs", x)
        allowed = policy(ref_values, _values(x_numpy, input_fmt, "inputs")
                         if x_numpy.dtype.kind == "u" and input_fmt is not None
                         else x_numpy.astype(np.float64))
    try:
        if np.iscomplexobj(allowed):  # numpy would drop the imaginary parts with a warning
            raise TypeError("complex values")
        allowed = np.asarray(allowed, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"bound: the function returned {type(allowed).__name__} values that are "
                        f"not real numbers ({e})") from None
    try:
        allowed = np.broadcast_to(allowed, shape)
    except ValueError:
        raise ValueError(
            f"bound: the function returned shape {np.shape(allowed)}, which does not broadcast "
            f"to the arrays' shape {shape}"
        ) from None
    name = getattr(policy, "__name__", type(policy).__name__)
    return Report(_core.verify(c, r, None, fmt, x, input_fmt, int(worst),
                               np.ascontiguousarray(allowed), name))


def assert_verified(candidate: Any, reference: Any, policy: PolicyLike = "exact",
                    **kwargs: Any) -> Report:
    """:func:`verify`, raising AssertionError with the readable report when it fails.

    For pytest: ``lowbit.assert_verified(out, expected, "ulp:1", fmt="e4m3fn")``. Returns
    the report when it passes.

    >>> report = lowbit.assert_verified(np.float32([1.0, 2.0]), np.float32([1.0, 2.0]))
    >>> report.ok
    True
    """
    __tracebackhide__ = True  # pytest shows the caller's line
    report = verify(candidate, reference, policy, **kwargs)
    if not report.ok:
        raise AssertionError("\n" + str(report))
    return report
