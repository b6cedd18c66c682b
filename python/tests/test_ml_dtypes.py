"""lowbit against ml_dtypes (nearest-even, non-saturating) for every format ml_dtypes has.

Where the two differ by design, the inputs fall in the classes of docs/ml_dtypes.md (mlref.py
recognizes them from the input alone), and there lowbit's documented result is checked instead,
whatever ml_dtypes says. Which classes each ml_dtypes release has is data
(oracle_versions.ML_DTYPES): for a tested release a test fails unless exactly the listed classes
occur; for any other release it reports the differences (a warning and an xfail), since a new
release of the oracle is a difference to document, not a failure of lowbit.
"""

from __future__ import annotations

import re
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import lowbit
import mlref
import oracle_versions

ALL = list(mlref.ML_TYPES)
ML = oracle_versions.ML_DTYPES
DOC = Path(__file__).resolve().parents[2] / "docs" / "ml_dtypes.md"


def check(cmp: mlref.Comparison, where: str) -> None:
    """lowbit's documented result first (a failure of lowbit whatever the oracle's version),
    then the classes against the table."""
    assert len(cmp.lowbit_wrong) == 0, (
        f"{where}: lowbit is not its documented result on class A/B inputs"
        f"{cmp.example(cmp.lowbit_wrong)}")
    oracle_versions.judge(ML, mlref.VERSION, cmp.problems(where))


# ---- every 16-bit input --------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ALL)
def test_every_16_bit_input(name, source):
    x = np.arange(1 << 16, dtype=np.uint16).view(mlref.ML_TYPES[source])
    check(mlref.Comparison(name, x, complete=True), f"{name} from every {source}")


# ---- the documented classes, one example set each --------------------------------------------


def _nans():
    return np.arange(0x7C01, 0x8000, dtype=np.uint16).view(np.float16)


def _e8m0_low():
    sub = np.arange(0x00400001, 0x00600000, dtype=np.uint32).view(np.float32)
    assert len(sub) == 2**21 - 1
    return sub


# key -> (format, input, lowbit's code, ml_dtypes' code where the version has the class); the
# examples are the first rows of each class's table in docs/ml_dtypes.md.
EXAMPLES = {
    "A": [(n, _nans, 0, 1 << (lowbit.format_info(n).bits - 1)) for n in mlref.SMALL]
    + [(n, lambda: -_nans(), 0, 0) for n in mlref.SMALL],
    "B": [("e8m0fnu", _e8m0_low, 0, 1)],
    "C": [("e4m3fn", lambda: np.array([2.0**-10 * (1 + 2.0**-40)]), 1, 0),
          ("bfloat16", lambda: np.array([2.0**-134 * (1 + 2.0**-40)]), 1, 0),
          ("e8m0fnu", lambda: np.array([1e-300, 2.0**-151]), 0, 0xFF)],
}


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_documented_class_occurs_in_the_versions_the_table_lists(key):
    has = key in ML.expected(mlref.VERSION)
    problems = []
    for name, make, ours_want, theirs_if_class in EXAMPLES[key]:
        x = make()
        ours = lowbit.cast(x, name)
        assert (ours == ours_want).all(), f"class {key}, {name}: lowbit is not {ours_want:#x}"
        theirs = mlref.ml_codes(x, name)
        want = theirs_if_class if has else ours_want
        if not (theirs == want).all():
            other = np.unique(theirs[theirs != want])
            problems.append(f"class {key}, {name}: ml_dtypes gives {[hex(int(c)) for c in other]}"
                            f" where the table says {want:#x} ({ML.row(key).doc})")
    oracle_versions.judge(ML, mlref.VERSION, problems)


def test_class_b_bounds_agree():
    # 2^-127 itself and the tie 1.5 * 2^-127 (to 2^-126, M = 0) are not in class B.
    edges = np.array([0x00400000, 0x00600000], np.uint32).view(np.float32)
    assert not mlref.class_b("e8m0fnu", edges).any()
    assert list(lowbit.cast(edges, "e8m0fnu")) == [0, 1]
    got = list(mlref.ml_codes(edges, "e8m0fnu"))
    oracle_versions.judge(ML, mlref.VERSION, [] if got == [0, 1] else [
        f"e8m0fnu at 2^-127 and 1.5 * 2^-127: ml_dtypes gives {got}, not [0, 1], a new difference"
        f" next to class B ({ML.row('B').doc})"])


def test_the_doc_lists_the_versions_of_the_table():
    """docs/ml_dtypes.md's table "Which version has which" says what oracle_versions says."""
    text = DOC.read_text()
    section = text[text.index("## Which version has which"):]
    section = section[: section.index("\n## ")]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[0] == "class" and header[1:] == list(ML.tested), header
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        key = re.match(r"([A-Z]\d?)\b", cells[0]).group(1)
        rows[key] = tuple(v for v, c in zip(ML.tested, cells[1:]) if c == "yes")
        assert all(c in ("yes", "no") for c in cells[1:]), ln
    assert rows == {r.key: r.versions for r in ML.rows}
    assert f"last checked with ml_dtypes {ML.tested[-1]}" in " ".join(text.split())


def test_an_untested_version_is_reported_not_failed(recwarn):
    with pytest.raises(pytest.xfail.Exception, match=r"ml_dtypes 9\.0\.0 is outside"):
        oracle_versions.judge(ML, "9.0.0", ["e4m3fn: class B occurs"])
    assert any(issubclass(w.category, oracle_versions.OracleChanged) for w in recwarn)
    newest = ML.tested[-1]
    with pytest.raises(pytest.fail.Exception, match=rf"ml_dtypes {re.escape(newest)} \(a tested"):
        oracle_versions.judge(ML, newest, ["e4m3fn: class B occurs"])
    oracle_versions.judge(ML, "9.0.0", [])  # nothing to report
    # Untested versions are compared with the nearest tested one below (or the oldest).
    assert ML.expected("0.6.5") == ML.expected("0.6.0") and ML.expected("0.1") == ML.expected(
        ML.tested[0])
    assert ML.is_tested("0.7.0") and not ML.is_tested("0.7.1")


# ---- float64: double-rounding traps and random values --------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_float64_double_rounding_traps(name, record_property):
    x, want = mlref.traps(name)
    got = lowbit.cast(x, name)
    wrong = [(float(v), hex(int(g)), hex(w)) for v, g, w in zip(x, got, want) if g != w]
    assert not wrong, f"{name}: lowbit not correctly rounded: {wrong[:10]}"
    if name != "float16":
        assert mlref.class_c(name, x).all()  # every trap is a class C input by construction
    # Recorded: how often ml_dtypes' answer differs, and whether it went through float32.
    theirs = mlref.ml_codes(x, name)
    with np.errstate(over="ignore"):
        through_float32 = mlref.ml_codes(x.astype(np.float32), name)
    differs = int(np.sum(theirs != got))
    record_property("ml_dtypes_wrong_at_traps", f"{differs} of {len(x)}")
    record_property("ml_dtypes_equals_float32_path", bool(np.array_equal(theirs, through_float32)))
    print(f"{name}: ml_dtypes {mlref.VERSION} differs at {differs} of {len(x)} traps; "
          f"same as via float32: {np.array_equal(theirs, through_float32)}")
    check(mlref.Comparison(name, x, complete=True), f"{name} at the float64 traps")


def random_doubles(name: str, n: int, seed: int) -> np.ndarray:
    info = lowbit.format_info(name)
    rng = np.random.default_rng(seed)
    lo_e = int(np.log2(info.min_subnormal)) - 3
    hi_e = int(np.log2(info.max)) + 2
    mags = np.ldexp(1 + rng.random(n), rng.integers(lo_e, hi_e + 1, n))
    bits = rng.integers(0, 2**63, n // 8, dtype=np.int64).view(np.float64)  # anything at all
    with np.errstate(over="ignore", invalid="ignore"):  # Inf and NaN are wanted inputs
        x = np.concatenate([mags, bits, np.float32(mags[: n // 4]).astype(np.float64)])
        return x * rng.choice([-1.0, 1.0], len(x))


@pytest.mark.parametrize("name", ALL)
def test_random_doubles(name):
    x = random_doubles(name, 40_000, seed=zlib.crc32(name.encode()))
    check(mlref.Comparison(name, x, complete=False), f"{name} at random doubles")


# ---- every float32 input ------------------------------------------------------------------------

CHUNK = 1 << 24
WORKERS = 2  # the CI machine's cores; ml_dtypes and lowbit both release the GIL


def sweep_float32(name: str) -> None:
    base = np.arange(CHUNK, dtype=np.uint32)

    def chunk(c: int) -> mlref.Comparison | None:
        x = (base + np.uint32(c * CHUNK)).view(np.float32)
        ours = lowbit.cast(x, name, threads=0)
        theirs = mlref.ml_codes(x, name)
        if np.array_equal(ours, theirs):
            return None, mlref.exercised_by(name, x)
        idx = np.nonzero(ours != theirs)[0]
        return mlref.Comparison(name, x[idx], complete=False), mlref.exercised_by(name, x)

    start = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(chunk, range((1 << 32) // CHUNK)))
    cmps = [c for c, _ in results if c is not None]
    seen = set().union(*(c.seen for c in cmps))
    exercised = set().union(*(e for _, e in results))
    documented = sum(int(np.sum(~mlref.agree(name, c.x, c.ours, c.theirs))) - len(c.unexplained)
                     for c in cmps)
    print(f"{name}: every float32 input in {time.perf_counter() - start:.1f} s, "
          f"{documented} disagreements in documented classes ({sorted(seen)}) skipped")
    wrong = [i for c in cmps for i in c.x[c.lowbit_wrong].view(np.uint32)[:10]]
    assert not wrong, f"{name}: lowbit not its documented result at {[hex(b) for b in wrong]}"
    unexplained = [b for c in cmps for b in c.x[c.unexplained].view(np.uint32)[:10]]
    count = sum(len(c.unexplained) for c in cmps)
    example = f", at float32 bit patterns {[hex(b) for b in unexplained[:20]]}" if count else ""
    oracle_versions.judge(ML, mlref.VERSION, oracle_versions.class_problems(
        ML, mlref.VERSION, f"{name} from every float32", seen, exercised, count, example))


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", mlref.EIGHT_BIT + mlref.NEWER)
def test_every_float32_input(name):
    sweep_float32(name)

