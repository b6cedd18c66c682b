"""python/lowbit/_core.pyi stays in step with the compiled module: the same functions and
classes, the same parameter names (read from pybind11's signatures), the same class members."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from lowbit import _core

STUB = Path(__file__).resolve().parents[2] / "python" / "lowbit" / "_core.pyi"
TREE = ast.parse(STUB.read_text(encoding="utf-8"))
# Aliases that exist only in the stub (`_FormatLike = Union[...]`).
STUB_DEFS = {n.name: n for n in TREE.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def module_names():
    return {n for n in dir(_core) if not n.startswith("__")}


def test_same_names():
    assert set(STUB_DEFS) == module_names()


def pybind_params(fn) -> list[str] | None:
    lines = [line for line in (fn.__doc__ or "").splitlines() if line.strip()]
    if not lines or lines[0].startswith("Overloaded"):
        return None
    head = lines[0]
    inside = head[head.index("(") + 1:head.rindex(") ->")]
    return re.findall(r"(?:^|,\s*)(\w+)\s*:", inside)


@pytest.mark.parametrize("name", sorted(n for n, d in STUB_DEFS.items()
                                        if isinstance(d, ast.FunctionDef)))
def test_function_parameters(name):
    want = pybind_params(getattr(_core, name))
    if want is None:
        pytest.skip("overloaded")
    stub = STUB_DEFS[name]
    assert [a.arg for a in stub.args.args] == want


@pytest.mark.parametrize("name", sorted(n for n, d in STUB_DEFS.items()
                                        if isinstance(d, ast.ClassDef)))
def test_class_members(name):
    cls = getattr(_core, name)
    body = STUB_DEFS[name].body
    stub = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    stub |= {n.target.id for n in body if isinstance(n, ast.AnnAssign)}  # `field: type`
    members = {n for n in vars(cls) if not n.startswith("_")}
    assert {n for n in stub if not n.startswith("_")} == members
    for n in stub:
        assert hasattr(cls, n), n
