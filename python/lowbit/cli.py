"""The `lowbit` command line.

Each subcommand is a function that adds its parser to the subparsers and sets `run` to the
function that carries it out (returning the exit status); new subcommands join _COMMANDS.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import lowbit
from lowbit._api import FormatInfo, format_info

# ---- lowbit formats ----------------------------------------------------------------------------

FORMATS_INTRO = """\
# Number formats

Every named format of lowbit, with its layout and range. A format is (exponent bits, mantissa
bits, bias, specials, signed, has zero); [rounding.md](rounding.md) defines the value of each
code and how real numbers round to codes. Other formats are named
`e<E>m<M>[b<bias>][_ieee|_fn|_fnuz|_none][_unsigned][_nozero]` (the bias defaults to
2^(E-1)-1) or built with `lowbit.Format(exp_bits, man_bits, ...)` in Python.

The NaN and Inf columns list every code (hexadecimal, sign bit included) that decodes to NaN or
to an infinity. Conversions produce only the all-ones NaN (0x80 for fnuz), signed like the input
unless `nan_sign="positive"`; formats without NaN (the OCP MX FP6 and FP4 types) turn NaN into
+0. "min subnormal" is the smallest positive value, a normal one where the format has no
subnormals (E8M0).

This page is the output of `lowbit formats --markdown`; a test keeps the two identical."""


def _power_of_two(v: float) -> str:
    mantissa, exponent = math.frexp(v)
    if mantissa == 0.5:
        return f"2^{exponent - 1}"
    return repr(v)


def _number(v: float) -> str:
    # Integers print exactly while they are short; beyond that repr() is still exact (it
    # round-trips) and stays readable.
    if v.is_integer() and abs(v) < 1e9:
        return str(int(v))
    return repr(v)


def _codes(ranges: Sequence[tuple[int, int]], bits: int) -> str:
    if not ranges:
        return "none"
    digits = (bits + 3) // 4
    parts = []
    for first, last in ranges:
        text = f"0x{first:0{digits}X}"
        if last != first:
            text += f"-0x{last:0{digits}X}"
        parts.append(text)
    return ", ".join(parts)


_HEADERS = ("name", "bits", "exp", "man", "bias", "max", "min normal", "min subnormal", "NaN",
            "Inf", "spec")
# Right-aligned (numeric) columns.
_NUMERIC = {"bits", "exp", "man", "bias", "max", "min normal", "min subnormal"}


def _row(info: FormatInfo) -> tuple[str, ...]:
    return (
        info.name,
        str(info.bits),
        str(info.exp_bits),
        str(info.man_bits),
        str(info.bias),
        _number(info.max),
        _power_of_two(info.min_normal),
        _power_of_two(info.min_subnormal),
        _codes(info.nan_ranges, info.bits),
        _codes(info.inf_ranges, info.bits),
        info.spec or "",
    )


def formats_table(markdown: bool = False) -> str:
    """The table printed by `lowbit formats` (with --markdown: the text of docs/formats.md)."""
    rows = [_row(format_info(name)) for name in lowbit.formats()]
    if markdown:
        lines = [FORMATS_INTRO, ""]
        lines.append("| " + " | ".join(_HEADERS) + " |")
        lines.append("|" + "|".join("---:" if h in _NUMERIC else "---" for h in _HEADERS) + "|")
        for row in rows:
            cells = (f"`{row[0]}`",) + row[1:]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_HEADERS)]

    def line(cells: Sequence[str]) -> str:
        out = []
        for h, w, c in zip(_HEADERS, widths, cells):
            out.append(c.rjust(w) if h in _NUMERIC else c.ljust(w))
        return "  ".join(out).rstrip()

    lines = [line(_HEADERS), line(["-" * w for w in widths])]
    lines += [line(r) for r in rows]
    return "\n".join(lines) + "\n"


def _run_formats(args: argparse.Namespace, out: TextIO) -> int:
    out.write(formats_table(markdown=args.markdown))
    return 0


def _add_formats(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "formats",
        help="list the named number formats",
        description="Print every named format: widths, bias, range, NaN and Inf codes, spec.",
    )
    p.add_argument("--markdown", action="store_true",
                   help="print the Markdown page committed as docs/formats.md")
    p.set_defaults(run=_run_formats)


# ---- lowbit report -----------------------------------------------------------------------------


def _size(text: str) -> int:
    value = int(text)
    if value < 16:
        raise argparse.ArgumentTypeError(f"expected an integer >= 16, got {text}")
    return value


def _threads(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 (all cores) or a positive count, got {text}")
    return value


def _run_report(args: argparse.Namespace, out: TextIO) -> int:
    # Imported here: `lowbit formats` should not pay for the report's imports.
    from lowbit import report

    report.run_report(report.Options(out=args.out, quick=args.quick, threads=args.threads,
                                     size=args.size, json=args.json), out)
    return 0


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="measure error and speed of every format on synthetic workloads",
        description="Cast built-in synthetic workloads (gaussian, heavy-tailed, outliers) to "
                    "every format under every rounding mode; print error statistics and CPU "
                    "throughput (against ml_dtypes, measured in the same run), write JSON and "
                    "PNG plots. docs/report.md explains every number.",
    )
    p.add_argument("--out", type=Path, default=Path("out/report"), metavar="DIR",
                   help="directory for the plots and report.json (default: out/report)")
    p.add_argument("--quick", action="store_true",
                   help="2^18 values, formats e4m3fn e5m2 e2m1fn bfloat16 float16, roundings "
                        "nearest_even toward_zero stochastic")
    p.add_argument("--threads", type=_threads, default=0, metavar="N",
                   help="CPU threads of the casts and of the multi-threaded throughput column "
                        "(default 0: all cores)")
    p.add_argument("--size", type=_size, default=None, metavar="N",
                   help="values per workload (default 2^22, 2^18 with --quick)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="where to write the JSON report (default: DIR/report.json)")
    p.set_defaults(run=_run_report)


# ---- entry point -------------------------------------------------------------------------------

_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_formats, _add_report]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lowbit",
        description="Bit-exact low-precision numerics: formats, casts, reports.",
    )
    parser.add_argument("--version", action="version", version=f"lowbit {lowbit.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the command line; returns the exit status (argparse exits with 2 on usage errors)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args, out if out is not None else sys.stdout)
    except BrokenPipeError:
        # `lowbit formats | head` closes the pipe early. Point stdout at /dev/null so that the
        # interpreter's final flush does not raise again (the recipe of the Python docs).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
