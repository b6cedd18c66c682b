"""CPU cast float32 -> e4m3fn (nearest-even, saturating as ml_dtypes is not: see below) with
Google Benchmark, as a ratio to ml_dtypes' ``astype`` on the same data size in the same run.

Usage: python3 bench/cpu_vs_ml_dtypes.py BUILD_DIR [--json OUT.json]

BUILD_DIR holds bench/lowbit_bench_cast_cpu (any preset with LOWBIT_ENABLE_BENCH=ON; `bench` is
the Release one). The benchmark binary and ml_dtypes are run alternately, three rounds each, and
the median of each is compared, so that drifting machine load hits both sides alike.

ml_dtypes' astype rounds to nearest-even and is non-saturating for e4m3fn (out-of-range values
become NaN); lowbit's benchmark row `cast_f32/e4m3fn/nearest_even` is the same operation (the
policy is nearest-even, non-saturating, subnormals kept). The data is Gaussian (std 1), 2^24
values (64 MiB in, 16 MiB out), past every cache level.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def lowbit_ms(binary: str, threads: int) -> float:
    flt = f"^cast_f32/e4m3fn/nearest_even/{1 << 24}/{threads}/real_time$"
    out = subprocess.run(
        [binary, f"--benchmark_filter={flt}", "--benchmark_format=json",
         "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true"],
        check=True, capture_output=True, text=True).stdout
    rows = [b for b in json.loads(out)["benchmarks"] if b.get("aggregate_name") == "median"]
    if len(rows) != 1:
        sys.exit(f"benchmark row {flt} not found in {binary}")
    row = rows[0]
    scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[row["time_unit"]]
    return row["real_time"] * scale


def ml_dtypes_ms(x: np.ndarray, reps: int = 7) -> float:
    import ml_dtypes

    t = ml_dtypes.float8_e4m3fn
    x.astype(t)  # warm-up (page faults of the first output)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.astype(t)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--json")
    args = ap.parse_args()
    binary = os.path.join(args.build_dir, "bench", "lowbit_bench_cast_cpu")
    x = np.random.default_rng(42).standard_normal(1 << 24).astype(np.float32)
    lb1, lb2, ml = [], [], []
    for _ in range(3):
        lb1.append(lowbit_ms(binary, 1))
        ml.append(ml_dtypes_ms(x))
        lb2.append(lowbit_ms(binary, 2))
    res = {
        "n": 1 << 24,
        "lowbit_1thread_ms": statistics.median(lb1),
        "lowbit_2threads_ms": statistics.median(lb2),
        "ml_dtypes_astype_ms": statistics.median(ml),
        "cpus": os.cpu_count(),
    }
    res["ratio_1thread"] = res["ml_dtypes_astype_ms"] / res["lowbit_1thread_ms"]
    res["ratio_2threads"] = res["ml_dtypes_astype_ms"] / res["lowbit_2threads_ms"]
    print(f"float32 -> e4m3fn nearest-even, 2^24 values, {res['cpus']} CPUs")
    print(f"  ml_dtypes astype        {res['ml_dtypes_astype_ms']:8.2f} ms")
    print(f"  lowbit 1 thread         {res['lowbit_1thread_ms']:8.2f} ms   "
          f"{res['ratio_1thread']:.2f}x ml_dtypes")
    print(f"  lowbit 2 threads        {res['lowbit_2threads_ms']:8.2f} ms   "
          f"{res['ratio_2threads']:.2f}x ml_dtypes")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
