"""The fp8 matmuls of a training step, replayed to locate where lowbit's model of the GPU's fp8
GEMM departs from the GPU: in the sum (the accumulation model) or in the epilogue (the scales,
the bias and the output rounding).

    python bench/probes/fp8_layer_replay.py --out DIR [--granularity tensorwise]
        [--scaling delayed] [--steps 1] [--batch 32] [--limit 72] [--rows 64]

Runs lowbit._tiny's ViT for --steps steps with an fp8 recipe on the native backend (cuBLASLt)
and records its first --limit fp8 matmuls (codes, scales, bias, output). Each is then run four
ways: as recorded (native), natively with unit scales, no bias and a float32 output (the
hardware's sum), under the accumulation model (simt) the same two ways. Per matmul, DIR/
replay.json counts the outputs where

- the model's sum differs from the hardware's (`sum_mismatches`);
- each candidate epilogue, fed the hardware's sum, differs from the native output
  (`epilogue_mismatches`: the float32 operations in the order each candidate names);
- lowbit's full model (its sum and epilogue) differs from the native output.

DIR/replay_sum.jsonl holds up to --rows of each matmul's rows whose sums differ, and as many
whose sums agree, as lines of fp8_accum_probe's format (family "layer_differ" or "layer_agree",
one dot product: row m of A, row n of B, the hardware's float32 sum), so that
lowbit_fit_accumulation refits the model against them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

import lowbit.nn as lnn  # noqa: E402
from lowbit import _tiny  # noqa: E402
from lowbit import _torch_ops as ops  # noqa: E402

# Recorded scaled_mm arguments: a, a_scales, a_fmt, b, b_scales, b_fmt, bias, out_dtype,
# backend, accumulation, a_block, b_block.
A, SA, AF, B, SB, BF, BIAS, DTYPE, BACKEND, ACC = range(10)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def r32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32, nearest even: one float32 operation's rounding."""
    return x.to(torch.float32).to(torch.float64)


def epilogues(acc: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
              bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Candidate epilogues on a float32 sum acc [M, N], in float64 with each float32 operation
    rounded: sa broadcasts over rows ([M, 1] or [1, 1]), sb over columns ([1, N] or [1, 1])."""
    acc = acc.to(torch.float64)
    sa = sa.to(torch.float64)
    sb = sb.to(torch.float64)
    b = 0.0 if bias is None else bias.to(torch.float64).reshape(1, -1)
    s = r32(sa * sb)
    out = {
        "((acc*sa)*sb)+bias": r32(r32(r32(acc * sa) * sb) + b),
        "(acc*(sa*sb))+bias": r32(r32(acc * s) + b),
        "fma(acc,sa*sb,bias)": r32(acc * s + b),
        "fma(acc*sa,sb,bias)": r32(r32(acc * sa) * sb + b),
        "((acc*sb)*sa)+bias": r32(r32(r32(acc * sb) * sa) + b),
        "fma(acc*sb,sa,bias)": r32(r32(acc * sb) * sa + b),
    }
    return {k: v.to(torch.float32) for k, v in out.items()}


def hexcodes(row: torch.Tensor) -> str:
    return row.to(torch.uint8).numpy().tobytes().hex()


def probe_lines(a: torch.Tensor, b: torch.Tensor, hw: torch.Tensor, rows: torch.Tensor,
                family: str, a_fmt: str, b_fmt: str, fast: bool) -> list[str]:
    k = a.shape[1]
    hb = bits(hw)
    out = []
    for m, n in rows.tolist():
        out.append(json.dumps({"fast": fast, "K": k, "family": family, "gap": 0, "pos": m,
                               "len": k, "a": hexcodes(a[m]), "b": hexcodes(b[n]),
                               "a_fmt": a_fmt, "b_fmt": b_fmt,
                               "result_bits": int(hb[m, n]) & 0xFFFFFFFF,
                               "result": float(hw[m, n])}))
    return out


def replay(args: tuple, native: torch.Tensor, spec: str, rows: int, gen: torch.Generator,
           dev: str = "cuda", model_backend: str = "simt") -> tuple[dict, list[str]]:
    args = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in args]
    a, b = args[A], args[B]
    m, k = a.shape
    n = b.shape[0]
    unit = list(args)
    unit[SA] = torch.ones_like(args[SA])
    unit[SB] = torch.ones_like(args[SB])
    unit[BIAS] = None
    unit[DTYPE] = torch.float32
    hw = ops.EAGER["scaled_mm"](*unit).cpu()  # the native backend's float32 sum
    again = ops.EAGER["scaled_mm"](*args).cpu()
    modeled = list(unit)
    modeled[BACKEND], modeled[ACC] = model_backend, spec
    model_sum = ops.EAGER["scaled_mm"](*modeled).cpu()
    full = list(args)
    full[BACKEND], full[ACC] = model_backend, spec
    model_full = ops.EAGER["scaled_mm"](*full).cpu()
    sa, sb = args[SA].float().cpu(), args[SB].float().cpu()
    sa = sa.reshape(-1, 1) if sa.numel() > 1 else sa.reshape(1, 1)
    sb = sb.reshape(1, -1) if sb.numel() > 1 else sb.reshape(1, 1)
    bias = None if args[BIAS] is None else args[BIAS].float().cpu()
    nb = bits(native)
    cands = {name: int((bits(e.to(native.dtype)) != nb).sum())
             for name, e in epilogues(hw, sa, sb, bias).items()}
    differ = bits(hw) != bits(model_sum)
    info = {"M": m, "N": n, "K": k, "a_fmt": args[AF], "b_fmt": args[BF],
            "out": str(native.dtype).replace("torch.", ""), "bias": bias is not None,
            "scales": [int(args[SA].numel()), int(args[SB].numel())],
            "outputs": native.numel(),
            "native_deterministic": bool(torch.equal(bits(again), nb)),
            "sum_mismatches": int(differ.sum()),
            "model_mismatches": int((bits(model_full) != nb).sum()),
            "epilogue_mismatches": cands}
    ac, bc = args[A].cpu(), args[B].cpu()
    lines = []
    bad = differ.nonzero()
    if len(bad):
        lines += probe_lines(ac, bc, hw, bad[:rows], "layer_differ", args[AF], args[BF], False)
    pick = torch.stack([torch.randint(0, m, (rows,), generator=gen),
                        torch.randint(0, n, (rows,), generator=gen)], 1)
    ok = pick[~differ[pick[:, 0], pick[:, 1]]]
    lines += probe_lines(ac, bc, hw, ok, "layer_agree", args[AF], args[BF], False)
    return info, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--granularity", default="tensorwise")
    ap.add_argument("--scaling", default="delayed")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limit", type=int, default=72)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--accumulation", default=None)
    a = ap.parse_args(argv)
    torch.use_deterministic_algorithms(True, warn_only=True)
    spec = str(lnn.HOPPER if a.accumulation is None else a.accumulation)
    recipe = lnn.fp8_recipe(a.granularity, a.scaling, backend="cublaslt", name="fp8_native")
    calls: list[tuple[tuple, torch.Tensor]] = []
    orig = ops.EAGER["scaled_mm"]

    def record(*args):
        out = orig(*args)
        if len(calls) < a.limit:
            cpu = tuple(x.detach().cpu() if isinstance(x, torch.Tensor) else x for x in args)
            calls.append((cpu, out.detach().cpu()))
        return out

    ops.EAGER["scaled_mm"] = record
    try:
        _tiny.train(dict(recipe=recipe), a.steps, batch=a.batch, device="cuda", autocast=True)
    finally:
        ops.EAGER["scaled_mm"] = orig
    gen = torch.Generator().manual_seed(0)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    infos, lines = [], []
    for i, (args, native) in enumerate(calls):
        info, ls = replay(args, native, spec, a.rows, gen)
        info["call"] = i
        infos.append(info)
        lines += ls
        print(json.dumps(info), flush=True)
    totals = {"outputs": sum(x["outputs"] for x in infos),
              "sum_mismatches": sum(x["sum_mismatches"] for x in infos),
              "model_mismatches": sum(x["model_mismatches"] for x in infos),
              "epilogue_mismatches": {k: sum(x["epilogue_mismatches"][k] for x in infos)
                                      for k in infos[0]["epilogue_mismatches"]} if infos else {}}
    print("totals:", json.dumps(totals))
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "granularity": a.granularity, "scaling": a.scaling, "accumulation": spec}
    name = f"{a.granularity}_{a.scaling}"
    (out / f"replay_{name}.json").write_text(json.dumps({"meta": meta, "totals": totals,
                                                         "calls": infos}, indent=1))
    (out / f"replay_sum_{name}.jsonl").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
