"""PyTorch eager baselines for the GPU benchmarks, timed with CUDA events in the same session.

Prints and writes JSON: for each operation the median time (ms) over repeated runs on 2^28
float32 Gaussian values (1 GiB), and the device-to-device copy bandwidth measured by PyTorch.
Ratios against lowbit's kernels are formed from times of the same operation on the same data.
The baselines of SRAM-quantiles are a full sort of the 2^28 values and torch.quantile of 256
quantiles, which refuses more than 2^24 values and so runs on the first 2^24; both are also
given as input values per second (G = 1e9), the unit of lowbit's sram_quantiles row.
"""
import json
import sys

import torch


def median_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main(out_path):
    n = 1 << 28
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(n, device="cuda", generator=g) * 2.0
    y = torch.empty_like(x)
    res = {}
    res["copy_d2d_f32_ms"] = median_ms(lambda: y.copy_(x))
    res["copy_GBps"] = 2 * 4 * n / res["copy_d2d_f32_ms"] / 1e6
    f8 = torch.float8_e4m3fn
    res["to_e4m3fn_ms"] = median_ms(lambda: x.to(f8))
    res["current_scaling_e4m3fn_ms"] = median_ms(lambda: (x * (448.0 / x.abs().max())).to(f8))
    c = x.to(f8)
    res["e4m3fn_to_f32_ms"] = median_ms(lambda: c.to(torch.float32))
    m = x.view(-1, 4096)
    res["rows_int8_4096_ms"] = median_ms(
        lambda: (m * (127.0 / m.abs().amax(dim=1, keepdim=True))).round().clamp(-127, 127).to(torch.int8))
    blk = x.view(-1, 32)
    res["mxfp8_eager_ms"] = median_ms(
        lambda: (blk / torch.exp2(torch.floor(torch.log2(blk.abs().amax(dim=1, keepdim=True))) - 8)).to(f8))
    res["sort_2e28_ms"] = median_ms(lambda: torch.sort(x), reps=5)
    res["sort_2e28_Gvalues_per_s"] = n / res["sort_2e28_ms"] / 1e6
    # The quantile positions of the SRAM estimator's chunks: (2i + 1) / (2k), i < k = 256.
    nq = 1 << 24
    q = (torch.arange(256, device="cuda", dtype=torch.float32) + 0.5) / 256
    xq = x[:nq]
    res["quantile256_2e24_ms"] = median_ms(lambda: torch.quantile(xq, q), reps=10)
    res["quantile256_2e24_Gvalues_per_s"] = nq / res["quantile256_2e24_ms"] / 1e6
    for k, v in res.items():
        print(f"{k:32s} {v:10.3f}")
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "torch_baselines.json")
