"""lowbit: bit-exact low-precision numerics (fp8, MX formats, fp16, bf16) from Python.

>>> import numpy as np, lowbit
>>> lowbit.cast(np.array([1.0, 500.0], np.float32), "e4m3fn", saturate=True)
array([ 56, 126], dtype=uint8)

Every function names its format argument ``fmt`` and takes the cast's rounding names
(``lowbit.roundings()``); results of a known shape can be written into ``out=``. CHANGELOG.md
lists what lowbit 0.2 renamed.

Formats are named ("e4m3fn", "e5m2", "e8m0fnu", ...; see ``lowbit.formats()`` and
docs/formats.md) or user-defined with :class:`Format`. Casts return codes (uint8, uint16 or
uint32); :func:`decode` turns codes back into exact float32/float64 values. The rounding rules
are in docs/rounding.md. :func:`quantize`, :func:`quantize_delayed` and :func:`quantize_mx`
scale before they round (docs/techniques/quantization.md). :func:`quantize_blockwise` stores
tensors as 8-bit indices into a 256-entry :class:`Codebook` per block (the 8-bit optimizers'
state format; docs/techniques/blockwise.md) and :func:`estimate_quantiles` gives SRAM-quantiles
for quantile codebooks. :func:`scaled_matmul` multiplies int8 codes, fp8 codes or 16-bit values
with the dequantization and bias fused into its epilogue (docs/techniques/gemm.md); the PyTorch
layers over it are in lowbit.nn (which imports torch).

Arrays are numpy arrays or DLPack producers (PyTorch CPU/CUDA tensors, CuPy, JAX), read without
copies; results come back in the caller's array type, CUDA work runs on the caller's current
stream (docs/python.md).
"""

from lowbit._api import FormatInfo, cast, decode, format_info, formats, parse_format, roundings
from lowbit._blockwise import (
    Codebook,
    NestedAbsmax,
    dequantize_blockwise,
    estimate_quantiles,
    quantile_codebook,
    quantize_blockwise,
)
from lowbit._core import Format
from lowbit._fake import fake_quantize
from lowbit._gemm import Accumulation, scaled_matmul
from lowbit._quantize import (
    Granularity,
    TargetInfo,
    cast_scaled,
    dequantize,
    dequantize_mx,
    quantize,
    quantize_delayed,
    quantize_mx,
    target_info,
)
from lowbit._verify import Report, assert_verified, verify

__version__ = "0.1.0"

__all__ = [
    "Accumulation",
    "Codebook",
    "Format",
    "FormatInfo",
    "Granularity",
    "NestedAbsmax",
    "Report",
    "TargetInfo",
    "assert_verified",
    "cast",
    "cast_scaled",
    "decode",
    "dequantize",
    "dequantize_blockwise",
    "dequantize_mx",
    "estimate_quantiles",
    "fake_quantize",
    "format_info",
    "formats",
    "parse_format",
    "quantile_codebook",
    "quantize",
    "quantize_blockwise",
    "quantize_delayed",
    "quantize_mx",
    "roundings",
    "scaled_matmul",
    "target_info",
    "verify",
    "__version__",
]

