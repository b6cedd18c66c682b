"""`lowbit cast` and `lowbit decode`: .npy in, .npy out, exit statuses, errors on stderr."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lowbit
from lowbit import cli

X = np.array([[0.1, 1.0, -3.14159], [300.0, 1000.0, np.nan]], np.float32)


def run(*argv: str) -> int:
    return cli.main(list(argv), out=io.StringIO())


def test_cast_then_decode(tmp_path):
    src, codes, values = tmp_path / "x.npy", tmp_path / "codes.npy", tmp_path / "values.npy"
    np.save(src, X)
    assert run("cast", str(src), str(codes), "--format", "e4m3fn", "--saturate") == 0
    got = np.load(codes)
    np.testing.assert_array_equal(got, lowbit.cast(X, "e4m3fn", saturate=True))
    assert got.dtype == np.uint8 and got.shape == X.shape
    assert run("decode", str(codes), str(values), "--format", "e4m3fn") == 0
    np.testing.assert_array_equal(np.load(values), lowbit.decode(got, "e4m3fn"))
    assert np.load(values).dtype == np.float32


def test_output_is_the_named_file(tmp_path):
    src, dst = tmp_path / "x.npy", tmp_path / "codes.bin"
    np.save(src, X)
    assert run("cast", str(src), str(dst), "--format", "e5m2") == 0
    assert dst.exists() and not (tmp_path / "codes.bin.npy").exists()


def test_policy_options(tmp_path):
    src, dst = tmp_path / "x.npy", tmp_path / "c.npy"
    x = np.linspace(-3, 3, 101, dtype=np.float64)
    np.save(src, x)
    assert run("cast", str(src), str(dst), "--format", "e2m1fn", "--rounding", "stochastic",
               "--random-bits", "8", "--seed", "0x1234", "--offset", "7", "--threads", "1",
               "--subnormals", "flush", "--nan-sign", "positive") == 0
    want = lowbit.cast(x, "e2m1fn", rounding="stochastic", random_bits=8, seed=0x1234, offset=7,
                       subnormals="flush", nan_sign="positive")
    np.testing.assert_array_equal(np.load(dst), want)
    codes = lowbit.cast(x, "float32")
    np.save(src, codes)
    assert run("decode", str(src), str(dst), "--format", "float32", "--dtype", "float64") == 0
    np.testing.assert_array_equal(np.load(dst), x.astype(np.float32).astype(np.float64))


def test_failures_exit_with_1_and_say_why_on_stderr(tmp_path, capsys):
    src, dst = tmp_path / "x.npy", tmp_path / "c.npy"
    assert run("cast", str(tmp_path / "missing.npy"), str(dst), "--format", "e4m3fn") == 1
    err = capsys.readouterr().err
    assert err.startswith("lowbit cast: error: ") and "missing.npy" in err
    np.save(src, np.arange(4))
    assert run("cast", str(src), str(dst), "--format", "e4m3fn") == 1
    assert f"{src}: dtype int64 is not supported" in capsys.readouterr().err
    np.save(src, np.zeros(3, np.uint16))
    assert run("decode", str(src), str(dst), "--format", "e4m3fn") == 1
    assert f"{src}: dtype uint16 does not hold codes of e4m3fn" in capsys.readouterr().err
    np.save(src, np.zeros(3, np.uint8))
    assert run("decode", str(src), str(tmp_path / "no" / "dir.npy"), "--format", "e4m3fn") == 1
    assert capsys.readouterr().err.startswith("lowbit decode: error: ")
    (tmp_path / "junk.npy").write_bytes(b"not a numpy file")
    assert run("decode", str(tmp_path / "junk.npy"), str(dst), "--format", "e4m3fn") == 1
    np.save(src, np.array([1.0], np.float32))
    assert run("cast", str(src), str(dst), "--format", "e4m3fn", "--random-bits", "4") == 1
    assert "random_bits: only rounding='stochastic'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["cast", "a.npy", "b.npy"],  # --format is required
    ["cast", "a.npy", "b.npy", "--format", "fp8"],
    ["cast", "a.npy", "b.npy", "--format", "e4m3fn", "--rounding", "nearest"],
    ["cast", "a.npy", "b.npy", "--format", "e4m3fn", "--seed", "-1"],
    ["cast", "a.npy", "b.npy", "--format", "e4m3fn", "--rounding", "stochastic",
     "--random-bits", "0"],
    ["cast", "a.npy", "b.npy", "--format", "e4m3fn", "--rounding", "stochastic",
     "--random-bits", "33"],
    ["decode", "a.npy", "b.npy", "--format", "e4m3fn", "--dtype", "int8"],
    ["decode", "a.npy"],
])
def test_usage_errors_exit_with_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert "usage: lowbit" in capsys.readouterr().err


def test_unknown_format_message(capsys):
    with pytest.raises(SystemExit):
        cli.main(["cast", "a.npy", "b.npy", "--format", "fp8"])
    assert "format 'fp8': unknown name" in capsys.readouterr().err


def test_as_a_subprocess(tmp_path):
    src, dst = tmp_path / "x.npy", tmp_path / "c.npy"
    np.save(src, X)
    env = dict(os.environ)
    pkg_parent = str(Path(lowbit.__file__).absolute().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    res = subprocess.run([sys.executable, "-m", "lowbit", "cast", str(src), str(dst), "--format",
                          "bfloat16"], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == ""
    np.testing.assert_array_equal(np.load(dst), lowbit.cast(X, "bfloat16"))
    res = subprocess.run([sys.executable, "-m", "lowbit", "decode", str(src), str(dst),
                          "--format", "e4m3fn"], capture_output=True, text=True, env=env)
    assert res.returncode == 1 and res.stderr == (
        f"lowbit decode: error: {src}: dtype float32 does not hold codes of e4m3fn; expected "
        "uint8\n")
