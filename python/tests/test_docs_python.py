"""Every ```python block of docs/python.md runs. Blocks tagged ```python run everywhere,
```python torch where PyTorch is installed, ```python gpu where the gpu marker's requirements
hold (conftest.py). Each block runs on its own, in a fresh namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCK = re.compile(r"^```python(?P<tag>[^\n]*)\n(?P<code>.*?)^```\s*$", re.S | re.M)


def blocks():
    out = []
    text = DOC.read_text(encoding="utf-8")
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        tag = m.group("tag").strip()
        marks = {"": [], "torch": [pytest.mark.torch], "gpu": [pytest.mark.gpu]}[tag]
        out.append(pytest.param(m.group("code"), line, id=f"line{line}-{tag or 'numpy'}",
                                marks=marks))
    return out


def test_the_page_has_runnable_blocks():
    tags = [p.id.split("-", 1)[1] for p in blocks()]
    assert tags.count("numpy") >= 3 and "torch" in tags and "gpu" in tags


@pytest.mark.parametrize("code, line", blocks())
def test_block_runs(code, line):
    exec(compile(code, f"{DOC}:{line}", "exec"), {"__name__": "__docs__"})
