"""The `lowbit` command line.

Each subcommand is a function that adds its parser to the subparsers and sets `run` to the
function that carries it out (returning the exit status); new subcommands join _COMMANDS.

Every failure a user can cause (a missing, unreadable, empty, truncated or foreign input file,
an unwritable output, arrays the library refuses) ends in one line on stderr,
`lowbit <command>: error: <reason>`, and the command's documented exit status; main() turns
whatever else escapes into such a line too. LOWBIT_DEBUG=1 or --debug shows the traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import lowbit
from lowbit._api import FormatInfo, format_info

# ---- files -------------------------------------------------------------------------------------


class CliError(Exception):
    """A reason the command cannot go on: printed as one line, exits with ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


_NPY_MAGIC = b"\x93NUMPY"


@dataclass(frozen=True)
class NpyFile:
    """A .npy file's array, and what its header leaves unsaid.

    np.save writes ml_dtypes arrays with the raw-bytes dtype V2 (bfloat16) or V1 (float8_*,
    float6_*, float4_*): the name of the type is lost. Such elements arrive here as uint16 or
    uint8 codes, with ``saved_as`` "bfloat16" or "1-byte" (bfloat16 is the only 2-byte type of
    ml_dtypes; the 1-byte ones need a format from the command line).
    """

    path: Path
    array: Any  # numpy array in native byte order; ml_dtypes elements as codes
    saved_as: str | None = None


def _npy_header(f: Any, fail: Callable[[str], CliError]) -> dict[str, Any]:
    """The header dictionary of a .npy file positioned after its magic string.

    Read here rather than by numpy.lib.format, which rejects the descr "<f1" that np.save
    writes for some ml_dtypes types (float8_e5m2 among them)."""
    import ast
    import struct

    version = f.read(2)
    if len(version) < 2:
        raise fail("not a valid .npy file: its header is truncated")
    major = version[0]
    if major not in (1, 2, 3):
        raise fail(f"a .npy file of format version {major}.{version[1]}, which lowbit does "
                   "not read (1.0 to 3.0)")
    length_bytes = 2 if major == 1 else 4
    length = f.read(length_bytes)
    if len(length) < length_bytes:
        raise fail("not a valid .npy file: its header is truncated")
    (n,) = struct.unpack("<H" if major == 1 else "<I", length)
    text = f.read(n)
    if len(text) < n:
        raise fail(f"not a valid .npy file: its header is truncated ({len(text)} of {n} bytes)")
    try:
        header = ast.literal_eval(text.decode("latin1" if major < 3 else "utf8"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        header = None
    if (not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}
            or not isinstance(header["shape"], tuple)
            or not all(isinstance(d, int) and d >= 0 for d in header["shape"])
            or not isinstance(header["fortran_order"], bool)):
        raise fail("not a valid .npy file: its header is broken")
    return header


def read_npy(path: Path, status: int = 1) -> NpyFile:
    """Reads one array from a .npy file, or raises CliError (with ``status``) saying why not.

    Never unpickles: object arrays are refused from the header, before any data is read, and
    the data is read only when the file holds all of it.
    """
    import numpy as np
    from numpy.lib import format as npy_format

    def fail(reason: str) -> CliError:
        return CliError(f"{path}: {reason}", status)

    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise fail("is a directory, not a .npy file") from None
    except OSError as e:
        raise fail(f"cannot read: {e.strerror or e}") from e
    saved_as = None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            start = f.read(len(_NPY_MAGIC))
            if not start:
                raise fail("the file is empty, not a .npy file")
            if start != _NPY_MAGIC:
                if start.startswith(b"PK"):
                    raise fail("a .npz archive (np.savez), not a .npy file: save one array "
                               "with np.save")
                if start[:1] == b"\x80":
                    raise fail("a Python pickle, not a .npy file (lowbit never unpickles)")
                raise fail("not a .npy file (it does not start with the .npy magic string)")
            header = _npy_header(f, fail)
            descr, shape = header["descr"], header["shape"]
            if not isinstance(shape, tuple) or len(shape) > 64 or \
                    not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2 ** 62
                            for d in shape):
                raise fail(f"not a valid .npy file: its shape {shape!r} is not a tuple of at "
                           "most 64 sizes")
            if descr in ("<f1", "|f1", ">f1"):
                # One byte of an ml_dtypes type whose numpy kind is "f".
                dtype, saved_as = np.dtype(np.uint8), "1-byte"
            else:
                try:
                    dtype = npy_format.descr_to_dtype(descr)
                except (ValueError, TypeError) as e:
                    raise fail(f"not a valid .npy file: its dtype {descr!r} is unknown "
                               f"({e})") from e
            if dtype.hasobject:
                raise fail(f"holds Python objects (dtype {dtype}); lowbit reads numeric "
                           "arrays only and never unpickles")
            if dtype.itemsize == 0:
                raise fail(f"not a valid .npy file: its dtype {descr!r} has no size")
            need = math.prod(shape) * dtype.itemsize
            have = size - f.tell()
            if have < need:
                raise fail(f"truncated: the header promises {need} bytes of data ({dtype}, "
                           f"shape {shape}), the file holds {have}")
            data = bytearray(need)
            if f.readinto(data) != need:
                raise fail("truncated while it was read")
        except OSError as e:
            raise fail(f"cannot read: {e.strerror or e}") from e
    try:
        array = np.frombuffer(data, dtype=dtype).reshape(
            shape, order="F" if header["fortran_order"] else "C")
    except (ValueError, MemoryError) as e:  # e.g. an empty array of sizes numpy cannot hold
        raise fail(f"not a valid .npy file: shape {shape} of {dtype}: {e}") from e
    if array.dtype.kind == "V" and array.dtype.names is None and array.dtype.subdtype is None \
            and array.dtype.itemsize in (1, 2):
        # Raw bytes without fields: how np.save writes the other ml_dtypes types.
        if array.dtype.itemsize == 2:
            array, saved_as = array.view(np.uint16), "bfloat16"
        else:
            array, saved_as = array.view(np.uint8), "1-byte"
    elif array.dtype.kind == "V":
        raise fail(f"a structured or raw-bytes array (dtype {array.dtype}), not numbers")
    elif not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return NpyFile(path, array, saved_as)


def write_npy(path: Path, array: Any) -> None:
    """Writes ``array`` to exactly ``path`` (np.save(path) would append ".npy"), or raises
    CliError; a partly written file is removed."""
    import numpy as np

    try:  # (a name too long for the file system fails already here)
        if path.is_dir():
            raise CliError(f"{path}: is a directory; name the file to write")
        parent = path.parent
        if not parent.is_dir():
            raise CliError(f"{path}: cannot write: the directory {parent} does not exist"
                           if not parent.exists() else f"{path}: cannot write: {parent} is not "
                           "a directory")
        f = open(path, "wb")
    except OSError as e:
        raise CliError(f"{path}: cannot write: {e.strerror or e}") from e
    try:
        with f:
            np.save(f, array, allow_pickle=False)
    except OSError as e:
        try:
            if path.is_file():  # not a device such as /dev/full
                path.unlink()
        except OSError:
            pass  # the message below says what failed; a file we cannot remove stays
        raise CliError(f"{path}: cannot write: {e.strerror or e}") from e


def _library_error(e: Exception, argument: str, path: Path, status: int = 1) -> CliError:
    """A lowbit function's refusal as a CliError: a message about ``argument`` (it starts with
    "argument: ") names the file the argument came from instead."""
    text = str(e)
    if text.startswith(f"{argument}: "):
        text = f"{path}: {text[len(argument) + 2:]}"
    return CliError(text, status)


_LIBRARY_ERRORS = (ValueError, TypeError, RuntimeError)


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
    if not 0 <= value <= 65536:
        raise argparse.ArgumentTypeError(f"expected 0 (all cores) or a count up to 65536, got "
                                         f"{text}")
    return value


def _run_report(args: argparse.Namespace, out: TextIO) -> int:
    # Imported here: `lowbit formats` should not pay for the report's imports.
    from lowbit import report

    try:
        report.run_report(report.Options(out=args.out, quick=args.quick, threads=args.threads,
                                         size=args.size, json=args.json,
                                         training=not args.no_training), out)
    except report.OutputError as e:
        raise CliError(str(e)) from e
    return 0


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="measure error and speed of every format on synthetic workloads",
        description="Cast built-in synthetic workloads (gaussian, heavy-tailed, outliers) to "
                    "every format under every rounding mode; print error statistics and CPU "
                    "throughput (against ml_dtypes, measured in the same run), write JSON and "
                    "PNG plots. docs/report.md explains every number. Progress goes to stderr. "
                    "Exit status: 0 on success, 1 when DIR or the JSON file cannot be written "
                    "(checked before anything is measured; one line on stderr says why), 2 for "
                    "usage errors.",
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
    p.add_argument("--no-training", action="store_true",
                   help="leave out the small-model training comparisons (minutes on a CPU; "
                        "--quick leaves them out too)")
    p.set_defaults(run=_run_report)


# ---- lowbit verify -----------------------------------------------------------------------------


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {text}")
    return value


def _verify_array(path: Path) -> Any:
    """A .npy file as lowbit.verify reads it: bfloat16 saved from ml_dtypes as bfloat16 values
    (float32 without ml_dtypes: the same values), the 1-byte elements of a float8/float6/float4
    file as codes (their format comes from --format)."""
    src = read_npy(path, status=2)
    if src.saved_as != "bfloat16":
        return src.array
    try:
        import ml_dtypes
    except ImportError:
        return lowbit.decode(src.array, "bfloat16", "float32")
    return src.array.view(ml_dtypes.bfloat16)


def _run_verify(args: argparse.Namespace, out: TextIO) -> int:
    from lowbit._verify import verify

    # Arrays or a policy that cannot be compared are usage errors, like argparse's (status 2).
    candidate, reference = _verify_array(args.candidate), _verify_array(args.reference)
    inputs = None if args.inputs is None else _verify_array(args.inputs)
    try:
        report = verify(candidate, reference, args.policy, fmt=args.format, inputs=inputs,
                        input_fmt=args.input_format, worst=args.worst)
    except _LIBRARY_ERRORS as e:
        raise CliError(str(e), 2) from e
    out.write((report.to_json(indent=2) if args.json else str(report)) + "\n")
    return 0 if report.ok else 1


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="compare a candidate array against a reference (.npy files)",
        description="Compare CANDIDATE against REFERENCE (.npy files of the same shape) under a "
                    "policy and print the report (docs/verification.md). bfloat16 and float8 "
                    "files saved from ml_dtypes arrays are read (1-byte elements as codes of "
                    "--format). Exit status: 0 when every element passes, 1 when some fail, 2 "
                    "for usage errors (missing, unreadable, empty, truncated or non-.npy files, "
                    "object arrays, shapes or dtypes that cannot be compared, a bad policy; one "
                    "line on stderr says why).",
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


def _random_bits(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 32:
        raise argparse.ArgumentTypeError(f"expected random bits in 1..32, got {text}")
    return value


def _same_format(a: Any, b: Any) -> bool:
    return lowbit.parse_format(a) == lowbit.parse_format(b)


def _cast_values(src: NpyFile, input_format: lowbit.Format | None) -> Any:
    """What `lowbit cast` rounds: the array itself, or the exact values of the codes it holds
    (--input-format, or an ml_dtypes type that says its format)."""
    fmt = input_format
    if src.saved_as == "1-byte" and fmt is None:
        raise CliError(f"{src.path}: 1-byte elements without a type (how np.save writes "
                       "ml_dtypes' float8, float6 and float4 arrays): name their format with "
                       "--input-format")
    if src.saved_as == "bfloat16":
        if fmt is not None and not _same_format("bfloat16", fmt):
            raise CliError(f"{src.path}: holds bfloat16 values (2-byte elements without a "
                           f"type, as np.save writes ml_dtypes' bfloat16), but --input-format "
                           f"is {fmt.name}")
        fmt = "bfloat16"
    if fmt is None:
        return src.array
    try:
        # float64 holds every value of every format up to 32 bits exactly.
        return lowbit.decode(src.array, fmt, "float64")
    except _LIBRARY_ERRORS as e:
        raise _library_error(e, "codes", src.path) from e


def _run_cast(args: argparse.Namespace, out: TextIO) -> int:
    src = read_npy(args.input)
    x = _cast_values(src, args.input_format)
    try:
        codes = lowbit.cast(x, args.format, rounding=args.rounding, saturate=args.saturate,
                            subnormals=args.subnormals, nan_sign=args.nan_sign,
                            random_bits=args.random_bits, seed=args.seed, offset=args.offset,
                            threads=args.threads)
    except _LIBRARY_ERRORS as e:
        raise _library_error(e, "x", args.input) from e
    write_npy(args.output, codes)
    return 0


def _run_decode(args: argparse.Namespace, out: TextIO) -> int:
    src = read_npy(args.input)
    if src.saved_as == "bfloat16" and not _same_format("bfloat16", args.format):
        raise CliError(f"{args.input}: holds bfloat16 values (2-byte elements without a type, "
                       f"as np.save writes ml_dtypes' bfloat16), but --format is "
                       f"{args.format.name}")
    try:
        values = lowbit.decode(src.array, args.format, args.dtype, threads=args.threads)
    except _LIBRARY_ERRORS as e:
        raise _library_error(e, "codes", args.input) from e
    write_npy(args.output, values)
    return 0


_EXIT_STATUS = ("Exit status: 0 on success, 1 when the conversion fails (a missing, "
                "unreadable, empty, truncated or non-.npy input, an object array, an unsupported "
                "dtype, an unwritable output; one line on stderr says why), 2 for usage errors "
                "(unknown format or rounding names).")


def _ml_dtypes_files(flag: str) -> str:
    return ("np.save writes ml_dtypes arrays without their type: 2-byte elements are read as "
            f"bfloat16, 1-byte ones (float8, float6, float4) as codes of the format {flag} names.")


def _add_cast(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cast",
        help="round the values of a .npy file to a format; write the codes as .npy",
        description="Read INPUT (.npy of float16, float32, float64 or bfloat16, or codes of "
                    "--input-format), round every value to FORMAT (docs/rounding.md) and write "
                    "the codes to OUTPUT (.npy of uint8, uint16 or uint32, same shape). "
                    + _ml_dtypes_files("--input-format") + " " + _EXIT_STATUS,
    )
    p.add_argument("input", type=Path, help="the values (.npy)")
    p.add_argument("output", type=Path, help="where to write the codes (.npy)")
    p.add_argument("--format", required=True, type=_format_arg, metavar="FORMAT",
                   help="a named format (lowbit formats) or e<E>m<M>[...]")
    p.add_argument("--input-format", type=_format_arg, default=None, metavar="FORMAT",
                   help="INPUT holds codes of FORMAT (uint8/16/32, or an ml_dtypes float8, "
                        "float6 or float4 array): their exact values are cast")
    p.add_argument("--rounding", default="nearest_even", choices=lowbit.roundings(),
                   help="rounding mode (default nearest_even)")
    p.add_argument("--saturate", action="store_true",
                   help="overflow and +-Inf give +-max instead of Inf/NaN")
    p.add_argument("--subnormals", default="keep", choices=["keep", "flush"],
                   help="keep or flush subnormal results (default keep)")
    p.add_argument("--nan-sign", default="preserve", choices=["preserve", "positive"],
                   help="sign of NaN results (default preserve)")
    p.add_argument("--random-bits", type=_random_bits, default=None, metavar="K",
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
        description="Read INPUT (.npy of codes of FORMAT: uint8, uint16 or uint32, or an "
                    "ml_dtypes array of FORMAT) and write their exact values to OUTPUT (.npy of "
                    "float32 or float64, same shape). " + _ml_dtypes_files("--format") + " "
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
        description="Bit-exact low-precision numerics: formats, casts, reports. Errors are one "
                    "line on stderr; --debug (or LOWBIT_DEBUG=1) shows their traceback.",
    )
    parser.add_argument("--version", action="version", version=f"lowbit {lowbit.__version__}")
    debug_help = "show the traceback of an error (also LOWBIT_DEBUG=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _COMMANDS:
        add(sub)
    # Also after the command (`lowbit cast ... --debug`); SUPPRESS keeps a subcommand's default
    # from overwriting the top-level flag.
    for p in sub.choices.values():
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help=debug_help)
    return parser


def _debug(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("LOWBIT_DEBUG", "") not in (
        "", "0")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Runs the command line; returns the exit status (argparse exits with 2 on usage errors).

    Errors end in one line on stderr, `lowbit <command>: error: <reason>`: CliError with its
    status, anything else a command raises with 2 for verify (its inputs are its usage) and 1
    otherwise. --debug or LOWBIT_DEBUG=1 lets the exception through, traceback and all.
    """
    args = build_parser().parse_args(argv)
    debug = _debug(args)
    command = args.command

    def fail(reason: str, status: int) -> int:
        if debug:
            raise
        print(f"lowbit {command}: error: {_one_line(reason)}", file=sys.stderr)
        return status

    try:
        return args.run(args, out if out is not None else sys.stdout)
    except CliError as e:
        return fail(str(e), e.status)
    except BrokenPipeError:
        # `lowbit formats | head` closes the pipe early. Point stdout at /dev/null so that the
        # interpreter's final flush does not raise again (the recipe of the Python docs).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except MemoryError:
        return fail("out of memory (a smaller input or --size helps)", 2 if command == "verify"
                    else 1)
    except (*_LIBRARY_ERRORS, OSError, EOFError, ImportError) as e:
        reason = f"{e} ({type(e).__name__}; --debug shows the traceback)"
        return fail(reason, 2 if command == "verify" else 1)


if __name__ == "__main__":
    sys.exit(main())
