"""The optimizers: torch.optim's constructor arguments where torch has the optimizer, plus
``bits`` (32 or 8), ``block_size`` (256 or 2048), ``min_8bit_size`` (parameters with fewer
elements keep 32-bit states), ``stochastic_rounding`` and ``seed`` (of the 8-bit states'
rounding), and ``percentile_clipping`` (1..100, 100 = off: the gradient clipped at that
percentile of its last 100 norms; lowbit.optim._base)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from lowbit.optim._base import LowbitOptimizer

__all__ = [
    "Adam", "AdamW", "StableAdamW", "SGD", "Lion", "RMSprop", "Adagrad", "LAMB", "LARS",
    "Adam8bit", "AdamW8bit", "StableAdamW8bit", "SGD8bit", "Lion8bit", "RMSprop8bit",
    "Adagrad8bit", "LAMB8bit", "LARS8bit",
]


def _check(name: str, value: float, lo: float, hi: float, hi_open: bool = True) -> None:
    ok = lo <= value < hi if hi_open else lo <= value <= hi
    if not ok:
        close = ")" if hi_open else "]"
        raise ValueError(f"invalid {name}: {value!r} (expected [{lo}, {hi}{close})")


def _lr(lr: Any) -> None:
    if isinstance(lr, (int, float)) and lr < 0.0:
        raise ValueError(f"invalid learning rate: {lr!r}")


_common = dict(bits=32, block_size=256, min_8bit_size=4096, stochastic_rounding=False, seed=None,
               percentile_clipping=100, master_weights=None)


class _AdamFamily(LowbitOptimizer):
    # max_exp_avg_sq: the running maximum of exp_avg_sq that amsgrad keeps (Adam, AdamW).
    _states = (("exp_avg", True), ("exp_avg_sq", False), ("max_exp_avg_sq", False))

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, maximize: bool, group_keys: dict[str, Any],
                 **kw: Any) -> None:
        """group_keys: the member's own param group keys (Adam's and AdamW's amsgrad)."""
        _lr(lr)
        _check("beta parameter at index 0", betas[0], 0.0, 1.0)
        _check("beta parameter at index 1", betas[1], 0.0, 1.0)
        if eps < 0.0:
            raise ValueError(f"invalid epsilon value: {eps!r}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay value: {weight_decay!r}")
        cfg = dict(_common, **kw)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        maximize=maximize, **group_keys)
        super().__init__(params, defaults, **cfg)

    def _group_states(self, g: dict[str, Any]) -> tuple[tuple[str, bool], ...]:
        return self._states if g.get("amsgrad", False) else self._states[:2]

    def _hparams(self, g: dict[str, Any]) -> dict[str, Any]:
        return dict(lr=float(g["lr"]), beta1=g["betas"][0], beta2=g["betas"][1], eps=g["eps"],
                    weight_decay=g["weight_decay"], maximize=g["maximize"],
                    amsgrad=bool(g.get("amsgrad", False)))


class Adam(_AdamFamily):
    """torch.optim.Adam (L2 weight decay through the gradient) with 32- or 8-bit states;
    ``amsgrad=True`` keeps the running maximum of exp_avg_sq (``max_exp_avg_sq``) and divides by
    its square root, as torch's."""

    _kernel = "adam"

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 **kw: Any) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, maximize,
                         dict(amsgrad=bool(amsgrad)), **kw)


class AdamW(_AdamFamily):
    """torch.optim.AdamW (decoupled weight decay) with 32- or 8-bit states; ``amsgrad`` as
    :class:`Adam`'s."""

    _kernel = "adamw"

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 **kw: Any) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, maximize,
                         dict(amsgrad=bool(amsgrad)), **kw)


class StableAdamW(_AdamFamily):
    """StableAdamW (Wortsman et al. 2023, Algorithm 2): AdamW with debiased betas and the step
    of each tensor divided by max(1, RMS), RMS = sqrt(mean(g^2 / max(v_t, eps^2))) over the
    tensor (computed in the same call, before any parameter is written)."""

    _kernel = "stable_adamw"

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-6,
                 weight_decay: float = 1e-2, *, maximize: bool = False, **kw: Any) -> None:
        if eps <= 0.0:
            raise ValueError(f"invalid epsilon value: {eps!r} (StableAdamW needs eps > 0)")
        super().__init__(params, lr, betas, eps, weight_decay, maximize, {}, **kw)


class SGD(LowbitOptimizer):
    """torch.optim.SGD (momentum, dampening, Nesterov, L2 weight decay) with a 32- or 8-bit
    momentum buffer (none without momentum)."""

    _kernel = "sgd"
    _states = (("momentum_buffer", True),)

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *,
                 maximize: bool = False, **kw: Any) -> None:
        _lr(lr)
        _check("momentum value", momentum, 0.0, 1.0)
        _check("dampening value", dampening, 0.0, 1.0, hi_open=False)
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay value: {weight_decay!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        cfg = dict(_common, **kw)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize), **cfg)

    def _group_states(self, g: dict[str, Any]) -> tuple[tuple[str, bool], ...]:
        return self._states if g["momentum"] != 0 else ()

    def _hparams(self, g: dict[str, Any]) -> dict[str, Any]:
        return dict(lr=float(g["lr"]), momentum=g["momentum"], dampening=g["dampening"],
                    weight_decay=g["weight_decay"], nesterov=g["nesterov"],
                    maximize=g["maximize"])


class Lion(LowbitOptimizer):
    """Lion (Chen et al. 2023): p -= lr (sign(b1 m + (1-b1) g) + wd p); m = b2 m + (1-b2) g."""

    _kernel = "lion"
    _states = (("exp_avg", True),)

    def __init__(self, params: Iterable[Any], lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0, *,
                 maximize: bool = False, **kw: Any) -> None:
        _lr(lr)
        _check("beta parameter at index 0", betas[0], 0.0, 1.0)
        _check("beta parameter at index 1", betas[1], 0.0, 1.0)
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay value: {weight_decay!r}")
        cfg = dict(_common, **kw)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                                      maximize=maximize), **cfg)

    def _hparams(self, g: dict[str, Any]) -> dict[str, Any]:
        return dict(lr=float(g["lr"]), beta1=g["betas"][0], beta2=g["betas"][1],
                    weight_decay=g["weight_decay"], maximize=g["maximize"])


class RMSprop(LowbitOptimizer):
    """torch.optim.RMSprop (L2 weight decay, momentum, centered) with 32- or 8-bit states: the
    square average, plus the momentum buffer (momentum > 0) and the gradient's average
    (centered), each where its option is on (three states with both). The centered variance
    v - s^2 is clamped at 0 before its square root (torch's would be NaN where rounding or 8-bit
    states make it negative)."""

    _kernel = "rmsprop"
    _states = (("square_avg", False), ("momentum_buffer", True), ("grad_avg", True))

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.0,
                 centered: bool = False, *, maximize: bool = False, **kw: Any) -> None:
        _lr(lr)
        _check("alpha value", alpha, 0.0, 1.0)
        _check("momentum value", momentum, 0.0, 1.0)
        if eps < 0.0:
            raise ValueError(f"invalid epsilon value: {eps!r}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay value: {weight_decay!r}")
        cfg = dict(_common, **kw)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=bool(centered),
                                      maximize=maximize), **cfg)

    def _group_states(self, g: dict[str, Any]) -> tuple[tuple[str, bool], ...]:
        # torch's order, the kernel's: square_avg, then momentum_buffer, then grad_avg.
        keep = {"square_avg": True, "momentum_buffer": g.get("momentum", 0.0) != 0.0,
                "grad_avg": bool(g.get("centered", False))}
        return tuple(s for s in self._states if keep[s[0]])

    def _hparams(self, g: dict[str, Any]) -> dict[str, Any]:
        return dict(lr=float(g["lr"]), beta2=g["alpha"], eps=g["eps"],
                    weight_decay=g["weight_decay"], momentum=g.get("momentum", 0.0),
                    centered=bool(g.get("centered", False)), maximize=g["maximize"])


class Adagrad(LowbitOptimizer):
    """torch.optim.Adagrad with a 32- or 8-bit sum of squares."""

    _kernel = "adagrad"
    _states = (("sum", False),)

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, *, maximize: bool = False, **kw: Any) -> None:
        _lr(lr)
        if lr_decay < 0 or initial_accumulator_value < 0 or weight_decay < 0:
            raise ValueError("lr_decay, weight_decay and initial_accumulator_value must be >= 0")
        if eps < 0.0:
            raise ValueError(f"invalid epsilon value: {eps!r}")
        cfg = dict(_common, **kw)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps, maximize=maximize), **cfg)

    def _initial_value(self, g: dict[str, Any], name: str) -> float:
        return float(g["initial_accumulator_value"])

    def _hparams(self, g: dict[str, Any]) -> dict[str, Any]:
        return dict(lr=float(g["lr"]), lr_decay=g["lr_decay"], eps=g["eps"],
                    weight_decay=g["weight_decay"], maximize=g["maximize"])


def _max_trust_ratio(value: Optional[float]) -> float:
    """The kernel's clamp of the trust ratio: None is no clamp (infinity)."""
    if value is None:
        return float("inf")
    if not float(value) > 0.0:
        raise ValueError(f"invalid max_trust_ratio: {value!r} (expected > 0, or None for no "
                         "clamp)")
    return float(value)


class LAMB(LowbitOptimizer):
    """LAMB (You et al., ICLR 2020, Algorithm 2 with the AdamW direction): m and v as Adam's,
    u = m_hat / (sqrt(v_hat) + eps) + weight_decay p (m_hat, v_hat bias-corrected unless
    ``bias_correction=False``), and per tensor p -= lr r u with the trust ratio
    r = min(||p|| / ||u||, max_trust_ratio) (1 where either norm is 0; ``max_trust_ratio=None``:
    no clamp). ``always_adapt=False`` takes r = 1 in param groups with weight_decay 0 (biases and
    norms, as NVIDIA apex's FusedLAMB and timm's Lamb do by default); the norms are over the whole
    tensor, computed in the same call before any parameter is written."""

    _kernel = "lamb"
    _states = (("exp_avg", True), ("exp_avg_sq", False))

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 1e-2, *, bias_correction: bool = True,
                 max_trust_ratio: Optional[float] = None, always_adapt: bool = True,
                 maximize: bool = False, **kw: Any) -> None:
        _lr(lr)
        _check("beta parameter at index 0", betas[0], 0.0, 1.0)
        _check("beta parameter at index 1", betas[1], 0.0, 1.0)
        if eps < 0.0:
            raise ValueError(f"invalid epsilon value: {eps!r}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay value: {weight_decay!r}")
        _max_trust_ratio(max_trust_ratio)
        cfg = dict(_common, **kw)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay,
                                      bias_correction=bool(bias_correction),
                                      max_trust_ratio=max_trust_ratio,
                                      always_adapt=bool(always_adapt), maximize=maximize), **cfg)

    def _hparams(self, g: dict[str, Any]) -> dict[str, Any]:
        return dict(lr=float(g["lr"]), beta1=g["betas"][0], beta2=g["betas"][1], eps=g["eps"],
                    weight_decay=g["weight_decay"], maximize=g["maximize"],
                    max_trust_ratio=_max_trust_ratio(g["max_trust_ratio"]),
                    adapt=bool(g["always_adapt"] or g["weight_decay"] != 0),
                    bias_correction=bool(g["bias_correction"]))


class LARS(LowbitOptimizer):
    """LARS (You, Gitman, Ginsburg 2017) over torch's SGD: per tensor the local learning rate
    r = min(trust_coefficient ||p|| / (||g|| + weight_decay ||p|| + eps), max_trust_ratio) (1
    where either norm is 0), the gradient g' = (g + weight_decay p) r, then SGD's momentum,
    dampening and Nesterov on g' and p -= lr g' (timm's Lars without trust_clip). A 32- or 8-bit
    momentum buffer (none without momentum). ``always_adapt=False`` takes r = 1 in param groups
    with weight_decay 0."""

    _kernel = "lars"
    _states = (("momentum_buffer", True),)

    def __init__(self, params: Iterable[Any], lr: float = 1.0, momentum: float = 0.9,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 trust_coefficient: float = 1e-3, eps: float = 1e-8, *,
                 max_trust_ratio: Optional[float] = None, always_adapt: bool = True,
                 maximize: bool = False, **kw: Any) -> None:
        _lr(lr)
        _check("momentum value", momentum, 0.0, 1.0)
        _check("dampening value", dampening, 0.0, 1.0, hi_open=False)
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay value: {weight_decay!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if not trust_coefficient > 0.0:
            raise ValueError(f"invalid trust_coefficient: {trust_coefficient!r} (expected > 0)")
        if eps < 0.0:
            raise ValueError(f"invalid epsilon value: {eps!r}")
        _max_trust_ratio(max_trust_ratio)
        cfg = dict(_common, **kw)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      trust_coefficient=trust_coefficient, eps=eps,
                                      max_trust_ratio=max_trust_ratio,
                                      always_adapt=bool(always_adapt), maximize=maximize), **cfg)

    def _group_states(self, g: dict[str, Any]) -> tuple[tuple[str, bool], ...]:
        return self._states if g["momentum"] != 0 else ()

    def _hparams(self, g: dict[str, Any]) -> dict[str, Any]:
        return dict(lr=float(g["lr"]), momentum=g["momentum"], dampening=g["dampening"],
                    weight_decay=g["weight_decay"], nesterov=g["nesterov"], eps=g["eps"],
                    maximize=g["maximize"], trust_coefficient=g["trust_coefficient"],
                    max_trust_ratio=_max_trust_ratio(g["max_trust_ratio"]),
                    adapt=bool(g["always_adapt"] or g["weight_decay"] != 0))


def _eight_bit(base: type) -> type:
    def __init__(self: Any, params: Iterable[Any], *args: Any, bits: int = 8,
                 **kw: Any) -> None:
        base.__init__(self, params, *args, bits=bits, **kw)

    name = base.__name__ + "8bit"
    return type(name, (base,), {
        "__init__": __init__,
        "__doc__": f"{base.__name__} with 8-bit block-wise states by default (bits=8).",
        "__module__": __name__,
        "__qualname__": name,
    })


Adam8bit = _eight_bit(Adam)
AdamW8bit = _eight_bit(AdamW)
StableAdamW8bit = _eight_bit(StableAdamW)
SGD8bit = _eight_bit(SGD)
Lion8bit = _eight_bit(Lion)
RMSprop8bit = _eight_bit(RMSprop)
Adagrad8bit = _eight_bit(Adagrad)
LAMB8bit = _eight_bit(LAMB)
LARS8bit = _eight_bit(LARS)
