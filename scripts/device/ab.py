#!/usr/bin/env python3
"""Interleaved A/B of two builds of a Google Benchmark binary on one machine.

    python3 scripts/device/ab.py OUT.json --a OLD_BINARY --b NEW_BINARY --filter REGEX [--rounds 4]
                                 [-- more arguments for both binaries]

One run of each binary per round, in the order A B B A, B A A B, ... (each binary runs first as
often as last, so a drift of the machine over the session, clocks or temperature, weighs on both
alike). Per benchmark row: the median time of each binary over the rounds, their spread (min and
max), and B / A. A single run of each can mislead: on the H100 of 2026-12-05 the rows of code
that two builds shared moved by 6-12 % from one run to the next, which only repeated, interleaved
runs tell apart from a change. Prints a table and writes every run's times to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def run_once(binary: str, filt: str, extra: list[str]) -> dict[str, float]:
    """The rows' times in milliseconds (real_time, which is the manual time where a row sets it)."""
    cmd = [binary, f"--benchmark_filter={filt}", "--benchmark_format=json", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    rows = {}
    for b in json.loads(done.stdout)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        rows[b["name"]] = b["real_time"] * scale[b.get("time_unit", "ns")]
    return rows


def order(rounds: int) -> list[str]:
    """A B B A B A A B ...: each binary first in half of the rounds."""
    out = []
    for r in range(rounds):
        out += ["a", "b"] if r % 2 == 0 else ["b", "a"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--a", required=True, help="the baseline binary")
    ap.add_argument("--b", required=True, help="the changed binary")
    ap.add_argument("--filter", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    a, extra = ap.parse_known_args(argv)
    a.extra = [x for x in extra if x != "--"]
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for side in order(a.rounds):
        runs[side].append(run_once(a.a if side == "a" else a.b, a.filter, a.extra))
    names = [n for n in runs["a"][0] if all(n in r for r in runs["a"] + runs["b"])]
    if not names:
        print("no benchmark row ran in both binaries", file=sys.stderr)
        return 1
    rows = []
    for n in names:
        ta = [r[n] for r in runs["a"]]
        tb = [r[n] for r in runs["b"]]
        ma, mb = statistics.median(ta), statistics.median(tb)
        rows.append({"name": n, "a_ms": ta, "b_ms": tb, "a_median": ma, "b_median": mb,
                     "b_over_a": mb / ma})
    width = max(len(r["name"]) for r in rows)
    print(f"{'row':{width}s}  {'A median':>9s} {'A min-max':>15s}  {'B median':>9s} "
          f"{'B min-max':>15s}  {'B / A':>6s}")
    for r in rows:
        print(f"{r['name']:{width}s}  {r['a_median']:9.3f} {min(r['a_ms']):7.3f}-"
              f"{max(r['a_ms']):<7.3f}  {r['b_median']:9.3f} {min(r['b_ms']):7.3f}-"
              f"{max(r['b_ms']):<7.3f}  {r['b_over_a']:6.3f}")
    with open(a.out, "w") as f:
        json.dump({"a": a.a, "b": a.b, "filter": a.filter, "rounds": a.rounds, "rows": rows}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
