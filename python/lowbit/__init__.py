"""lowbit: bit-exact low-precision numerics (fp8, MX formats, fp16, bf16) from Python.

>>> import numpy as np, lowbit
>>> lowbit.cast(np.array([1.0, 500.0], np.float32), "e4m3fn", saturate=True)
array([ 56, 126], dtype=uint8)

Formats are named ("e4m3fn", "e5m2", "e8m0fnu", ...; see ``lowbit.formats()`` and
docs/formats.md) or user-defined with :class:`Format`. Casts return codes (uint8, uint16 or
uint32); :func:`decode` turns codes back into exact float32/float64 values. The rounding rules
are in docs/rounding.md.
"""

from lowbit._api import FormatInfo, cast, decode, format_info, formats, parse_format, roundings
from lowbit._core import Format

__version__ = "0.1.0"

__all__ = [
    "Format",
    "FormatInfo",
    "cast",
    "decode",
    "format_info",
    "formats",
    "parse_format",
    "roundings",
    "__version__",
]

