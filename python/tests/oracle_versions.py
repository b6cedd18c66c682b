"""The outside oracles' versions: which releases the tests were run with, and which documented
differences from lowbit each release has (docs/ml_dtypes.md, "Which version has which").

An oracle is written by other people and moves: a new release may fix a difference or make a new
one. lowbit's own results never depend on it (docs/rounding.md is the specification; the tests
check lowbit's documented result on every input of a difference class whatever the oracle does).
What the oracle's version decides is how a change in the oracle is reported:

- an installed version that was run (TESTED): the differences a test sees must be exactly the
  ones this table lists for it; anything else fails, naming the row of docs/ml_dtypes.md to
  update;
- any other version: the test reports what it found (an OracleChanged warning and an xfail with
  the same message), because a new release of someone else's library is a difference to
  document, not a failure of lowbit.

`expected(...)` for a version that was not run takes the nearest run version below it (or the
oldest one), so that the report lists what changed against the closest known behaviour.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import pytest


class OracleChanged(UserWarning):
    """An oracle outside its tested versions differs from what the table says."""


def version_key(v: str) -> tuple[int, ...]:
    """(major, minor, patch) of a release string; local and pre-release parts are ignored
    ("2.11.0+cu130" is 2.11.0)."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", v)
    if not m:
        raise ValueError(f"version {v!r}: not of the form major.minor.patch")
    return tuple(int(p or 0) for p in m.groups())


@dataclass(frozen=True)
class Row:
    """A class of inputs where an oracle's result differs from lowbit's."""

    key: str  # the letter of the class in the doc
    doc: str  # where it is described: file and section heading
    versions: tuple[str, ...]  # the run versions that have it


@dataclass(frozen=True)
class Oracle:
    name: str
    tested: tuple[str, ...]  # every version the tests were run with, oldest first
    rows: tuple[Row, ...]

    def is_tested(self, version: str) -> bool:
        return any(version_key(version) == version_key(t) for t in self.tested)

    def nearest(self, version: str) -> str:
        below = [t for t in self.tested if version_key(t) <= version_key(version)]
        return below[-1] if below else self.tested[0]

    def expected(self, version: str) -> frozenset[str]:
        """The classes the table gives the version (the nearest run version's if not run)."""
        v = version if self.is_tested(version) else self.nearest(version)
        return frozenset(r.key for r in self.rows if any(version_key(v) == version_key(t)
                                                          for t in r.versions))

    def row(self, key: str) -> Row:
        return next(r for r in self.rows if r.key == key)

    def range_text(self) -> str:
        return f"{self.name} {', '.join(self.tested)}"


ML_DTYPES_DOC = "docs/ml_dtypes.md"

ML_DTYPES = Oracle(
    name="ml_dtypes",
    # Every release from 0.5.4 to 0.7.0, each run with numpy 2.4.6: all of test_ml_dtypes.py
    # but the exhaustive float32 sweeps with each; the sweeps of every 8-bit format with 0.7.0,
    # of e8m0fnu (the one format where they differ between these releases) with 0.6.0 and 0.5.4.
    tested=("0.5.4", "0.6.0", "0.7.0"),
    rows=(
        Row("A", f"{ML_DTYPES_DOC}, A. NaN into FP6 and FP4", ("0.5.4", "0.6.0", "0.7.0")),
        Row("B", f"{ML_DTYPES_DOC}, B. E8M0 inputs just above 2^-127", ("0.5.4", "0.6.0")),
        Row("C", f"{ML_DTYPES_DOC}, C. float64 inputs rounded twice", ("0.5.4", "0.6.0")),
    ),
)

TORCH = Oracle(
    name="torch",
    tested=("2.11.0",),  # with numpy 2.4.6, CPU tensors
    rows=(
        Row("P1", f"{ML_DTYPES_DOC}, P1. Negative inputs into E8M0", ("2.11.0",)),
        Row("P2", f"{ML_DTYPES_DOC}, P2. Zeros into E8M0", ("2.11.0",)),
        Row("P3", f"{ML_DTYPES_DOC}, P3. E8M0 inputs just above 2^-127", ("2.11.0",)),
        Row("P4", f"{ML_DTYPES_DOC}, P4. float64 inputs rounded twice", ("2.11.0",)),
        Row("P5", f"{ML_DTYPES_DOC}, P5. The sign of a NaN into bfloat16", ("2.11.0",)),
    ),
)


def installed_version(module) -> str:
    return str(getattr(module, "__version__", "0"))


def judge(oracle: Oracle, version: str, problems: list[str]) -> None:
    """Fail on problems for a tested version; report them for any other version."""
    if not problems:
        return
    text = "\n".join(problems)
    if oracle.is_tested(version):
        pytest.fail(f"{oracle.name} {version} (a tested version) differs from the table in "
                    f"python/tests/oracle_versions.py:\n{text}", pytrace=False)
    message = (f"{oracle.name} {version} is outside the tested versions ({oracle.range_text()}); "
               f"compared with {oracle.nearest(version)}'s row, differences to document:\n{text}")
    warnings.warn(OracleChanged(message), stacklevel=2)
    pytest.xfail(message)


def class_problems(oracle: Oracle, version: str, where: str, seen: set[str],
                   exercised: set[str], unexplained: int, example: str = "") -> list[str]:
    """The messages for one comparison: `seen` classes with disagreements, `exercised` classes
    whose every input was compared (so that a documented class must show), and the number of
    disagreements outside every class."""
    expected = oracle.expected(version)
    out = []
    for key in sorted(seen - expected):
        out.append(f"{where}: class {key} occurs, but the table says {version} does not have it: "
                   f"add {version} to row {key} ({oracle.row(key).doc})")
    for key in sorted((expected & exercised) - seen):
        out.append(f"{where}: class {key} no longer occurs: remove {version} from row {key} "
                   f"({oracle.row(key).doc})")
    if unexplained:
        out.append(f"{where}: {unexplained} disagreements outside every documented class, a new "
                   f"difference: describe it in a new row of {ML_DTYPES_DOC} and of "
                   f"python/tests/oracle_versions.py{example}")
    return out
