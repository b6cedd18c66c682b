"""`lowbit verify`: exit status 0/1/2, the report on stdout (text or JSON), reasons on stderr."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import lowbit
from lowbit import cli


@pytest.fixture()
def files(tmp_path):
    x = np.float32([0.1, 1.7, 3.3, 300.0])
    paths = {
        "x": tmp_path / "x.npy",
        "expected": tmp_path / "expected.npy",
        "mine": tmp_path / "mine.npy",
        "short": tmp_path / "short.npy",
        "pickled": tmp_path / "pickled.npy",
    }
    np.save(paths["x"], x)
    np.save(paths["expected"], lowbit.cast(x, "e4m3fn"))
    np.save(paths["mine"], lowbit.cast(x, "e4m3fn", rounding="toward_zero"))
    np.save(paths["short"], np.zeros(3, np.uint8))
    np.save(paths["pickled"], np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return {k: str(v) for k, v in paths.items()}


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = cli.main(["verify", *argv], out=out)
    return status, out.getvalue()


def test_pass_and_fail(files):
    status, text = run(files["mine"], files["expected"], "--format", "e4m3fn", "--policy",
                       "ulp:1")
    assert status == 0
    assert text.startswith("verify passed: 4 elements within ulp:1@e4m3fn\n")
    status, text = run(files["mine"], files["expected"], "--format", "e4m3fn", "--inputs",
                       files["x"])
    assert status == 1
    assert text.startswith("verify FAILED: 2 of 4 elements outside exact@e4m3fn\n")
    assert "0.1 (0x3DCCCCCD)  0.09375 (0x1C)  0.1015625 (0x1D)" in text
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_json(files):
    status, text = run(files["mine"], files["expected"], "--policy", "exact@e4m3fn", "--json",
                       "--worst", "1")
    assert status == 1
    data = json.loads(text)
    assert data["ok"] is False and data["failed"] == 2 and data["policy"] == "exact@e4m3fn"
    assert len(data["worst"]) == 1 and data["worst"][0]["candidate_hex"] == "0x1C"


@pytest.mark.parametrize("argv, message", [
    (["{mine}", "{expected}", "--policy", "ulp:1"], "holds codes of a number format"),
    (["{mine}", "{expected}", "--policy", "nearly"], "unknown policy 'nearly'"),
    (["{mine}", "{expected}", "--policy", "atol:nan@e4m3fn"], "atol is NaN"),
    (["{mine}", "{short}", "--format", "e4m3fn"], r"reference has shape \(3,\)"),
    (["{mine}", "{missing}", "--format", "e4m3fn"], "No such file"),
    (["{mine}", "{pickled}", "--format", "e4m3fn"], "pickled.npy: holds Python objects"),
])
def test_usage_errors_exit_2(files, tmp_path, capsys, argv, message):
    files = dict(files, missing=str(tmp_path / "missing.npy"))
    status, text = run(*[a.format(**files) for a in argv])
    assert status == 2 and text == ""
    err = capsys.readouterr().err
    assert err.startswith("lowbit verify: error: ")
    assert re.search(message, err), err


def test_argparse_errors_exit_2(files):
    with pytest.raises(SystemExit) as info:
        run(files["mine"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        run(files["mine"], files["expected"], "--worst", "-1")
    assert info.value.code == 2


def test_exit_status_of_the_process(files):
    cmd = [sys.executable, "-m", "lowbit", "verify", files["mine"], files["expected"],
           "--format", "e4m3fn"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stdout.startswith("verify FAILED") and done.stderr == ""
    done = subprocess.run(cmd + ["--policy", "ulp:1"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0
