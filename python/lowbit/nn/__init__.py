"""lowbit.nn: PyTorch modules over lowbit's kernels (this package imports torch; ``import
lowbit`` does not).

The low-precision linear family is one autograd Function (:class:`LinearFunction`) driven by a
frozen :class:`LinearRecipe` (which operands of the forward, input-gradient and weight-gradient
matmuls are quantized, to which format, per row, column or tensor):
:class:`SwitchBackLinear` and its variants, the tensor-wise fp8 baseline and the plain layer
(:data:`IDENTITY`, for gradcheck) are recipes of it, and so are the fp8 training recipes
(:func:`fp8_recipe`: tensor-wise current or delayed scaling, row-wise, 1 x 128 / 128 x 128
blocks, MXFP8; :func:`hopper_recipe` under Hopper's accumulation model), which
:class:`Float8Linear` defaults to. :func:`convert` swaps the nn.Linear modules of a model in
place. docs/techniques/switchback.md and fp8-training.md have the equations.
"""

from lowbit.nn.embedding import StableEmbedding
from lowbit.nn.linear import (
    Float8Linear,
    LinearFunction,
    LowPrecisionLinear,
    SwitchBackLinear,
    convert,
)
from lowbit.nn.recipe import (
    FORMATS,
    HIGH_PRECISION,
    HOPPER,
    HOPPER_FAST,
    IDENTITY,
    VARIANTS,
    LinearRecipe,
    Matmul,
    Operand,
    fp8_recipe,
    hopper_recipe,
    named_recipes,
    switchback_recipe,
)

__all__ = [
    "FORMATS",
    "HIGH_PRECISION",
    "HOPPER", "HOPPER_FAST",
    "IDENTITY",
    "VARIANTS",
    "Float8Linear",
    "LinearFunction",
    "LinearRecipe",
    "LowPrecisionLinear",
    "Matmul",
    "Operand",
    "StableEmbedding",
    "SwitchBackLinear",
    "convert",
    "fp8_recipe",
    "hopper_recipe",
    "named_recipes",
    "switchback_recipe",
]
