"""Type stubs of the compiled module lowbit._core (python/src/*.cpp)."""

from typing import Any, Callable, Optional, Union

class Format:
    """A number format; see docs/rounding.md for the meaning of each field."""

    def __init__(
        self,
        exp_bits: int,
        man_bits: int,
        bias: Optional[int] = None,
        specials: str = "ieee",
        signed: bool = True,
        has_zero: bool = True,
    ) -> None: ...
    @property
    def exp_bits(self) -> int: ...
    @property
    def man_bits(self) -> int: ...
    @property
    def bias(self) -> int: ...
    @property
    def specials(self) -> str: ...
    @property
    def signed(self) -> bool: ...
    @property
    def has_zero(self) -> bool: ...
    @property
    def bits(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def spec(self) -> Optional[str]: ...
    @property
    def has_inf(self) -> bool: ...
    @property
    def has_nan(self) -> bool: ...
    @property
    def has_negative_zero(self) -> bool: ...
    @property
    def has_subnormals(self) -> bool: ...
    @property
    def emin(self) -> int: ...
    @property
    def emax(self) -> int: ...
    @property
    def fits_float(self) -> bool: ...
    @property
    def max(self) -> float: ...
    @property
    def min_normal(self) -> float: ...
    @property
    def min_subnormal(self) -> float: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def code_dtype(self) -> str: ...
    @property
    def nan_ranges(self) -> list[tuple[int, int]]: ...
    @property
    def inf_ranges(self) -> list[tuple[int, int]]: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

_FormatLike = Union[str, Format]

def parse_format(fmt: _FormatLike) -> Format: ...
def named_formats() -> list[Format]: ...
def roundings() -> list[str]: ...
# Array arguments: numpy arrays or DLPack producers (torch, cupy, jax, ...). Results are
# allocated by calling `empty(shape, dtype_name)` (the Python layer's allocator in the caller's
# array library) unless `out` is given; `stream` is a CUDA stream handle (0: default), ignored
# for CPU arrays.
_Array = Any
_Empty = Callable[[tuple[int, ...], str], Any]

class _Rounding:
    def __init__(
        self,
        rounding: str = "nearest_even",
        saturate: bool = False,
        subnormals: str = "keep",
        nan_sign: str = "preserve",
        random_bits: Optional[int] = None,
        seed: int = 0,
        offset: int = 0,
    ) -> None: ...

# ---- formats and casts (python/src/formats.cpp) ----

def cast(
    x: _Array,
    fmt: _FormatLike,
    rounding: _Rounding,
    out: Optional[_Array],
    empty: _Empty,
    threads: int,
    stream: int,
) -> _Array: ...
def decode(
    codes: _Array,
    fmt: _FormatLike,
    dtype: Optional[str],
    out: Optional[_Array],
    empty: _Empty,
    threads: int,
    stream: int,
) -> _Array: ...

# ---- scaled quantization (python/src/quantize.cpp) ----

def target_info(fmt: _FormatLike) -> tuple[str, str, float, bool]: ...
def quantize(
    x: _Array,
    fmt: _FormatLike,
    kind: str,
    tile_rows: int,
    tile_cols: int,
    margin: int,
    pow2: bool,
    transpose: bool,
    rounding: _Rounding,
    empty: _Empty,
    threads: int,
    stream: int,
) -> tuple[_Array, _Array]: ...
def cast_scaled(
    x: _Array,
    scale: _Array,
    fmt: _FormatLike,
    rounding: _Rounding,
    out: Optional[_Array],
    empty: _Empty,
    threads: int,
    stream: int,
) -> _Array: ...
def dequantize(
    codes: _Array,
    scales: _Array,
    fmt: _FormatLike,
    kind: str,
    tile_rows: int,
    tile_cols: int,
    out: Optional[_Array],
    empty: _Empty,
    threads: int,
    stream: int,
) -> _Array: ...
def quantize_delayed(
    x: _Array,
    history: _Array,
    fmt: _FormatLike,
    reduce: str,
    margin: int,
    pow2: bool,
    rounding: _Rounding,
    empty: _Empty,
    threads: int,
    stream: int,
) -> tuple[_Array, _Array]: ...
def quantize_mx(
    x: _Array,
    fmt: _FormatLike,
    block: int,
    rounding: _Rounding,
    empty: _Empty,
    threads: int,
    stream: int,
) -> tuple[_Array, _Array]: ...
def dequantize_mx(
    codes: _Array,
    scales: _Array,
    fmt: _FormatLike,
    block: int,
    out: Optional[_Array],
    empty: _Empty,
    threads: int,
    stream: int,
) -> _Array: ...

# ---- the scaled matmul (python/src/gemm.cpp) ----

def scaled_matmul(
    a: _Array,
    b: _Array,
    a_fmt: _FormatLike,
    b_fmt: _FormatLike,
    a_scales: Optional[_Array],
    b_scales: Optional[_Array],
    bias: Optional[_Array],
    out_dtype: Optional[str],
    out: Optional[_Array],
    backend: str,
    empty: _Empty,
    threads: int,
    stream: int,
    accumulation: Optional[list[int]] = None,
    a_block: tuple[int, int] = (0, 0),
    b_block: tuple[int, int] = (0, 0),
    fast_accumulation: bool = False,
) -> _Array: ...

def _describe(obj: _Array, name: str = "x", writable: bool = False) -> dict[str, Any]: ...
def cuda_available() -> bool: ...
def cuda_built() -> bool: ...
def cuda_device_count() -> int: ...
def _throw(kind: str, what: str) -> None: ...

# ---- block-wise quantization (python/src/blockwise.cpp) ----
# Codebooks are passed and returned as their 256 float32 values (numpy arrays).

def codebook_dynamic_tree(signed: bool) -> Any: ...
def codebook_linear(signed: bool) -> Any: ...
def codebook_from_format(fmt: _FormatLike) -> Any: ...
def codebook_from_quantiles(q: _Array) -> Any: ...
def codebook_from_values(v: _Array) -> Any: ...
def is_blockwise_block(block: int) -> bool: ...
def quantize_blockwise(
    x: _Array,
    codebook: _Array,
    block: int,
    rounding: str,
    seed: int,
    offset: int,
    empty: _Empty,
    threads: int,
    stream: int,
) -> tuple[_Array, _Array]: ...
def quantize_blockwise_nested(
    x: _Array,
    codebook: _Array,
    nested_codebook: _Array,
    block: int,
    rounding: str,
    seed: int,
    offset: int,
    empty: _Empty,
    threads: int,
    stream: int,
) -> tuple[_Array, _Array, _Array]: ...
def dequantize_blockwise(
    codes: _Array,
    absmax: _Array,
    codebook: _Array,
    block: int,
    out: Optional[_Array],
    empty: _Empty,
    threads: int,
    stream: int,
) -> _Array: ...
def dequantize_blockwise_nested(
    codes: _Array,
    absmax_codes: _Array,
    absmax2: _Array,
    codebook: _Array,
    nested_codebook: _Array,
    block: int,
    out: Optional[_Array],
    empty: _Empty,
    threads: int,
    stream: int,
) -> _Array: ...
def estimate_quantiles(
    x: _Array, k: int, out: Optional[_Array], empty: _Empty, threads: int, stream: int
) -> _Array: ...

# ---- verify (python/src/verify.cpp) ----

class VerifyElement:
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

class VerifyBucket:
    label: str
    lo: float
    hi: float
    count: int

class VerifyReport:
    policy: str
    grid: str
    candidate_dtype: str
    reference_dtype: str
    input_dtype: Optional[str]
    shape: tuple[int, ...]
    total: int
    checked: int
    nan_matches: int
    nan_mismatches: int
    failed: int
    max_abs_error: float
    max_rel_error: float
    max_ulp_error: float
    worst: list[VerifyElement]
    histogram: list[VerifyBucket]
    ok: bool
    def to_string(self) -> str: ...
    def to_json(self) -> str: ...

def verify(
    candidate: Any,
    reference: Any,
    policy: Optional[str],
    format: Optional[_FormatLike],
    inputs: Any,
    input_format: Optional[_FormatLike],
    worst: int,
    bounds: Any,
    bound_name: str,
) -> VerifyReport: ...

# ---- the optimizer steps (python/src/optim.cpp) ----

def optimizer_step(
    optimizer: str,
    tensors: list[tuple[Any, ...]],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    lr_decay: float,
    maximize: bool,
    step: int,
    skipped: Optional[Any],
    block: int,
    rounding: str,
    seed: int,
    offset: int,
    threads: int,
    stream: int,
    max_trust_ratio: float = ...,
    trust_coefficient: float = ...,
    adapt: bool = ...,
    bias_correction: bool = ...,
    centered: bool = ...,
    amsgrad: bool = ...,
) -> None: ...

def optimizer_step_raw(
    optimizer: str,
    items: list[tuple[int, int, int, int, int, int, int, int, int, int, bool, int, int]],
    device_type: int,
    device_index: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    lr_decay: float,
    maximize: bool,
    step: int,
    skipped: int,
    block: int,
    rounding: str,
    seed: int,
    offset: int,
    threads: int,
    stream: int,
    max_trust_ratio: float = ...,
    trust_coefficient: float = ...,
    adapt: bool = ...,
    bias_correction: bool = ...,
    centered: bool = ...,
    amsgrad: bool = ...,
) -> None: ...


def residual_split_raw(
    x: int,
    weight: int,
    residual: int,
    n: int,
    weight_code: int,
    bits: int,
    device_type: int,
    device_index: int,
    stream: int,
) -> None: ...


def residual_join_raw(
    weight: int,
    residual: int,
    out: int,
    n: int,
    weight_code: int,
    bits: int,
    device_type: int,
    device_index: int,
    stream: int,
) -> None: ...

def actquant_quantize_raw(
    x: int,
    x_dtype: int,
    shape: list[int],
    dim: int,
    group_size: int,
    codes: int,
    alpha: int,
    beta: int,
    quantize: bool,
    update: bool,
    lagged: bool,
    momentum: float,
    rounding: str,
    random_bits: int,
    seed: int,
    offset: int,
    device_type: int,
    device_index: int,
    threads: int,
    stream: int,
) -> None: ...
def actquant_dequantize_raw(
    codes: int,
    shape: list[int],
    dim: int,
    group_size: int,
    alpha: int,
    beta: int,
    out: int,
    out_dtype: int,
    device_type: int,
    device_index: int,
    threads: int,
    stream: int,
) -> None: ...
def actquant_layer_norm_backward_raw(
    codes: int,
    shape: list[int],
    group_size: int,
    alpha: int,
    beta: int,
    gy: int,
    dtype: int,
    weight: int,
    eps: float,
    gx: int,
    gw: int,
    gb: int,
    device_type: int,
    device_index: int,
    threads: int,
    stream: int,
) -> None: ...
def actquant_activation_backward_raw(
    codes: int,
    shape: list[int],
    dim: int,
    group_size: int,
    alpha: int,
    beta: int,
    activation: str,
    dy: int,
    dtype: int,
    gx: int,
    value: int,
    device_type: int,
    device_index: int,
    threads: int,
    stream: int,
) -> None: ...
