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


# ---- lowbit verify -----------------------------------------------------------------------------


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {text}")
    return value


def _run_verify(args: argparse.Namespace, out: TextIO) -> int:
    import numpy as np

    from lowbit._verify import verify

    def load(path: Path) -> np.ndarray:
        return np.load(path, allow_pickle=False)

    try:
        report = verify(load(args.candidate), load(args.reference), args.policy,
                        format=args.format,
                        inputs=None if args.inputs is None else load(args.inputs),
                        input_format=args.input_format, worst=args.worst)
    except (OSError, ValueError, TypeError) as e:
        # Arrays or a policy that cannot be compared: a usage error, like argparse's (status 2).
        print(f"lowbit verify: error: {e}", file=sys.stderr)
        return 2
    out.write((report.to_json(indent=2) if args.json else str(report)) + "\n")
    return 0 if report.ok else 1


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="compare a candidate array against a reference (.npy files)",
        description="Compare CANDIDATE against REFERENCE (.npy files of the same shape) under a "
                    "policy and print the report (docs/verification.md). Exit status: 0 when "
                    "every element passes, 1 when some fail, 2 for usage errors (unreadable "
                    "files, shapes or dtypes that cannot be compared, a bad policy).",
    )
    p.add_argument("candidate", type=Path, help="the array under test (.npy)")
    p.add_argument("reference", type=Path, help="the expected array (.npy)")
    p.add_argument("--policy", default="exact", metavar="POLICY",
                   help="exact | exact:strict | ulp:N | atol:X | rtol:Y | atol:X,rtol:Y, "
                        "optionally @FORMAT (default: exact)")
    p.add_argument("--format", default=None, metavar="FORMAT",
                   help="the format of code arrays (uint8/16/32) and of the ulp grid, e.g. "
                        "e4m3fn (default: the candidate's dtype)")
    p.add_argument("--inputs", type=Path, default=None, metavar="FILE",
                   help="the inputs (.npy), shown beside the worst elements")
    p.add_argument("--input-format", default=None, metavar="FORMAT",
                   help="the format of code inputs")
    p.add_argument("--worst", type=_count, default=10, metavar="N",
                   help="how many of the worst elements to list (default 10)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=_run_verify)


# ---- lowbit cast / lowbit decode ---------------------------------------------------------------


def _format_arg(text: str) -> lowbit.Format:
    try:
        return lowbit.parse_format(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("fmt: ")) from None


def _uint64_arg(text: str) -> int:
    value = int(text, 0)
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected an integer in 0..2**64-1, got {text}")
    return value


def _convert_files(command: str, args: argparse.Namespace, convert: Callable) -> int:
    import numpy as np

    try:
        data = np.load(args.input, allow_pickle=False)
        result = convert(data)
        # Written to exactly the named file (np.save(path) would append ".npy").
        with open(args.output, "wb") as f:
            np.save(f, result, allow_pickle=False)
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        print(f"lowbit {command}: error: {e}", file=sys.stderr)
        return 1
    return 0


def _run_cast(args: argparse.Namespace, out: TextIO) -> int:
    return _convert_files("cast", args, lambda x: lowbit.cast(
        x, args.format, rounding=args.rounding, saturate=args.saturate,
        subnormals=args.subnormals, nan_sign=args.nan_sign, random_bits=args.random_bits,
        seed=args.seed, offset=args.offset, threads=args.threads))


def _run_decode(args: argparse.Namespace, out: TextIO) -> int:
    return _convert_files("decode", args, lambda codes: lowbit.decode(
        codes, args.format, args.dtype, threads=args.threads))


_EXIT_STATUS = ("Exit status: 0 on success, 1 when the conversion fails (unreadable input, "
                "unsupported dtype, unwritable output; the message goes to stderr), 2 for usage "
                "errors (unknown format or rounding names).")


def _add_cast(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cast",
        help="round the values of a .npy file to a format; write the codes as .npy",
        description="Read INPUT (.npy of float16, float32 or float64), round every value to "
                    "FORMAT (docs/rounding.md) and write the codes to OUTPUT (.npy of uint8, "
                    "uint16 or uint32, same shape). " + _EXIT_STATUS,
    )
    p.add_argument("input", type=Path, help="the values (.npy)")
    p.add_argument("output", type=Path, help="where to write the codes (.npy)")
    p.add_argument("--format", required=True, type=_format_arg, metavar="FORMAT",
                   help="a named format (lowbit formats) or e<E>m<M>[...]")
    p.add_argument("--rounding", default="nearest_even", choices=lowbit.roundings(),
                   help="rounding mode (default nearest_even)")
    p.add_argument("--saturate", action="store_true",
                   help="overflow and +-Inf give +-max instead of Inf/NaN")
    p.add_argument("--subnormals", default="keep", choices=["keep", "flush"],
                   help="keep or flush subnormal results (default keep)")
    p.add_argument("--nan-sign", default="preserve", choices=["preserve", "positive"],
                   help="sign of NaN results (default preserve)")
    p.add_argument("--random-bits", type=int, default=None, metavar="K",
                   help="stochastic rounding: random bits per rounding, 1..32 (default 32)")
    p.add_argument("--seed", type=_uint64_arg, default=0, metavar="N",
                   help="stochastic rounding: Philox seed (default 0)")
    p.add_argument("--offset", type=_uint64_arg, default=0, metavar="N",
                   help="stochastic rounding: Philox offset (default 0)")
    p.add_argument("--threads", type=_threads, default=0, metavar="N",
                   help="CPU threads (default 0: all cores)")
    p.set_defaults(run=_run_cast)


def _add_decode(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decode",
        help="the exact values of the codes in a .npy file",
        description="Read INPUT (.npy of codes of FORMAT: uint8, uint16 or uint32) and write "
                    "their exact values to OUTPUT (.npy of float32 or float64, same shape). "
                    + _EXIT_STATUS,
    )
    p.add_argument("input", type=Path, help="the codes (.npy)")
    p.add_argument("output", type=Path, help="where to write the values (.npy)")
    p.add_argument("--format", required=True, type=_format_arg, metavar="FORMAT",
                   help="the format of the codes")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="type of the values (default float32; float64 for formats wider than "
                        "float32's range)")
    p.add_argument("--threads", type=_threads, default=0, metavar="N",
                   help="CPU threads (default 0: all cores)")
    p.set_defaults(run=_run_decode)


# ---- entry point -------------------------------------------------------------------------------

_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_formats, _add_report,
                                                                 _add_verify, _add_cast,
                                                                 _add_decode]


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
