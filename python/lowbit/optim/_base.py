"""The torch.optim layer over lowbit's fused optimizer steps (kernels/optim).

Every optimizer here is a :class:`torch.optim.Optimizer` whose ``step`` hands each param group's
tensors to one multi-tensor call of ``lowbit._core.optimizer_step``: the CPU twin for CPU
tensors, the CUDA kernel on the current stream for CUDA tensors. States are ordinary tensors in
``self.state[p]`` under torch's names (``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``,
``momentum_buffer``, ``square_avg``, ``grad_avg``, ``sum``): float32 for 32-bit states; for 8-bit
states uint8 codes of the parameter's shape plus float32 ``<name>_absmax`` (one per block),
quantized with the dynamic tree map (signed for first moments and momentum, unsigned for second
moments and their maximum). The equations, the state layout and the rule for NaN/Inf gradients
are in docs/techniques/optimizers.md.

Percentile gradient clipping (``percentile_clipping=q``, q in 1..100, 100 = off; the 8-bit
optimizers paper, Dettmers et al. 2022): each parameter keeps the L2 norms of its last 100 gradients
(``gnorm_history``, float32 [100], NaN where empty or where the norm was not finite); a step records
the current norm, takes the q-th percentile of the recorded norms (nearest rank) as the clip value
and scales the gradient by clip / norm where the norm exceeds it. The norm and the percentile are
torch operations on the parameter's device, written to need no host synchronization.

Residual master weights (``master_weights="residual16"`` or ``"residual8"``; Lewandowski and
Kosson 2023; docs/techniques/residual.md): bfloat16/float16 parameters keep, in
``state["residual"]`` (int16 or int8, the parameter's shape), the bits their float32 master value
lost; the kernel rebuilds the float32 value, updates it, and writes the 16-bit weight (rounded to
nearest, ties away from zero) and the residual back, so no float32 copy exists. float32
parameters are their own master and get none. :meth:`LowbitOptimizer.to_residual` turns float32
parameters into 16-bit ones plus residuals; :meth:`LowbitOptimizer.master_weight` rebuilds the
float32 value. The residual is an ordinary state tensor: state_dict carries it.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Optional

import torch

from lowbit import _core
from lowbit._blockwise import Codebook, dequantize_blockwise, quantize_blockwise
from lowbit._interop import torch_stream
from lowbit.optim import _distributed as _dist

__all__ = ["LowbitOptimizer", "override", "residual_split", "residual_join"]

_HISTORY = 100  # gradient norms kept per parameter for percentile clipping

_OVERRIDE_ATTR = "_lowbit_optim"
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# Keyword arguments of the entry: LAMB's and LARS' trust-ratio settings, RMSprop's centered,
# Adam's amsgrad.
_KEYWORD_ARGS = ("max_trust_ratio", "trust_coefficient", "adapt", "bias_correction", "centered",
                 "amsgrad")
# master_weights: the residual's bits and storage dtype.
_MASTER = {"residual16": (16, torch.int16), "residual8": (8, torch.int8)}
_RESIDUAL_BITS = {torch.int16: 16, torch.int8: 8}
# A param group's settings of how states are stored: the optimizer's own, kept by load_state_dict.
_STORAGE_KEYS = ("bits", "min_8bit_size", "master_weights")


def _check_master(master: Any) -> None:
    if master is not None and master not in _MASTER:
        raise ValueError(f"master_weights={master!r}; expected None, 'residual16' or 'residual8'")




def _on_stream(device: torch.device, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
    """fn(*args, stream, **kwargs) with the raw handle of torch's current stream on CUDA device
    `device`, that device current during the call (entered only where it is not already: a
    step per parameter inside the backward pass makes this call hundreds of times a step)."""
    current = torch.cuda.current_device()
    index = device.index if device.index is not None else current
    stream = torch_stream(torch, index)
    if current == index:
        fn(*args, stream, **kwargs)
        return
    with torch.cuda.device(index):
        fn(*args, stream, **kwargs)


def _residual_call(split: bool, x: torch.Tensor, w: torch.Tensor, r: torch.Tensor,
                   bits: int) -> None:
    """One residual split (x -> w, r) or join (w, r -> x) call; contiguous tensors of one
    device."""
    dev = w.device
    if dev.type not in ("cpu", "cuda"):
        raise RuntimeError(f"residual: tensors on {dev} are not supported (CPU and CUDA only)")
    ptrs = (x.data_ptr(), w.data_ptr(), r.data_ptr()) if split else \
        (w.data_ptr(), r.data_ptr(), x.data_ptr())
    args = (*ptrs, w.numel(), _DTYPE_CODES[w.dtype], bits, 1 if dev.type == "cuda" else 0,
            dev.index or 0)
    fn = _core.residual_split_raw if split else _core.residual_join_raw
    if dev.type == "cuda":
        _on_stream(dev, fn, args, {})
    else:
        fn(*args, 0)


def residual_split(x: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                   bits: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Splits float32 x into the nearest ``dtype`` (bfloat16 or float16) weight, ties away from
    zero, and a ``bits``-bit residual (int16 for bits > 8, else int8; 1 <= bits <= 16); returns
    (weight, residual) of x's shape on x's device. bfloat16 with bits=16 is exact:
    ``residual_join(*residual_split(x)) `` has x's bits for every non-NaN x."""
    if dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"residual_split: dtype {dtype}; expected torch.bfloat16 or torch.float16")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
        raise ValueError(f"residual_split: bits={bits!r}; expected an int in [1, 16]")
    x = x.detach().to(torch.float32).contiguous()
    w = torch.empty(x.shape, dtype=dtype, device=x.device)
    r = torch.empty(x.shape, dtype=torch.int16 if bits > 8 else torch.int8, device=x.device)
    _residual_call(True, x, w, r, bits)
    return w, r


def residual_join(weight: torch.Tensor, residual: torch.Tensor,
                  bits: Optional[int] = None) -> torch.Tensor:
    """The float32 values of (weight, residual) pairs (``bits``: 16 for an int16 residual, 8
    for int8 unless given)."""
    if weight.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"residual_join: weight dtype {weight.dtype}; expected bfloat16 or "
                        "float16")
    if residual.dtype not in _RESIDUAL_BITS:
        raise TypeError(f"residual_join: residual dtype {residual.dtype}; expected int16 or int8")
    if bits is None:
        bits = _RESIDUAL_BITS[residual.dtype]
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16 or \
            (bits > 8) != (residual.dtype == torch.int16):
        raise ValueError(f"residual_join: bits={bits!r} with a {residual.dtype} residual; "
                         "expected 1..8 for int8, 9..16 for int16 (residual_split's dtypes)")
    if residual.shape != weight.shape or residual.device != weight.device:
        raise ValueError("residual_join: weight and residual differ in shape or device")
    w = weight.detach().contiguous()
    r = residual.detach().contiguous()
    out = torch.empty(w.shape, dtype=torch.float32, device=w.device)
    _residual_call(False, out, w, r, bits)
    return out


def override(param: torch.Tensor, **config: Any) -> torch.Tensor:
    """Per-parameter settings that win over the param group's: ``bits`` (8 or 32) and
    ``min_8bit_size``. ``lowbit.optim.override(model.emb.weight, bits=32)`` keeps an embedding's
    states in 32 bits (as :class:`lowbit.nn.StableEmbedding` does for its weight). Returns the
    parameter."""
    allowed = {"bits", "min_8bit_size"}
    unknown = set(config) - allowed
    if unknown:
        raise TypeError(f"override: unknown setting(s) {sorted(unknown)}; expected bits, "
                        "min_8bit_size")
    if "bits" in config:
        _check_bits(config["bits"])
    if "min_8bit_size" in config:
        _check_min_8bit_size(config["min_8bit_size"])
    current = dict(getattr(param, _OVERRIDE_ATTR, {}))
    current.update(config)
    setattr(param, _OVERRIDE_ATTR, current)
    return param


def _check_bits(bits: Any) -> None:
    if isinstance(bits, bool) or bits not in (8, 32):
        raise ValueError(f"bits={bits!r}; expected 8 or 32")


def _check_min_8bit_size(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"min_8bit_size={n!r}; expected an int >= 0")


def _check_percentile(q: Any) -> None:
    if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100:
        raise ValueError(f"percentile_clipping={q!r}; expected an int in [1, 100] (100: off)")


_codebooks: dict[bool, tuple[Codebook, int]] = {}


def _codebook(signed: bool) -> tuple[Codebook, int]:
    """The dynamic tree map and the code of 0 in it (the initial state)."""
    if signed not in _codebooks:
        cb = Codebook.dynamic_tree(signed)
        zero = int((cb.values == 0.0).nonzero()[0][0])
        _codebooks[signed] = (cb, zero)
    return _codebooks[signed]


class LowbitOptimizer(torch.optim.Optimizer):
    """Base class: subclasses name the kernel's optimizer, its state names (with the signedness
    of each) and map their hyper-parameters onto the kernel's."""

    _kernel: str = ""
    # (name, signed map) of every state the optimizer may keep; _group_states says which a
    # param group keeps, in the kernel's order (state1, state2, state3).
    _states: tuple[tuple[str, bool], ...] = ()

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], *, bits: int,
                 block_size: int, min_8bit_size: int, stochastic_rounding: bool,
                 seed: Optional[int], percentile_clipping: int = 100,
                 master_weights: Optional[str] = None) -> None:
        _check_bits(bits)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or \
                block_size not in (256, 2048):
            raise ValueError(f"block_size={block_size!r}; expected 256 or 2048")
        _check_min_8bit_size(min_8bit_size)
        _check_percentile(percentile_clipping)
        _check_master(master_weights)
        if seed is None:
            seed = int(torch.initial_seed()) & 0xFFFFFFFFFFFFFFFF
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed={seed!r}; expected None or an int in [0, 2**64)")
        defaults = dict(defaults, bits=bits, min_8bit_size=min_8bit_size,
                        percentile_clipping=percentile_clipping, master_weights=master_weights)
        super().__init__(params, defaults)
        self.block_size = block_size
        self.stochastic_rounding = bool(stochastic_rounding)
        self.seed = int(seed)
        # The Philox offset of stochastic rounding, advanced by every call (saved in state_dict).
        self.rng_offset = 0
        # Blocks left untouched for NaN/Inf, all steps so far: a base count plus the counters
        # the kernel adds to, one int64 per item of a call, kept per (device, item count) so that
        # a step (one per parameter inside the backward pass) allocates and sums nothing.
        self._skipped_base = 0
        self._skipped_counts: dict[tuple[torch.device, int], torch.Tensor] = {}
        # Per parameter: the plan of _plan, with the storage key and state objects it was made
        # from.
        self._fields: dict[torch.Tensor, tuple[tuple[Any, ...], tuple[Any, ...],
                                               tuple[Any, ...]]] = {}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        try:  # the group's storage settings, which the constructor checked for the defaults
            _check_bits(g["bits"])
            _check_min_8bit_size(g["min_8bit_size"])
            _check_percentile(g["percentile_clipping"])
            _check_master(g.get("master_weights"))
        except ValueError:
            self.param_groups.pop()
            raise

    @property
    def skipped_blocks(self) -> Any:
        """Blocks left untouched for a NaN/Inf gradient or state, over all steps so far: an int
        where every step ran on the CPU, else a 0-d int64 tensor on the GPU (reading it does not
        synchronize; ``int()`` of it does)."""
        total: Any = self._skipped_base
        for (device, _), counts in self._skipped_counts.items():
            total = total + (int(counts.sum()) if device.type == "cpu" else counts.sum())
        return total

    @skipped_blocks.setter
    def skipped_blocks(self, value: int) -> None:
        self._skipped_base = int(value)
        self._skipped_counts = {}

    def _skipped_counter(self, device: torch.device, n: int) -> torch.Tensor:
        counts = self._skipped_counts.get((device, n))
        if counts is None:
            counts = torch.zeros(n, dtype=torch.int64, device=device)
            self._skipped_counts[(device, n)] = counts
        return counts

    # ---- the kernel's hyper-parameters (subclasses) ----------------------------------------

    def _hparams(self, group: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _group_states(self, group: dict[str, Any]) -> tuple[tuple[str, bool], ...]:
        return self._states

    def _initial_value(self, group: dict[str, Any], name: str) -> float:
        return 0.0

    # ---- states ----------------------------------------------------------------------------

    def _bits_for(self, p: torch.Tensor, group: dict[str, Any]) -> int:
        cfg = getattr(p, _OVERRIDE_ATTR, {})
        bits = cfg.get("bits", group["bits"])
        threshold = cfg.get("min_8bit_size", group["min_8bit_size"])
        # From the global parameter (a DTensor's shape is global), so that the same parameter
        # gets the same states on any mesh: rows of whole blocks (lowbit.optim._distributed).
        return 8 if bits == 8 and p.numel() >= threshold and \
            _dist.blocks_align(p.shape, self.block_size) else 32

    def _blocks(self, p: torch.Tensor) -> int:
        return (p.numel() + self.block_size - 1) // self.block_size

    def _init_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        st = self.state[p]  # may hold a residual already (to_residual)
        st["step"] = 0
        master = group.get("master_weights")
        if master is not None and "residual" not in st and p.dtype != torch.float32:
            # The 16-bit value taken as exact: residual 0.
            st["residual"] = torch.zeros(p.shape, dtype=_MASTER[master][1], device=p.device)
        eight = self._bits_for(p, group) == 8
        if eight:
            _dist.check_placements(p, type(self).__name__)
        lp = _dist.local(p)  # the rank's shard of a DTensor parameter (FSDP2), else p
        for name, signed in self._group_states(group):
            init = self._initial_value(group, name)
            if eight:
                _, zero = _codebook(signed)
                st[name] = _dist.like(p, torch.full(lp.shape, zero, dtype=torch.uint8,
                                                    device=lp.device), p.shape)
                st[name + "_absmax"] = _dist.like(
                    p, torch.zeros(_dist.absmax_shape(lp.shape, self.block_size),
                                   dtype=torch.float32, device=lp.device),
                    _dist.absmax_shape(p.shape, self.block_size))
                if init != 0.0:
                    self._quantize_into(st, name, signed,
                                        torch.full(lp.shape, init, dtype=torch.float32,
                                                   device=lp.device), p)
            else:
                st[name] = _dist.like(p, torch.full(lp.shape, init, dtype=torch.float32,
                                                    device=lp.device), p.shape)
        return st

    def _quantize_into(self, st: dict[str, Any], name: str, signed: bool,
                       values: torch.Tensor, p: Optional[torch.Tensor] = None) -> None:
        """values: the local part (of p, where p is a DTensor)."""
        cb, _ = _codebook(signed)
        bs = self.block_size
        if values.numel() == 0:  # an empty shard
            codes = torch.empty(values.shape, dtype=torch.uint8, device=values.device)
            absmax = torch.empty(_dist.absmax_shape(values.shape, bs) if values.dim() >= 2
                                 else (0,), dtype=torch.float32, device=values.device)
        else:
            codes, absmax = quantize_blockwise(values.detach().float().contiguous(), cb, bs)
            if _dist.blocks_align(values.shape, bs):
                absmax = absmax.reshape(_dist.absmax_shape(values.shape, bs))
        full = values.shape if p is None else p.shape
        st[name] = _dist.like(p, codes.reshape(values.shape), full) if p is not None else \
            codes.reshape(values.shape)
        st[name + "_absmax"] = absmax if p is None else \
            _dist.like(p, absmax, _dist.absmax_shape(full, bs))

    def _dequantized(self, st: dict[str, Any], name: str, signed: bool) -> torch.Tensor:
        cb, _ = _codebook(signed)
        codes = _dist.local(st[name])
        if codes.numel() == 0:
            return torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
        absmax = _dist.local(st[name + "_absmax"]).reshape(-1)
        return dequantize_blockwise(codes.contiguous(), absmax, cb,
                                    self.block_size).reshape(codes.shape)

    def state_float(self, p: torch.Tensor, name: str) -> torch.Tensor:
        """A state of p as float32 values (8-bit states dequantized)."""
        st = self.state[p]
        signed = dict(self._states)[name]
        if st[name].dtype == torch.uint8:
            return _dist.like(st[name], self._dequantized(st, name, signed), st[name].shape) \
                if _dist.is_dtensor(st[name]) else self._dequantized(st, name, signed)
        return st[name]

    # ---- the step --------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _plan(self, p: torch.Tensor, param: torch.Tensor, st: dict[str, Any],
              specs: tuple[tuple[str, bool], ...]) -> tuple[Any, ...]:
        """What a step needs of parameter p (param: its local tensor) besides the gradient,
        checked once and cached while param's storage (address, dtype, size) and p's state tensors
        stay the same:
        (numel, dtype code, state pointers, 8-bit, residual pointer, residual bits, the objects
        the pointers point into, whether p is sharded)."""
        objs = [st[name] for name, _ in specs]
        objs.append(st.get("residual"))
        # The storage as the kernel sees it (a tensor put in p.data later may reuse the address)
        # and the state objects by id: the cached plan holds the objects it was made from, so
        # no other object can have their ids while it is cached.
        key = (param.data_ptr(), param.dtype, param.numel(), *map(id, objs))
        cached = self._fields.get(p)
        if cached is not None and cached[0] == key:
            return cached[2]
        objs = tuple(objs)
        code = _DTYPE_CODES.get(p.dtype)
        if code is None:
            raise TypeError(f"{type(self).__name__}: parameter dtype {p.dtype} is not "
                            "supported; expected float32, bfloat16 or float16")
        ptrs, eight = self._state_fields(param, st, specs)
        rptr, rbits = self._residual_field(p, st)
        plan = (param.numel(), code, tuple(ptrs), eight, rptr, rbits, objs,
                _dist.is_sharded(p))
        self._fields[p] = (key, objs, plan)
        return plan

    def _step_group(self, group: dict[str, Any],
                    params: Optional[Iterable[torch.Tensor]] = None) -> None:
        """Steps the group's parameters that have a gradient (``params``: only these)."""
        master = group.get("master_weights")
        _check_master(master)
        specs = self._group_states(group)
        q = group.get("percentile_clipping", 100)
        if q != 100:
            _check_percentile(q)
        who = type(self).__name__
        # One call per (device, step): a group's parameters normally share both.
        buckets: dict[tuple[Any, int], list[tuple[Any, ...]]] = {}
        keep: list[Any] = []  # what the raw pointers point into, until the calls return
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        steps: dict[int, tuple[dict[str, Any], int]] = {}  # by state: the state, its new step
        empty = 0  # empty shards, counted as items for the Philox offset (the same on all ranks)
        for p in group["params"] if params is None else params:
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError(f"{who} does not support sparse gradients")
            st = self.state[p]
            first = "step" not in st
            if first:  # refused before its states are made
                _dist.check_step(p, self._kernel, group, self.stochastic_rounding, who)
                st = self._init_state(p, group)
            elif master is not None and "residual" not in st and p.dtype != torch.float32:
                # a parameter made 16-bit after its first step: its value taken as exact
                st["residual"] = torch.zeros(p.shape, dtype=_MASTER[master][1], device=p.device)
            param = _dist.local(p)  # a DTensor's (FSDP2's) local shard, else p itself
            n, code, ptrs, eight, rptr, rbits, objs, sharded = self._plan(p, param, st, specs)
            if sharded and not first:  # a group's settings may have changed since
                _dist.check_step(p, self._kernel, group, self.stochastic_rounding, who)
            # Counted once the calls have run (a refused call leaves every count as it was);
            # a parameter listed twice is stepped twice, as torch's optimizers do.
            step = steps.get(id(st), (st, int(st["step"])))[1] + 1
            steps[id(st)] = (st, step)
            grad = _dist.local(grad)
            if grad.shape != param.shape:  # the kernel reads the parameter's size of it
                raise RuntimeError(f"{who}: a gradient of shape {tuple(grad.shape)} for a "
                                   f"parameter of shape {tuple(param.shape)}")
            if n == 0:  # an empty shard: nothing to update
                empty += 1
                continue
            if not param.is_contiguous():
                param = param.detach().contiguous()
                copies.append((p, param))
            device = param.device
            if grad.device != device:
                raise RuntimeError(f"{who}: a gradient on {grad.device} for a parameter on "
                                   f"{device}")
            if grad.dtype != p.dtype:
                grad = grad.to(p.dtype)
            if not grad.is_contiguous():
                grad = grad.contiguous()
            if q != 100:
                grad = self._clipped(st, grad, q, step)
            keep.append((param, grad, objs))
            buckets.setdefault((device, step), []).append(
                (param.data_ptr(), grad.data_ptr(), *ptrs, n, code, eight, rptr, rbits))
        # Philox streams per item: one per state, at least two (the kernel's stream numbering).
        streams = max(2, len(specs))
        if buckets:
            hp = self._hparams(group)
            rounding = "stochastic" if self.stochastic_rounding else "nearest_toward_zero"
            keywords = {k: hp[k] for k in _KEYWORD_ARGS if k in hp}
            coeffs = (hp.get("lr", 0.0), hp.get("beta1", 0.0), hp.get("beta2", 0.0),
                      hp.get("eps", 0.0), hp.get("weight_decay", 0.0), hp.get("momentum", 0.0),
                      hp.get("dampening", 0.0), hp.get("nesterov", False),
                      hp.get("lr_decay", 0.0), hp.get("maximize", False))
        for (device, step), items in buckets.items():
            skipped = self._skipped_counter(device, len(items))  # the kernel adds to it
            args = (self._kernel, items, 1 if device.type == "cuda" else 0, device.index or 0,
                    *coeffs, step, skipped.data_ptr(), self.block_size, rounding, self.seed,
                    self.rng_offset, 0)
            if device.type == "cuda":
                _on_stream(device, _core.optimizer_step_raw, args, keywords)
            elif device.type == "cpu":
                _core.optimizer_step_raw(*args, 0, **keywords)
            else:
                raise RuntimeError(f"{who}: parameters on {device} are not supported (CPU and "
                                   "CUDA only)")
            self.rng_offset += streams * len(items)
        self.rng_offset += streams * empty
        for st, step in steps.values():
            st["step"] = step
        for p, param in copies:
            _dist.local(p).copy_(param)
        del keep

    def _residual_field(self, p: torch.Tensor, st: dict[str, Any]) -> tuple[int, int]:
        """The residual's data pointer and bits (0, 0 without one), checked."""
        r = st.get("residual")
        if r is None:
            return 0, 0
        if p.dtype == torch.float32:
            raise RuntimeError(f"{type(self).__name__}: a float32 parameter has a residual; "
                               "float32 parameters are their own master")
        if r.dtype not in _RESIDUAL_BITS or r.device != p.device or not r.is_contiguous() or \
                r.numel() != p.numel():
            raise RuntimeError(f"{type(self).__name__}: the residual of a parameter is not a "
                               "contiguous int16 or int8 tensor of its size on its device")
        return r.data_ptr(), _RESIDUAL_BITS[r.dtype]

    # ---- residual master weights -----------------------------------------------------------

    @torch.no_grad()
    def to_residual(self, dtype: torch.dtype = torch.bfloat16) -> None:
        """Turns the float32 parameters of the groups with ``master_weights`` set into ``dtype``
        (bfloat16 or float16) parameters plus residuals, in place (``p.data`` is replaced; the
        Parameter objects, and so the model's references, stay). With bfloat16 and residual16
        the float32 values are kept exactly. Gradients of converted parameters are dropped."""
        if dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"to_residual: dtype {dtype}; expected torch.bfloat16 or "
                            "torch.float16")
        for group in self.param_groups:
            master = group.get("master_weights")
            if master is None:
                continue
            bits = _MASTER[master][0]
            for p in group["params"]:
                if p.dtype != torch.float32:
                    continue
                w, r = residual_split(p.data, dtype, bits)
                p.data = w
                p.grad = None
                self.state[p]["residual"] = r
                self._fields.pop(p, None)

    def master_weight(self, p: torch.Tensor) -> torch.Tensor:
        """The float32 master value of parameter p: weight and residual joined where p has a
        residual, else p as float32."""
        r = self.state[p].get("residual") if p in self.state else None
        if r is None:
            return p.detach().float()
        return residual_join(p.detach(), r)

    def _clipped(self, st: dict[str, Any], grad: torch.Tensor, q: int,
                 step: int) -> torch.Tensor:
        """The gradient of step `step` scaled by percentile clipping (a new tensor: p.grad is
        left as it is)."""
        hist = st.get("gnorm_history")
        if hist is None or hist.device != grad.device:
            hist = torch.full((_HISTORY,), float("nan"), dtype=torch.float32, device=grad.device)
            st["gnorm_history"] = hist
        norm = torch.linalg.vector_norm(grad, dtype=torch.float32)
        slot = (step - 1) % _HISTORY
        # A non-finite norm is not recorded (NaN marks the slot empty): one bad gradient, whose
        # blocks the kernel skips anyway, must not set the clip value of the next 100 steps.
        hist[slot] = torch.where(torch.isfinite(norm), norm, torch.nan)
        # torch.sort puts NaN last, so the recorded norms come first, ascending.
        ordered = torch.sort(hist).values
        count = torch.isfinite(hist).sum()
        rank = torch.clamp((count * q + 99) // 100 - 1, min=0)  # nearest rank: ceil(q n / 100)
        # gather, not ordered[rank]: indexing with a 0-d tensor reads it on the host (a sync).
        clip = ordered.gather(0, rank.reshape(1)).reshape(())
        # Nothing recorded (clip NaN), a norm within the clip value, or a non-finite norm (an
        # Inf or NaN element, or squares beyond float32: the kernel skips the blocks that hold
        # one, the others step unscaled): scale 1.
        scale = torch.where(torch.isfinite(norm) & (norm > clip), clip / norm,
                            torch.ones_like(norm))
        if grad.dtype == torch.float32:
            return grad * scale
        return (grad.float() * scale).to(grad.dtype)

    def _state_fields(self, p: torch.Tensor, st: dict[str, Any],
                      names: tuple[tuple[str, bool], ...]) -> tuple[list[int], bool]:
        """The states' data pointers (state1..3, then absmax1..3; 0 where not kept) and whether
        they are 8-bit, checked; cached per parameter while its state tensors stay the same
        objects."""
        ptrs = [0] * 6
        eight = False
        for k, (name, _) in enumerate(names):
            s_k = _dist.local(st[name])
            if s_k.device != p.device or not s_k.is_contiguous() or s_k.numel() != p.numel():
                raise RuntimeError(f"{type(self).__name__}: state '{name}' of a parameter "
                                   "is not a contiguous tensor of its size on its device")
            ptrs[k] = s_k.data_ptr()
            if s_k.dtype == torch.uint8:
                eight = True
                a_k = _dist.local(st[name + "_absmax"])
                if a_k.dtype != torch.float32 or not a_k.is_contiguous() or \
                        a_k.numel() != self._blocks(p) or a_k.device != p.device:
                    raise RuntimeError(f"{type(self).__name__}: '{name}_absmax' of a "
                                       "parameter is not float32 with one value per block")
                ptrs[3 + k] = a_k.data_ptr()
            elif s_k.dtype != torch.float32:
                raise RuntimeError(f"{type(self).__name__}: state '{name}' has dtype "
                                   f"{s_k.dtype}; expected float32 or uint8")
        if eight and not all(st[name].dtype == torch.uint8 for name, _ in names):
            raise RuntimeError(f"{type(self).__name__}: a parameter's states mix 8 and 32 bits")
        return ptrs, eight

    # ---- state_dict ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["lowbit"] = {"block_size": self.block_size, "seed": self.seed,
                        "rng_offset": self.rng_offset,
                        "stochastic_rounding": self.stochastic_rounding,
                        "skipped_blocks": int(self.skipped_blocks)}
        # Also in every param group: torch.distributed.checkpoint's get_optimizer_state_dict
        # keeps "state" and "param_groups" only.
        for g in sd["param_groups"]:
            g["lowbit"] = dict(sd["lowbit"])
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state saved by this optimizer or by its torch.optim counterpart (torch.optim.
        AdamW, Adam, SGD, RMSprop, Adagrad: float states, quantized here where this optimizer
        keeps 8-bit states; 8-bit states are dequantized where it keeps 32-bit ones). States keep
        their saved dtype (torch would cast them to the parameter's)."""
        extra = state_dict.get("lowbit") or next(
            (g["lowbit"] for g in state_dict.get("param_groups", []) if "lowbit" in g), {})
        saved_block = int(extra.get("block_size", self.block_size))
        sd = {k: v for k, v in state_dict.items() if k != "lowbit"}
        saved = sd["state"]
        originals = {k: dict(v) for k, v in saved.items()}
        # What this optimizer keeps, not what the checkpoint's groups say: the states' storage
        # (bits, min_8bit_size, master_weights) is this optimizer's choice, and the states are
        # converted to it; the hyper-parameters (lr, betas, ...) are the checkpoint's.
        storage = [{k: g[k] for k in _STORAGE_KEYS if k in g} for g in self.param_groups]
        # A refused load leaves the optimizer as it was.
        before = (self.state, self.param_groups)
        try:
            super().load_state_dict(sd)
            for group, keep in zip(self.param_groups, storage):
                group.pop("lowbit", None)  # a torch optimizer's groups lack lowbit's settings
                for k, v in self.defaults.items():
                    group.setdefault(k, v)
                group.update(keep)
            saved_ids = itertools.chain.from_iterable(g["params"] for g in sd["param_groups"])
            params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
            owner = {id(p): g for g in self.param_groups for p in g["params"]}
            for index, (pid, p) in enumerate(zip(saved_ids, params)):
                if pid not in originals:
                    continue
                self._adopt(p, owner[id(p)], originals[pid], saved_block, index)
        except Exception:
            self.state, self.param_groups = before
            raise
        self._fields = {}
        if "rng_offset" in extra:
            self.rng_offset = int(extra["rng_offset"])
            self.seed = int(extra["seed"])
        self.skipped_blocks = int(extra.get("skipped_blocks", 0))

    def _adopt(self, p: torch.Tensor, group: dict[str, Any], saved: dict[str, Any],
               saved_block: int, index: int) -> None:
        st: dict[str, Any] = {}
        where = f"load_state_dict: parameter {index}"
        names = self._group_states(group)
        step = saved.get("step")
        if step is None:
            # torch's SGD keeps no step: a saved momentum buffer means a step was taken (the
            # next is not the first, which would replace the buffer by the gradient)
            step = 1 if any(saved.get(name) is not None for name, _ in names) else 0
        st["step"] = int(step.item()) if isinstance(step, torch.Tensor) else int(step)
        eight = self._bits_for(p, group) == 8
        lp = _dist.local(p)  # a DTensor's local shard; saved DTensor states hold the same rows
        bs = self.block_size
        for name, signed in names:
            if saved.get(name) is None:
                raise KeyError(f"{where}: its state has no '{name}' (saved by another "
                               f"optimizer, or with other settings?)")
            if _dist.is_dtensor(p) != _dist.is_dtensor(saved[name]):
                raise RuntimeError("load_state_dict: states and parameters must both be DTensors "
                                   "or both plain tensors; load a checkpoint into a sharded "
                                   "model with torch.distributed.checkpoint "
                                   "(docs/distributed.md)")
            value = _dist.local(saved[name]).to(device=lp.device)
            if value.shape != lp.shape:
                raise ValueError(f"{where}: state '{name}' has shape {tuple(value.shape)}, the "
                                 f"parameter {tuple(lp.shape)}")
            if value.dtype != torch.uint8 and not value.is_floating_point():
                raise TypeError(f"{where}: state '{name}' has dtype {value.dtype}; expected "
                                "floating point or uint8 codes")
            if value.dtype == torch.uint8:
                if saved.get(name + "_absmax") is None:
                    raise KeyError(f"{where}: 8-bit state '{name}' without its "
                                   f"'{name}_absmax'")
                absmax = _dist.local(saved[name + "_absmax"]).to(device=lp.device,
                                                                 dtype=torch.float32)
                if absmax.numel() != (value.numel() + saved_block - 1) // saved_block:
                    raise ValueError(f"{where}: '{name}_absmax' has {absmax.numel()} values; "
                                     f"expected one per block of {saved_block}")
                if eight and saved_block == bs:
                    st[name] = _dist.like(p, value.reshape(lp.shape), p.shape)
                    st[name + "_absmax"] = _dist.like(
                        p, absmax.reshape(_dist.absmax_shape(lp.shape, bs)),
                        _dist.absmax_shape(p.shape, bs))
                    continue
                cb, _ = _codebook(signed)
                value = value.reshape(lp.shape) if value.numel() == 0 else \
                    dequantize_blockwise(value.contiguous(), absmax.reshape(-1), cb,
                                         saved_block).reshape(lp.shape)
            value = value.to(torch.float32).reshape(lp.shape)
            if eight:
                self._quantize_into(st, name, signed, value, p)
            else:
                st[name] = _dist.like(p, value.clone(), p.shape)
        if "residual" in saved and p.dtype != torch.float32:
            st["residual"] = saved["residual"].to(device=p.device).reshape(p.shape).clone()
        if "gnorm_history" in saved:
            st["gnorm_history"] = saved["gnorm_history"].to(device=p.device,
                                                            dtype=torch.float32).clone()
        self.state[p] = st
