"""Sweep scaling: 200 runs of 100k requests at 1 and 2 local workers and on a 2-worker Dask
LocalCluster; speed-up relative to 1 worker (target >= 1.8x at 2 workers).

Usage: python benchmarks/sweep_scaling.py [--runs 200] [--requests 100000]
Writes benchmarks/results/sweep_scaling.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.experiments import sweep  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--requests", type=int, default=100_000)
    args = ap.parse_args()
    base = {"service": {"kind": "linear", "base_ms": 2, "per_item_ms": 0.5, "cv": 0.3},
            "workload": {"kind": "poisson", "rate_rps": 1000, "n_requests": args.requests},
            "policy": {"kind": "greedy", "max_batch_size": 8}}
    rates = [600 + 10 * i for i in range(args.runs // 2)]
    grid = {"workload.rate_rps": rates}
    seeds = 2
    timings = {}
    frames = {}
    for label, kwargs in [("1 local worker", {"workers": 1}),
                          ("2 local workers", {"workers": 2})]:
        t0 = time.perf_counter()
        frames[label] = sweep(base, grid, seeds, **kwargs)
        timings[label] = time.perf_counter() - t0
        print(f"{label}: {timings[label]:.1f} s", flush=True)
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        t0 = time.perf_counter()
        frames["Dask LocalCluster, 2 workers"] = sweep(base, grid, seeds,
                                                       dask=cluster.scheduler_address)
        timings["Dask LocalCluster, 2 workers"] = time.perf_counter() - t0
    one = timings["1 local worker"]
    same = all(frames[k].drop(columns="wall_s").equals(
        frames["1 local worker"].drop(columns="wall_s")) for k in frames)
    lines = ["# Sweep scaling", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"{len(rates) * seeds} runs of {args.requests:,} requests (greedy batching, "
             f"linear service); one run of this script.", "",
             "| executor | wall s | speed-up vs 1 worker |", "|---|---:|---:|"]
    for label, wall in timings.items():
        lines.append(f"| {label} | {wall:.1f} | {one / wall:.2f}x |")
    lines += ["", f"Rows identical across executors (same seeds): {'yes' if same else 'NO'}."]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sweep_scaling.md").write_text(text)


if __name__ == "__main__":
    main()
