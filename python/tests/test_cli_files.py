"""Bad files in, bad paths out: every command that reads or writes a file answers with one line
on stderr and its documented exit status, never a traceback (docs/report.md, docs/python.md,
docs/verification.md): 1 for cast, decode and report, 2 for verify, whose inputs are its usage.

The table crosses each kind of bad file with each argument that names a file. Cases about
permissions need a process that permissions stop: run as root, they go to a subprocess that
has dropped root's file-permission capabilities (or, where that cannot be done, runs as `nobody`).
"""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import lowbit
from lowbit import cli

ml_dtypes = pytest.importorskip("ml_dtypes")

VALUES = np.float32([0.1, 1.7, -3.3, 300.0])


def _env() -> dict[str, str]:
    # The subprocess must import the same lowbit as this process.
    env = dict(os.environ)
    pkg_parent = str(Path(lowbit.__file__).absolute().parent.parent)  # not resolve(): symlinks
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("LOWBIT_DEBUG", None)
    return env


@dataclass
class Result:
    status: int
    out: str
    err: str


def run_in_process(argv: list[str], capsys) -> Result:
    out = io.StringIO()
    status = cli.main(argv, out=out)
    captured = capsys.readouterr()
    return Result(status, out.getvalue() + captured.out, captured.err)


def run_subprocess(argv: list[str], as_: dict | None = None, env: dict | None = None) -> Result:
    """`python -m lowbit argv`; `as_`: subprocess.run's arguments that take root's privileges away."""
    done = subprocess.run([sys.executable, "-m", "lowbit", *argv], capture_output=True,
                          text=True, env=env or _env(), cwd="/", check=False, **(as_ or {}))
    return Result(done.returncode, done.stdout, done.stderr)


def assert_one_line(result: Result, command: str, status: int, reason: str) -> None:
    assert result.status == status, result
    assert "Traceback" not in result.err, result.err
    lines = result.err.splitlines()
    assert len(lines) == 1 and result.err.endswith("\n"), result.err
    assert lines[0].startswith(f"lowbit {command}: error: "), lines[0]
    assert reason in lines[0], (reason, lines[0])
    assert result.out == "", result.out


# ---- the bad files -----------------------------------------------------------------------------

# name -> (makes the bad file at the path, a fragment of the reason)
BadFile = Callable[[Path], None]


def _write(data: bytes) -> BadFile:
    return lambda path: path.write_bytes(data)


def _saved(array: np.ndarray, allow_pickle: bool = False) -> BadFile:
    def make(path: Path) -> None:
        with open(path, "wb") as f:
            np.save(f, array, allow_pickle=allow_pickle)
    return make


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _header(text: bytes) -> bytes:
    """A version 1.0 .npy header holding ``text``."""
    text = text + b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def _npz(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, a=VALUES)


BAD_FILES: dict[str, tuple[BadFile | None, str]] = {
    "missing": (None, "cannot read: No such file or directory"),
    "directory": (lambda path: path.mkdir(), "is a directory, not a .npy file"),
    "empty": (_write(b""), "the file is empty"),
    "text": (_write(b"0.1 1.7 -3.3 300\n"), "not a .npy file"),
    "npz": (_npz, "a .npz archive"),
    "pickle": (_write(pickle.dumps([0.1, 1.7])), "a Python pickle"),
    "object_array": (_saved(np.array([{"a": 1}, None], dtype=object), allow_pickle=True),
                     "holds Python objects"),
    "truncated_header": (_write(_npy_bytes(VALUES)[:30]),
                         "not a valid .npy file: its header is truncated"),
    "broken_header": (_write(_header(b"{not a dict}")),
                      "not a valid .npy file: its header is broken"),
    "unknown_dtype": (_write(_header(b"{'descr': '<x3', 'fortran_order': False, "
                                     b"'shape': (2,), }") + bytes(6)),
                      "not a valid .npy file: its dtype '<x3' is unknown"),
    "truncated_data": (_write(_npy_bytes(np.zeros(1000, np.float32))[:300]), "truncated"),
    "structured": (_saved(np.zeros(4, dtype=[("a", "<f4"), ("b", "<i4")])),
                   "a structured or raw-bytes array"),
    "sizeless_dtype": (_write(_header(b"{'descr': '|V0', 'fortran_order': False, "
                                      b"'shape': (2,), }")),
                       "not a valid .npy file: its dtype '|V0' has no size"),
    "bool_shape": (_write(_header(b"{'descr': '<f4', 'fortran_order': False, "
                                  b"'shape': (True,), }") + bytes(4)),
                   "not a valid .npy file: its shape (True,) is not a tuple"),
    "too_many_dimensions": (_write(_header(b"{'descr': '<f4', 'fortran_order': False, "
                                           b"'shape': (" + b"1, " * 65 + b"), }") + bytes(4)),
                            "not a valid .npy file: its shape (1, 1,"),
    "empty_but_huge": (_write(_header(b"{'descr': '<f4', 'fortran_order': False, "
                                      b"'shape': (0, 1000000000000000000000000000000), }")),
                       "not a valid .npy file"),
}

# Well-formed files of a dtype that the argument refuses, and what the refusal says.
WRONG_DTYPES: dict[str, dict[str, tuple[np.ndarray, str]]] = {
    "cast": {"int64": (np.arange(4), "dtype int64 is not supported"),
             "complex64": (np.zeros(4, np.complex64), "dtype complex64 is not supported"),
             "strings": (np.array(["ab", "cd"]), "is not supported")},
    "decode": {"float32": (VALUES, "dtype float32 does not hold codes of e4m3fn"),
               "uint16": (np.zeros(4, np.uint16), "dtype uint16 does not hold codes of e4m3fn"),
               "bfloat16": (VALUES.astype(ml_dtypes.bfloat16), "holds bfloat16 values")},
}


@pytest.fixture()
def good(tmp_path) -> dict[str, str]:
    paths = {"values": tmp_path / "values.npy", "codes": tmp_path / "codes.npy"}
    np.save(paths["values"], VALUES)
    np.save(paths["codes"], lowbit.cast(VALUES, "e4m3fn"))
    return {k: str(v) for k, v in paths.items()}


# (command, the argument list with {bad} where the bad file goes, exit status)
READERS = {
    "cast": (["cast", "{bad}", "{out}", "--format", "e4m3fn"], 1),
    "decode": (["decode", "{bad}", "{out}", "--format", "e4m3fn"], 1),
    "verify_candidate": (["verify", "{bad}", "{codes}", "--format", "e4m3fn"], 2),
    "verify_reference": (["verify", "{codes}", "{bad}", "--format", "e4m3fn"], 2),
    "verify_inputs": (["verify", "{codes}", "{codes}", "--format", "e4m3fn", "--inputs",
                       "{bad}"], 2),
}


def _argv(template: list[str], **paths: str) -> list[str]:
    return [a.format(**paths) for a in template]


@pytest.mark.parametrize("bad", list(BAD_FILES))
@pytest.mark.parametrize("reader", list(READERS))
def test_bad_input_files(reader, bad, good, tmp_path, capsys):
    make, reason = BAD_FILES[bad]
    path = tmp_path / f"bad_{bad}.npy"
    if make is not None:
        make(path)
    template, status = READERS[reader]
    out = tmp_path / "out.npy"
    result = run_in_process(_argv(template, bad=str(path), out=str(out), **good), capsys)
    assert_one_line(result, template[0], status, f"{path}: {reason}")
    assert not out.exists()  # nothing written for a bad input


@pytest.mark.parametrize("command, dtype", [(c, d) for c in WRONG_DTYPES
                                            for d in WRONG_DTYPES[c]])
def test_wrong_dtypes(command, dtype, tmp_path, capsys):
    array, reason = WRONG_DTYPES[command][dtype]
    path, out = tmp_path / "in.npy", tmp_path / "out.npy"
    np.save(path, array)
    result = run_in_process([command, str(path), str(out), "--format", "e4m3fn"], capsys)
    assert_one_line(result, command, 1, f"{path}: ")
    assert reason in result.err
    assert not out.exists()


@pytest.mark.parametrize("argv, reason", [
    # Shapes and dtypes that cannot be compared.
    (["{codes}", "{short}", "--format", "e4m3fn"], "reference has shape (3,)"),
    (["{codes}", "{codes}", "--format", "e4m3fn", "--inputs", "{short}"], "shape (3,)"),
    (["{codes}", "{values}", "--policy", "exact"], "candidate"),
    (["{complex}", "{values}"], "complex64"),
    (["{int64}", "{values}", "--policy", "atol:1"], "candidate: dtype int64 is not supported"),
    (["{int32}", "{values}", "--policy", "atol:1"], None),  # int32 is read as integers
])
def test_verify_arrays_that_cannot_be_compared(argv, reason, good, tmp_path, capsys):
    paths = dict(good, short=str(tmp_path / "short.npy"), complex=str(tmp_path / "c.npy"),
                 int64=str(tmp_path / "i.npy"), int32=str(tmp_path / "i32.npy"))
    np.save(paths["short"], np.zeros(3, np.uint8))
    np.save(paths["complex"], np.zeros(4, np.complex64))
    np.save(paths["int64"], np.arange(4, dtype=np.int64))
    np.save(paths["int32"], np.arange(4, dtype=np.int32))
    result = run_in_process(["verify", *_argv(argv, **paths)], capsys)
    if reason is None:
        assert result.status in (0, 1) and result.err == ""
    else:
        assert_one_line(result, "verify", 2, reason)


def test_zero_dimensional_and_empty_arrays_are_files_like_any_other(tmp_path, capsys):
    for array in (np.float32(1.7), np.zeros((0, 3), np.float32)):
        src, out = tmp_path / "x.npy", tmp_path / "c.npy"
        np.save(src, array)
        assert run_in_process(["cast", str(src), str(out), "--format", "e5m2"], capsys).status == 0
        got = np.load(out)
        assert got.shape == array.shape
        np.testing.assert_array_equal(got, lowbit.cast(array, "e5m2"))


def test_big_endian_files_are_read_as_their_values(tmp_path, capsys):
    src, out = tmp_path / "x.npy", tmp_path / "c.npy"
    np.save(src, VALUES.astype(">f4"))
    assert run_in_process(["cast", str(src), str(out), "--format", "e4m3fn"], capsys).status == 0
    np.testing.assert_array_equal(np.load(out), lowbit.cast(VALUES, "e4m3fn"))


# ---- the bad output paths ----------------------------------------------------------------------

WRITERS = {
    "cast": (["cast", "{values}", "{out}", "--format", "e4m3fn"], "{out}"),
    "decode": (["decode", "{codes}", "{out}", "--format", "e4m3fn"], "{out}"),
    "report_out": (["report", "--quick", "--size", "1024", "--out", "{out}"], "{out}"),
    "report_json": (["report", "--quick", "--size", "1024", "--out", "{ok_dir}", "--json",
                     "{out}"], "{out}"),
}


def _file_at(path: Path) -> Path:
    path.write_bytes(b"a file")
    return path


# name -> (makes the bad output path in a directory, the reason per writer)
BAD_OUTPUTS: dict[str, tuple[Callable[[Path], Path], dict[str, str]]] = {
    "missing_directory": (lambda d: d / "no" / "such" / "out.npy",
                          {"cast": "the directory", "decode": "the directory"}),
    "under_a_file": (lambda d: _file_at(d / "plain") / "out.npy",
                     {"cast": "is not a directory", "decode": "is not a directory",
                      "report_out": "Not a directory",
                      "report_json": "plain exists and is not a directory"}),
    "a_directory": (lambda d: Path(tempfile.mkdtemp(dir=d)),
                    {"cast": "is a directory", "decode": "is a directory",
                     "report_json": "is a directory"}),
    "report_out_is_a_file": (lambda d: _file_at(d / "plain.txt"),
                             {"report_out": "exists and is not a directory"}),
    "name_too_long": (lambda d: d / ("a" * 300 + ".npy"),
                      {"cast": "cannot write: File name too long",
                       "decode": "cannot write: File name too long"}),
}


def _bad_output_cases():
    for bad, (_, reasons) in BAD_OUTPUTS.items():
        for writer in WRITERS:
            if writer in reasons:
                yield writer, bad


@pytest.mark.parametrize("writer, bad", list(_bad_output_cases()))
def test_bad_output_paths(writer, bad, good, tmp_path, capsys):
    make, reasons = BAD_OUTPUTS[bad]
    out = make(tmp_path)
    template, shown = WRITERS[writer]
    ok_dir = tmp_path / "ok"
    result = run_in_process(_argv(template, out=str(out), ok_dir=str(ok_dir), **good), capsys)
    command = template[0]
    assert_one_line(result, command, 1, f"{shown.format(out=out)}")
    assert reasons[writer] in result.err
    if command == "report":
        # Refused before anything was measured: no table, no JSON.
        assert not list(tmp_path.rglob("report.json"))


def test_a_missing_report_directory_is_made(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    result = run_in_process(["report", "--quick", "--size", "1024", "--threads", "1", "--out",
                             str(out), "--json", str(tmp_path / "c" / "r.json")], capsys)
    assert result.status == 0 and (tmp_path / "c" / "r.json").is_file() and out.is_dir()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_line(good, capsys):
    result = run_in_process(["cast", good["values"], "/dev/full", "--format", "e4m3fn"], capsys)
    assert_one_line(result, "cast", 1, "/dev/full: cannot write: No space left on device")
    assert os.path.exists("/dev/full")


# ---- permissions -------------------------------------------------------------------------------


def _drop_dac_capabilities() -> None:
    """preexec_fn: root keeps its uid but loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from
    the bounding set, so the program it runs next obeys permission bits, root's own included."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _unprivileged() -> dict | None:
    """None to run in this process (permissions stop it), else subprocess.run's arguments for a
    child that permissions stop: root without its file-permission capabilities where the kernel
    lets us drop them, else the user `nobody` where it can run this interpreter (a virtual
    environment's python may be a link into root's home, which `nobody` cannot enter)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    with tempfile.NamedTemporaryFile() as probe:
        os.chmod(probe.name, 0)
        code = f"open({probe.name!r}).close()"
        tries = [{"preexec_fn": _drop_dac_capabilities}]
        try:
            import pwd

            uid = pwd.getpwnam("nobody").pw_uid
            tries.append({"user": uid, "group": uid, "extra_groups": []})
        except KeyError:
            pass
        for extra in tries:
            try:
                done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=False, **extra)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode != 0 and "PermissionError" in done.stderr:
                return extra
    pytest.skip("running as root, and neither dropping root's file-permission capabilities nor "
                "the user `nobody` gives a child that permission bits stop")


@pytest.fixture()
def open_dir():
    # Readable by `nobody` (pytest's tmp_path is private to its user).
    path = Path(tempfile.mkdtemp(prefix="lowbit-cli-"))
    path.chmod(0o755)
    yield path
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.rmtree(path)


@pytest.mark.parametrize("case", ["unreadable_input", "read_only_output_dir",
                                  "read_only_report_dir", "read_only_json"])
def test_permissions(case, open_dir, capsys):
    child = _unprivileged()
    values, codes = open_dir / "values.npy", open_dir / "codes.npy"
    np.save(values, VALUES)
    np.save(codes, lowbit.cast(VALUES, "e4m3fn"))
    for p in (values, codes):
        p.chmod(0o644)
    locked = open_dir / "locked"
    locked.mkdir()
    if case == "unreadable_input":
        values.chmod(0)
        cases = [(["cast", str(values), str(open_dir / "c.npy"), "--format", "e5m2"], 1,
                  f"{values}: cannot read: Permission denied"),
                 (["verify", str(values), str(codes), "--format", "e4m3fn"], 2,
                  f"{values}: cannot read: Permission denied")]
    elif case == "read_only_output_dir":
        cases = [(["cast", str(values), str(locked / "c.npy"), "--format", "e5m2"], 1,
                  f"{locked / 'c.npy'}: cannot write: Permission denied"),
                 (["decode", str(codes), str(locked / "v.npy"), "--format", "e4m3fn"], 1,
                  f"{locked / 'v.npy'}: cannot write: Permission denied")]
    elif case == "read_only_report_dir":
        cases = [(["report", "--quick", "--out", str(locked)], 1,
                  f"{locked}: cannot write there: Permission denied")]
    else:
        json_file, writable = open_dir / "r.json", open_dir / "rep"
        json_file.write_text("{}")
        json_file.chmod(0o444)
        writable.mkdir()
        writable.chmod(0o777)  # the plots' directory: writable for anyone, unlike the JSON
        cases = [(["report", "--quick", "--out", str(writable), "--json", str(json_file)], 1,
                  f"{json_file}: cannot write: Permission denied")]
    locked.chmod(0o555)
    for argv, status, reason in cases:
        if child is None:
            result = run_in_process(argv, capsys)
        else:
            result = run_subprocess(argv, as_=child)
        assert_one_line(result, argv[0], status, reason)
    assert not list(locked.iterdir())


# ---- files saved from ml_dtypes arrays ---------------------------------------------------------


def test_bfloat16_files(tmp_path, capsys):
    # np.save writes bfloat16 as raw 2-byte elements ('<V2'): read back as bfloat16.
    bf16 = VALUES.astype(ml_dtypes.bfloat16)
    src, out = tmp_path / "bf16.npy", tmp_path / "out.npy"
    np.save(src, bf16)
    assert np.load(src).dtype.kind == "V"  # what makes this case: the type is not in the file
    assert run_in_process(["cast", str(src), str(out), "--format", "e4m3fn"], capsys).status == 0
    np.testing.assert_array_equal(np.load(out), lowbit.cast(bf16.astype(np.float32), "e4m3fn"))
    assert run_in_process(["decode", str(src), str(out), "--format", "bfloat16"],
                          capsys).status == 0
    np.testing.assert_array_equal(np.load(out), bf16.astype(np.float32))
    # verify reads it as bfloat16 values: exact against itself, within a bound of float32.
    result = run_in_process(["verify", str(src), str(src)], capsys)
    assert result.status == 0 and result.out.startswith("verify passed: 4 elements")
    ref = tmp_path / "ref.npy"
    np.save(ref, VALUES)
    result = run_in_process(["verify", str(src), str(ref), "--policy", "rtol:0.004"], capsys)
    assert result.status == 0, result


def test_float8_files(tmp_path, capsys):
    # np.save writes float8_e4m3fn as raw bytes ('<V1'): their codes, in the format named.
    f8 = VALUES.astype(ml_dtypes.float8_e4m3fn)
    src, out = tmp_path / "f8.npy", tmp_path / "out.npy"
    np.save(src, f8)
    assert np.load(src).dtype.kind == "V"
    assert run_in_process(["decode", str(src), str(out), "--format", "e4m3fn"],
                          capsys).status == 0
    np.testing.assert_array_equal(np.load(out), f8.astype(np.float32))
    assert run_in_process(["cast", str(src), str(out), "--format", "e5m2", "--input-format",
                           "e4m3fn"], capsys).status == 0
    np.testing.assert_array_equal(np.load(out), lowbit.cast(f8.astype(np.float32), "e5m2"))
    codes = tmp_path / "codes.npy"
    np.save(codes, f8.view(np.uint8))
    result = run_in_process(["verify", str(src), str(codes), "--format", "e4m3fn"], capsys)
    assert result.status == 0 and result.out.startswith("verify passed: 4 elements")
    # Without a format the bytes mean nothing: one line saying what to name.
    result = run_in_process(["cast", str(src), str(out), "--format", "e5m2"], capsys)
    assert_one_line(result, "cast", 1, "name their format with --input-format")
    result = run_in_process(["verify", str(src), str(codes)], capsys)
    assert_one_line(result, "verify", 2, "name the format")


def test_the_reader_names_what_the_header_leaves_unsaid(tmp_path):
    for array, saved_as, dtype in [(VALUES.astype(ml_dtypes.float8_e5m2), "1-byte", np.uint8),
                                   (VALUES.astype(ml_dtypes.bfloat16), "bfloat16", np.uint16),
                                   (VALUES, None, np.float32)]:
        src = tmp_path / "x.npy"
        np.save(src, array)
        loaded = cli.read_npy(src)
        assert loaded.saved_as == saved_as and loaded.array.dtype == dtype
        np.testing.assert_array_equal(loaded.array, array.view(dtype))


# ---- the guard around every command ------------------------------------------------------------


def test_unexpected_errors_are_one_line_and_debug_shows_them(good, tmp_path, capsys,
                                                              monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(cli, "write_npy", broken)
    argv = ["cast", good["values"], str(tmp_path / "c.npy"), "--format", "e4m3fn"]
    result = run_in_process(argv, capsys)
    assert_one_line(result, "cast", 1, "something inside broke (RuntimeError; --debug shows")
    for debug_argv in (["--debug", *argv], [*argv, "--debug"]):
        with pytest.raises(RuntimeError, match="something inside broke"):
            cli.main(debug_argv, out=io.StringIO())
    monkeypatch.setenv("LOWBIT_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(argv, out=io.StringIO())


def test_interrupt_is_one_line(good, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lowbit, "cast", interrupted)
    result = run_in_process(["cast", good["values"], str(tmp_path / "c.npy"), "--format",
                             "e4m3fn"], capsys)
    assert_one_line(result, "cast", 130, "interrupted")


@pytest.mark.parametrize("argv, status, reason", [
    (["cast", "{missing}", "{out}", "--format", "e4m3fn"], 1, "No such file or directory"),
    (["decode", "{text}", "{out}", "--format", "e4m3fn"], 1, "not a .npy file"),
    (["verify", "{text}", "{text}"], 2, "not a .npy file"),
    (["report", "--quick", "--out", "{text}"], 1, "exists and is not a directory"),
])
def test_the_process_prints_one_line_and_no_traceback(argv, status, reason, tmp_path):
    paths = {"missing": str(tmp_path / "missing.npy"), "out": str(tmp_path / "out.npy"),
             "text": str(tmp_path / "text.npy")}
    Path(paths["text"]).write_text("hello\n")
    result = run_subprocess(_argv(argv, **paths))
    assert_one_line(result, argv[0], status, reason)
    env = dict(_env(), LOWBIT_DEBUG="1")
    debug = run_subprocess(_argv(argv, **paths), env=env)
    assert debug.status == 1 and "Traceback" in debug.err  # Python's own status for a raise

