"""The wheel that `pip wheel .` builds, and the package installed from it: scripts/test.sh packs
the CI build into a wheel, installs it and names it in LOWBIT_WHEEL. The wheel must hold every
file of python/lowbit (the type stubs and the py.typed marker among them), the compiled module
and the `lowbit` command, and the installed package must be that wheel's files. Skipped without
LOWBIT_WHEEL (a plain CMake build, tests run with PYTHONPATH)."""

from __future__ import annotations

import base64
import hashlib
import importlib.machinery
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "lowbit"
WHEEL = os.environ.get("LOWBIT_WHEEL")

pytestmark = pytest.mark.skipif(not WHEEL, reason="LOWBIT_WHEEL is not set (scripts/test.sh "
                                                  "sets it to the wheel it builds and installs)")


def package_sources() -> dict[str, bytes]:
    """What the wheel takes from the source tree: the package's .py and .pyi files and py.typed
    (as python/CMakeLists.txt links them into the build tree)."""
    files = [*SOURCE.rglob("*.py"), *SOURCE.rglob("*.pyi"), SOURCE / "py.typed"]
    return {f"lowbit/{f.relative_to(SOURCE).as_posix()}": f.read_bytes() for f in files
            if "__pycache__" not in f.parts}


def record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it (PEP 376/427)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


@pytest.fixture(scope="module")
def wheel() -> dict[str, bytes]:
    with zipfile.ZipFile(WHEEL) as z:
        return {name: z.read(name) for name in z.namelist()}


def test_the_wheel_holds_the_package_its_stubs_and_the_module(wheel):
    sources = package_sources()
    assert {"lowbit/_core.pyi", "lowbit/py.typed", "lowbit/__init__.py"} <= set(sources)
    for name, data in sources.items():
        assert wheel.get(name) == data, f"{name} is missing from the wheel or differs"
    modules = [n for n in wheel if n.startswith("lowbit/_core.")
               and n.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))]
    assert len(modules) == 1, modules
    package = {n for n in wheel if n.startswith("lowbit/")}
    assert package == set(sources) | set(modules)  # no caches, no build leftovers
    info = next(n for n in wheel if n.endswith(".dist-info/entry_points.txt"))
    assert "lowbit = lowbit.cli:main" in wheel[info].decode()


def test_the_installed_package_is_the_wheel(wheel):
    dist = importlib.metadata.distribution("lowbit")
    record = next(n for n in wheel if n.endswith(".dist-info/RECORD"))
    in_wheel = {}
    for line in wheel[record].decode().splitlines():
        name, digest, _ = line.rsplit(",", 2)
        if name.startswith("lowbit/"):
            in_wheel[name] = digest
    installed = {str(f): f.hash.value for f in dist.files
                 if str(f).startswith("lowbit/") and f.hash is not None}
    assert {n: f"sha256={h}" for n, h in installed.items()} == in_wheel
    for name in in_wheel:
        assert record_hash(dist.locate_file(name).read_bytes()) == in_wheel[name], name


def test_the_installed_package_imports_and_types(tmp_path):
    # Out of the source and build trees and without PYTHONPATH: only the installed copy is seen.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.resources as r, lowbit, lowbit._core as c; "
            "p = r.files('lowbit'); "
            "print(lowbit.__file__); "
            "print(p.joinpath('py.typed').is_file(), p.joinpath('_core.pyi').is_file(), "
            "sorted(lowbit.formats()) == sorted(f.name for f in c.named_formats()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    location = Path(importlib.metadata.distribution("lowbit").locate_file("lowbit")).resolve()
    assert Path(out[0]).resolve().parent == location
    assert out[1] == "True True True"
    # The command the wheel declares, from where pip put it (on PATH or not).
    command = Path(sysconfig.get_path("scripts")) / "lowbit"
    version = subprocess.run([str(command), "--version"], cwd=tmp_path, env=env, check=True,
                             capture_output=True, text=True).stdout
    assert version.split() == ["lowbit", importlib.metadata.version("lowbit")]
