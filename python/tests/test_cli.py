"""The `lowbit` command line and the files generated from it."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import lowbit
from lowbit import cli

REPO = Path(__file__).resolve().parents[2]


def run_main(*argv: str) -> str:
    out = io.StringIO()
    assert cli.main(list(argv), out=out) == 0
    return out.getvalue()


def test_docs_formats_md_is_the_generated_table():
    committed = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    generated = run_main("formats", "--markdown")
    assert committed == generated, (
        "docs/formats.md is out of date: regenerate it with "
        "`lowbit formats --markdown > docs/formats.md`")


def test_formats_table_lists_every_format():
    text = run_main("formats")
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["name", "bits", "exp", "man", "bias"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert list(rows) == lowbit.formats()
    assert rows["e4m3fn"].split()[1:10] == [
        "8", "4", "3", "7", "448", "2^-6", "2^-9", "0x7F,", "0xFF"]
    assert "0x7D-0x7F, 0xFD-0xFF" in rows["e5m2"] and "0x7C, 0xFC" in rows["e5m2"]
    assert "0x80 " in rows["e4m3fnuz"]
    assert "2^-127" in rows["e8m0fnu"] and "0xFF " in rows["e8m0fnu"]


def test_markdown_rows():
    lines = run_main("formats", "--markdown").splitlines()
    row = next(line for line in lines if line.startswith("| `e2m1fn`"))
    assert [c.strip() for c in row.strip("|").split("|")][:10] == [
        "`e2m1fn`", "4", "2", "1", "1", "6", "2^0", "2^-1", "none", "none"]


def test_usage_errors_exit_with_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["formats", "--bogus"])
    assert e.value.code == 2


def _env() -> dict[str, str]:
    # The subprocess must import the same lowbit as this process.
    env = dict(os.environ)
    pkg_parent = str(Path(lowbit.__file__).absolute().parent.parent)  # not resolve(): symlinks
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_python_dash_m_lowbit():
    res = subprocess.run([sys.executable, "-m", "lowbit", "formats"], capture_output=True,
                         text=True, env=_env(), check=True)
    assert res.stdout == run_main("formats")


# The console script of an installed lowbit: beside this interpreter (a virtual environment's
# bin/, which need not be on PATH) or on PATH.
_SCRIPT = shutil.which("lowbit", path=sysconfig.get_path("scripts")) or shutil.which("lowbit")


@pytest.mark.skipif(_SCRIPT is None, reason="lowbit is not installed as a command")
def test_console_script():
    res = subprocess.run([_SCRIPT, "--version"], capture_output=True, text=True, check=True)
    assert res.stdout.strip().startswith("lowbit ")


def test_quickstart_example():
    script = REPO / "python" / "examples" / "quickstart.py"
    # The README shows it whole.
    assert sum(1 for line in script.read_text().splitlines() if line.strip()) <= 10
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=_env(), check=True)
    assert res.stdout.splitlines() == [
        "codes: 0x1D 0x38 0x45 0x79 0x7E",
        "values: [0.1015625, 1.0, 3.25, 288.0, 448.0]",
        "e4m3fn: max 448.0, smallest subnormal 0.001953125",
    ]
