"""The small-model training comparison shared by `lowbit report` and bench/train_tiny.py: a
small ViT trained on synthetic images, once per low-precision configuration of its linear layers,
with the same seed, data and schedule for every configuration, so that the loss curves differ only
by the layers' numerics. Needs PyTorch (imported by this module; `import lowbit` does not).

The data: 10 classes, each a fixed random 32x32x3 template; a sample is its class's template,
shifted by up to 2 pixels, scaled by a random amplitude, plus Gaussian noise. The model: patches
of 4x4, `width`, `depth` blocks of `heads` heads, MLP ratio 4, a linear head. The attention and
MLP projections (inside blocks.*) are the nn.Linear modules that a configuration converts; the
patch embedding and the head stay as they are, as the SwitchBack paper keeps them.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

# name -> keyword arguments of lowbit.nn.convert (None: the model as it is, nn.Linear).
CONFIGS = {
    "nn_linear": None,
    "switchback_int8": dict(variant="switchback", fmt="int8"),
    "switchback_fp8": dict(variant="switchback", fmt="fp8", backend="automatic"),
    "switchback_fp8_emulated": dict(variant="switchback", fmt="fp8", backend="widened"),
    "tensorwise_fp8": dict(variant="tensorwise", fmt="fp8"),
    "fp8_tensorwise_delayed": dict(recipe="fp8_tensorwise_delayed"),
    "hopper_emulated": dict(recipe="hopper_emulated"),
}


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp)
        self.fc2 = nn.Linear(mlp, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                       v.transpose(1, 2))
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    def __init__(self, width: int = 384, depth: int = 6, heads: int = 6, classes: int = 10,
                 patch: int = 4, image: int = 32) -> None:
        super().__init__()
        self.patch = patch
        tokens = (image // patch) ** 2
        self.embed = nn.Linear(3 * patch * patch, width)
        self.pos = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads, 4 * width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        b, c, h, w = img.shape
        p = self.patch
        x = img.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)
        x = self.embed(x) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(1))


def make_data(steps: int, batch: int, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 3, 32, 32, generator=g)
    for _ in range(steps):
        y = torch.randint(0, 10, (batch,), generator=g)
        shift = torch.randint(-2, 3, (2,), generator=g).tolist()
        amp = torch.rand(batch, 1, 1, 1, generator=g) * 1.5 + 0.25
        x = torch.roll(templates[y], shifts=shift, dims=(2, 3)) * amp
        x = x + torch.randn(x.shape, generator=g)
        yield x.to(device), y.to(device)


def only_blocks(name: str, module: nn.Module) -> bool:
    return name.startswith("blocks.")


def train(config: str | dict, steps: int, batch: int, device: str, seed: int = 0,
          width: int = 384, depth: int = 6, heads: int = 6, autocast: bool | None = None,
          lr: float = 1e-3, mesa: dict | None = None) -> dict:
    """Trains one configuration (AdamW, warm-up then cosine; under bfloat16 autocast when
    `autocast`, by default on CUDA only: CPUs without bf16 units run it far slower than float32);
    returns the loss of every step, the final loss (mean of the last 20 steps) and the seconds
    per step. `config` is a name of CONFIGS or lowbit.nn.convert's keyword arguments. `mesa`:
    keywords of lowbit.nn.mesa.convert, applied to the blocks after the configuration's
    conversion (8-bit saved activations)."""
    torch.manual_seed(seed)
    model = TinyViT(width=width, depth=depth, heads=heads).to(device)
    kwargs = CONFIGS[config] if isinstance(config, str) else config
    if kwargs is not None:
        import lowbit.nn as lnn

        lnn.convert(model, filter=only_blocks, **kwargs)
    if mesa is not None:
        import lowbit.nn.mesa as lmesa

        lmesa.convert(model, filter=only_blocks, **mesa)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    warmup = max(1, min(30, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    losses = []
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    if autocast is None:
        autocast = dev_type == "cuda"
    t0 = time.perf_counter()
    for x, y in make_data(steps, batch, seed + 1, device):
        with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            break
    if dev_type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / max(1, len(losses))
    tail = losses[-20:]
    return {"losses": losses, "final": sum(tail) / len(tail), "s_per_step": dt}


def draw_losses(ax, results: dict, title: str) -> None:
    """The loss curves of train()'s results ({name: result}) on one matplotlib Axes."""
    for name, r in results.items():
        ax.plot(r["losses"], label=f"{name} (final {r['final']:.4f})", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
