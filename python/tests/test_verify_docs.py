"""docs/verification.md runs: its ```python blocks in order in one session, each printing exactly
the ```text block that follows it, then its ```console block in the same directory, printing
exactly what the page shows."""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "verification.md"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"^```(\w+)\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.S | re.M)


def run_python_blocks(directory: Path) -> None:
    found = blocks()
    namespace: dict = {"__name__": "verification_md"}
    ran = 0
    with contextlib.chdir(directory):
        for k, (lang, code) in enumerate(found):
            if lang != "python":
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{PAGE.name} python block {ran + 1}", "exec"), namespace)
            ran += 1
            if k + 1 < len(found) and found[k + 1][0] == "text":
                assert out.getvalue() == found[k + 1][1], (
                    f"python block {ran} of {PAGE.name} printed:\n{out.getvalue()}")
    assert ran >= 5


def test_python_blocks_print_what_the_page_shows(tmp_path):
    run_python_blocks(tmp_path)


def test_console_block(tmp_path):
    run_python_blocks(tmp_path)  # writes the .npy files the commands read
    consoles = [code for lang, code in blocks() if lang == "console"]
    assert consoles
    # `lowbit` as the page's reader has it: the command line of the package under test.
    shim = tmp_path / "bin" / "lowbit"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lowbit "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for console in consoles:
        lines = console.splitlines(keepends=True)
        script = "".join(line[2:] for line in lines if line.startswith("$ "))
        expected = "".join(line for line in lines if not line.startswith("$ "))
        got = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                             text=True, check=False)
        assert got.stdout == expected, f"stdout:\n{got.stdout}\nstderr:\n{got.stderr}"
        assert got.stderr == ""
