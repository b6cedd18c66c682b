"""lowbit.nn: PyTorch modules over lowbit's kernels (this package imports torch; ``import
lowbit`` does not).

The low-precision linear family is one autograd Function (:class:`LinearFunction`) driven by a
frozen :class:`LinearRecipe` (which operands of the forward, input-gradient and weight-gradient
matmuls are quantized, to which format, per row, column or tensor):
:class:`SwitchBackLinear` and its variants, the tensor-wise fp8 baseline and the plain layer
(:data:`IDENTITY`, for gradcheck) are recipes of it. :func:`convert` swaps the nn.Linear
modules of a model in place. docs/techniques/switchback.md has the equations.
"""

from lowbit.nn.embedding import StableEmbedding
from lowbit.nn.linear import (
    LinearFunction,
    LowPrecisionLinear,
    SwitchBackLinear,
    convert,
)
from lowbit.nn.recipe import (
    FORMATS,
    HIGH_PRECISION,
    IDENTITY,
    VARIANTS,
    LinearRecipe,
    Matmul,
    Operand,
    named_recipes,
    switchback_recipe,
)

__all__ = [
    "FORMATS",
    "HIGH_PRECISION",
    "IDENTITY",
    "VARIANTS",
    "LinearFunction",
    "LinearRecipe",
    "LowPrecisionLinear",
    "Matmul",
    "Operand",
    "StableEmbedding",
    "SwitchBackLinear",
    "convert",
    "named_recipes",
    "switchback_recipe",
]
