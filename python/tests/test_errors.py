"""Bad input gives the right exception type, with a message that names the argument."""

from __future__ import annotations

import numpy as np
import pytest

import lowbit

X = np.array([1.0, 2.0], np.float32)


@pytest.mark.parametrize(
    "call, exc, pattern",
    [
        (lambda: lowbit.cast(np.arange(3), "e4m3fn"), TypeError, r"^x: dtype int64 .*float32"),
        (lambda: lowbit.cast(np.ones(2, np.complex64), "e4m3fn"), TypeError,
         r"^x: dtype complex64"),
        (lambda: lowbit.cast(np.ones(2, np.longdouble), "e4m3fn"), TypeError, r"^x: dtype"),
        (lambda: lowbit.cast(["a"], "e4m3fn"), TypeError, r"^x: dtype"),
        (lambda: lowbit.cast(X, "e4m3"), None, None),  # a valid name, for contrast
        (lambda: lowbit.cast(X, "fp8"), ValueError, r"^fmt: format 'fp8': unknown name .*e4m3fn"),
        (lambda: lowbit.cast(X, "e9m3"), ValueError, r"^fmt: .*exponent bits must be in 1\.\.8"),
        (lambda: lowbit.cast(X, "e4m3_xyz"), ValueError, r"^fmt: .*unknown suffix"),
        (lambda: lowbit.cast(X, 8), TypeError, r"^fmt: expected a format \(a name"),
        (lambda: lowbit.cast(X, "e4m3fn", rounding="nearest"), ValueError,
         r"^rounding 'nearest': expected one of nearest_even, .*stochastic"),
        (lambda: lowbit.cast(X, "e4m3fn", subnormals="ftz"), ValueError,
         r"^subnormals 'ftz': expected one of keep, flush"),
        (lambda: lowbit.cast(X, "e4m3fn", nan_sign="negative"), ValueError,
         r"^nan_sign 'negative': expected one of preserve, positive"),
        (lambda: lowbit.cast(X, "e4m3fn", rounding="stochastic", random_bits=0), ValueError,
         r"^random_bits: .*1\.\.32"),
        (lambda: lowbit.cast(X, "e4m3fn", rounding="stochastic", random_bits=33), ValueError,
         r"^random_bits: .*1\.\.32"),
        (lambda: lowbit.cast(X, "e4m3fn", rounding="stochastic", random_bits=2**40), ValueError,
         r"^random_bits: "),
        (lambda: lowbit.cast(X, "e4m3fn", random_bits=8), ValueError,
         r"^random_bits: only rounding='stochastic'"),
        (lambda: lowbit.cast(X, "e4m3fn", rounding="stochastic", random_bits=1.5), TypeError,
         r"^random_bits: expected an integer"),
        (lambda: lowbit.cast(X, "e4m3fn", seed=-1), ValueError, r"^seed: "),
        (lambda: lowbit.cast(X, "e4m3fn", offset=2**64), ValueError, r"^offset: "),
        (lambda: lowbit.cast(X, "e4m3fn", threads=-1), ValueError, r"^threads: "),
        (lambda: lowbit.decode(np.zeros(3, np.uint16), "e4m3fn"), TypeError,
         r"^codes: dtype uint16 does not hold codes of e4m3fn; expected uint8"),
        (lambda: lowbit.decode(np.zeros(3, np.int8), "e4m3fn"), TypeError, r"^codes: dtype int8"),
        (lambda: lowbit.decode(np.zeros(3, np.uint8), "float16"), TypeError,
         r"^codes: .*expected uint16"),
        (lambda: lowbit.decode(np.zeros(3, np.uint8), "e4m3fn", "int8"), ValueError,
         r"^dtype 'int8': expected one of float32, float64"),
        (lambda: lowbit.decode(np.zeros(3, np.uint8), "e4m3fn", "nonsense"), ValueError,
         r"^dtype 'nonsense'"),
        (lambda: lowbit.decode([300], "e4m3fn"), OverflowError, None),
        (lambda: lowbit.Format(4, 3, specials="nan"), ValueError, r"^specials 'nan': expected"),
        (lambda: lowbit.Format(4, 24), ValueError, r"mantissa bits must be in 0\.\.23"),
        (lambda: lowbit.Format(4, 0, specials="ieee"), ValueError, r"needs at least one mantissa"),
        (lambda: lowbit.Format(4, 3, specials="fnuz", signed=False), ValueError, r"must be signed"),
        (lambda: lowbit.format_info("nope"), ValueError, r"^fmt: format 'nope'"),
    ],
)
def test_bad_input(call, exc, pattern):
    if exc is None:
        call()
        return
    with pytest.raises(exc, match=pattern):
        call()


def test_misaligned_and_odd_strides_are_refused():
    raw = np.zeros(4 * 9, np.uint8)
    misaligned = raw[1:33].view(np.float32)  # a valid numpy array at an odd address
    with pytest.raises(ValueError, match=r"^x: the data is not aligned"):
        lowbit.cast(misaligned, "e4m3fn")
    odd = np.lib.stride_tricks.as_strided(raw[:32].view(np.float32), shape=(5,), strides=(6,))
    with pytest.raises(ValueError, match=r"^x: the stride of dimension 0 \(6 bytes\) is not a"):
        lowbit.cast(odd, "e4m3fn")
    packed = np.zeros(4, dtype=[("tag", "u1"), ("value", "<f4")])["value"]
    with pytest.raises(ValueError, match=r"^x: "):
        lowbit.cast(packed, "e4m3fn")
    assert lowbit.cast(packed.copy(), "e4m3fn").tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    "kind, exc",
    [("invalid_type", TypeError), ("invalid_argument", ValueError), ("unsupported", RuntimeError),
     ("device", RuntimeError)],
)
def test_error_kinds_map_to_python_exceptions(kind, exc):
    from lowbit import _core

    with pytest.raises(exc, match="^the message$") as info:
        _core._throw(kind, "the message")
    assert type(info.value) is exc
