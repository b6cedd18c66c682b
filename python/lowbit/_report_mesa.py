"""The report's section on Mesa (lowbit.nn.mesa, 8-bit saved activations with running per-head
estimates), on the CPU: the error of dequantize(quantize(x)) per tensor and per head on head-wise
scaled workloads, the bytes one ViT block keeps for backward with and without Mesa, the error of
the gradients of lowbit._tiny's ViT against its full-precision backward, the CPU time of a block's
forward + backward, and (unless left out) a short training comparison. Needs PyTorch: without it
the section says so and measures nothing.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from lowbit.report import median_time

HEADS, TOKENS, HEAD_DIM = 8, 64, 16
WIDTH, DEPTH, BLOCK_HEADS, BATCH = 64, 2, 4, 16
TRAIN_STEPS, TRAIN_BATCH, TRAIN_LR = 60, 32, 3e-3


def _round_trip_rows(workloads: list[tuple[str, np.ndarray]]) -> list[dict[str, Any]]:
    import torch

    from lowbit import _torch_ops as ops

    rows = []
    n = HEADS * TOKENS * HEAD_DIM
    # Heads of different ranges (x 2^-3 .. 2^4), as attention heads' activations are.
    scale = torch.tensor([2.0 ** (k - 3) for k in range(HEADS)]).view(1, HEADS, 1, 1)
    for name, values in workloads:
        v = np.resize(values, n).astype(np.float32)
        x = torch.from_numpy(v).view(1, HEADS, TOKENS, HEAD_DIM) * scale
        for label, groups in (("per tensor", 1), ("per head", HEADS)):
            a, b = torch.full((groups,), -1.0), torch.zeros(groups)
            gs = HEADS // groups
            codes = ops._actquant_quantize(x, a, b, 1, gs, True, False, 0.0, False, 0, 0, 0)
            xd = ops._actquant_dequantize(codes, a, b, 1, gs, torch.float32)
            finite = torch.isfinite(x)
            err = (xd - x)[finite].double()
            ref = x[finite].double()
            per_head = []
            for h in range(HEADS):
                m = finite[0, h]
                e, r = (xd - x)[0, h][m].double(), x[0, h][m].double()
                per_head.append((e.norm() / r.norm()).item() if r.norm() > 0 else 0.0)
            alpha = a.repeat_interleave(gs).view(1, HEADS, 1, 1).expand_as(x)[finite]
            rows.append({"kind": "round_trip", "workload": name, "grouping": label,
                         "rel_err": (err.norm() / ref.norm()).item(),
                         "worst_head_rel_err": max(per_head),
                         "max_err_over_alpha": (err.abs() / alpha.double()).max().item()})
    return rows


def _model_rows(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    import lowbit.nn.mesa as mesa
    from lowbit import _tiny

    rows: list[dict[str, Any]] = []
    torch.manual_seed(0)
    base = _tiny.TinyViT(width=WIDTH, depth=DEPTH, heads=BLOCK_HEADS)
    x, y = next(_tiny.make_data(1, BATCH, 0, "cpu"))
    base.zero_grad()
    torch.nn.functional.cross_entropy(base(x), y).backward()
    ref_grads = [p.grad.clone() for p in base.parameters()]
    tokens = torch.randn(BATCH // 2 if quick else BATCH, 64, WIDTH, requires_grad=True)
    blk0 = base.blocks[0]
    native_bytes = mesa.saved_bytes(lambda: blk0(tokens), exclude=blk0)
    runs = 1 if quick else 7

    def ms(block) -> float:
        def step() -> None:
            tokens.grad = None
            block(tokens).sum().backward()

        return 1e3 * median_time(step, runs)

    native_ms = ms(blk0)
    # (core, rounding, the MLP fused into one MesaMlp)
    configs = [(core, rounding, False) for core in ("explicit", "sdpa")
               for rounding in ("nearest_even", "stochastic")] + [("sdpa", "nearest_even", True)]
    for core, rounding, mlp in configs:
        model = copy.deepcopy(base)
        mesa.convert(model, core=core, rounding=rounding, filter=_tiny.only_blocks,
                     layers=("attention", "mlp") if mlp else ("attention",))
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        num = sum(((p.grad - g) ** 2).sum() for p, g in zip(model.parameters(), ref_grads))
        den = sum((g ** 2).sum() for g in ref_grads)
        blk = model.blocks[0]
        row = {"kind": "model", "core": core, "rounding": rounding,
               "mlp": "fused" if mlp else "modules",
               "grad_rel_err": float((num / den).sqrt()),
               "saved_bytes": mesa.saved_bytes(lambda: blk(tokens), exclude=blk),
               "native_bytes": native_bytes}
        row["saved_fraction"] = 1 - row["saved_bytes"] / native_bytes
        if rounding == "nearest_even":
            row["cpu_ms"] = ms(blk)
            row["vs_native"] = native_ms / row["cpu_ms"]
        else:
            row["cpu_ms"] = row["vs_native"] = None
        rows.append(row)
    return rows, {"native_ms": native_ms, "native_bytes": native_bytes,
                  "tokens": tokens.shape[0]}


def section(ctx: Any) -> Any:
    from lowbit.report import Column, Plot, SectionResult, _ratio, _sci, render_table

    try:
        import torch
    except ImportError:
        note = "skipped: PyTorch is not installed (pip install torch), which lowbit.nn.mesa needs"
        return SectionResult(rows=[], text=f"note: {note}", notes=[note])
    if ctx.threads:
        torch.set_num_threads(ctx.threads)
    rt = _round_trip_rows([(w.name, w.values) for w in ctx.workloads])
    ctx.progress("  mesa round trips measured")
    model_rows, info = _model_rows(ctx.quick)
    ctx.progress("  mesa on the tiny ViT measured")
    rt_columns = [
        Column("workload", lambda r: r["workload"], left=True),
        Column("grouping", lambda r: r["grouping"], left=True),
        Column("rel err", lambda r: _sci(r["rel_err"])),
        Column("worst head rel err", lambda r: _sci(r["worst_head_rel_err"])),
        Column("max |err| / alpha", lambda r: f"{r['max_err_over_alpha']:.4f}"),
    ]
    m_columns = [
        Column("core", lambda r: r["core"], left=True),
        Column("rounding", lambda r: r["rounding"], left=True),
        Column("MLP", lambda r: r["mlp"], left=True),
        Column("grad rel err", lambda r: _sci(r["grad_rel_err"])),
        Column("saved KiB", lambda r: f"{r['saved_bytes'] / 1024:.1f}"),
        Column("native KiB", lambda r: f"{r['native_bytes'] / 1024:.1f}"),
        Column("saved", lambda r: f"{100 * r['saved_fraction']:.1f}%"),
        Column("CPU ms", lambda r: "-" if r["cpu_ms"] is None else f"{r['cpu_ms']:.1f}"),
        Column("native/this", lambda r: _ratio(r["vs_native"])),
    ]
    train: dict[str, Any] = {}
    if ctx.training:
        from lowbit import _tiny

        kw = dict(width=WIDTH, depth=DEPTH, heads=2, lr=TRAIN_LR)
        train = {"float32": _tiny.train("nn_linear", TRAIN_STEPS, TRAIN_BATCH, "cpu", 0, **kw),
                 "mesa": _tiny.train("nn_linear", TRAIN_STEPS, TRAIN_BATCH, "cpu", 0, mesa={},
                                     **kw),
                 "mesa, fused MLP": _tiny.train("nn_linear", TRAIN_STEPS, TRAIN_BATCH, "cpu", 0,
                                                mesa={"layers": ("attention", "mlp")}, **kw)}
        ctx.progress(f"  mesa training comparison ({TRAIN_STEPS} steps on the CPU) done")
    train_rows = [{"kind": "training", "config": k, "final_loss": v["final"],
                   "vs_float32": v["final"] / train["float32"]["final"],
                   "s_per_step": v["s_per_step"]} for k, v in train.items()]
    train_columns = [
        Column("configuration", lambda r: r["config"], left=True),
        Column("final loss", lambda r: f"{r['final_loss']:.4f}"),
        Column("vs float32", lambda r: f"{r['vs_float32']:.4f}"),
        Column("s/step", lambda r: f"{r['s_per_step']:.3f}"),
    ]
    notes = [
        f"round trips: dequantize(quantize(x)) of x [1, {HEADS} heads, {TOKENS}, {HEAD_DIM}] "
        f"(each workload's first values, head h scaled by 2^(h-3)), estimates from this batch "
        "alone (momentum 0), nearest-even; rel err = relative Frobenius error over the finite "
        "values; the rule gives max |err| / alpha <= 1/2 plus float32 roundings",
        f"model: lowbit._tiny's ViT ({DEPTH} blocks, width {WIDTH}, {BLOCK_HEADS} heads), one "
        f"batch of {BATCH}; grad rel err = relative Frobenius error of all parameter gradients "
        "against the same model's full-precision backward (float32); saved/native KiB: bytes "
        "one block keeps for backward (parameters left out); CPU ms: median forward + backward "
        f"of one block on [{info['tokens']}, 64, {WIDTH}] tokens (native {info['native_ms']:.1f} ms)"
        "; MLP fused: one MesaMlp (x and h kept, fc2's input recomputed from h), modules: a "
        "quantizer per module",
    ]
    if train:
        notes.append(f"training: the same ViT, {TRAIN_STEPS} steps of batch {TRAIN_BATCH} on the "
                     f"CPU in float32 (AdamW, lr {TRAIN_LR}), with and without Mesa (its blocks "
                     "converted); final loss = mean of the last 20 steps")
    else:
        notes.append("training comparison left out (--quick or --no-training)")

    def draw(fig: Any) -> None:
        from lowbit._tiny import draw_losses

        draw_losses(fig.add_subplot(1, 1, 1), train,
                    f"Mesa training comparison on the CPU ({TRAIN_STEPS} steps)")

    lines = [f"note: {n}" for n in notes] + [""] + render_table(rt_columns, rt) + [""] + \
        render_table(m_columns, model_rows)
    if train_rows:
        lines += [""] + render_table(train_columns, train_rows)
    plots = [Plot("mesa_training.png", draw, (7.0, 4.0))] if train else []
    return SectionResult(rows=rt + model_rows + train_rows, text="\n".join(lines), notes=notes,
                         plots=plots)
