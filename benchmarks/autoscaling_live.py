"""Autoscaling live vs simulated on MiniLM: the measured cold start and the tail it causes.

1. Time ``--load-reps`` cold starts of all-MiniLM-L6-v2 on this CPU (build the runner, load
   the weights, first forward: ``calibration.cold_start``) and add them to a copy of
   builtin:minilm-cpu as ``load_samples_s``.
2. ``servelab compare`` (probed) on a burst: 5 s at 15 req/s, 10 s at 100 req/s (1.5x one
   replica), 10 s at 10 req/s; Ray Serve's target policy, 1..2 replicas. The simulator draws
   each new replica's cold start from the measured samples; live loads the model for real.

Usage: python benchmarks/autoscaling_live.py [--repeats 2] [--load-reps 5]
Writes benchmarks/results/autoscaling_live-cpu.md and .json, and the profile it used
(autoscaling_live-minilm-cpu.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.cold_start import measure_load  # noqa: E402
from calibration.profile import load_profile  # noqa: E402
from executor.compare import compare  # noqa: E402
from sim.metrics.rundir import versions  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--load-reps", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    load = measure_load("minilm", reps=args.load_reps, device="cpu", threads=1)
    base = load_profile("builtin:minilm-cpu")
    profile = dataclasses.replace(base, load_samples_s=np.asarray(load["samples_s"]),
                                  meta={**base.meta, "load": {k: v for k, v in load.items()
                                                              if k != "samples_s"}})
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = profile.save(RESULTS / "autoscaling_live-minilm-cpu.json")
    times = np.concatenate([np.arange(0, 5, 1 / 15), 5 + np.arange(0, 10, 1 / 100),
                            15 + np.arange(0, 10, 1 / 10)])
    trace = Path("/tmp/servelab-autoscaling-live/burst.csv")
    trace.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"t": times}).to_csv(trace, index=False)
    scenario = {"name": "autoscaling-live", "seed": 4,
                "service": {"kind": "profile", "path": str(path)},
                "workload": {"kind": "trace", "path": str(trace), "timestamp_column": "t"},
                "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5},
                "price_per_replica_hour": 1.0, "warmup_s": 0.0,
                "autoscaling": {"kind": "target", "min_replicas": 1, "max_replicas": 2,
                                "target_ongoing_requests": 2, "upscale_delay_s": 1,
                                "downscale_delay_s": 3, "look_back_period_s": 2,
                                "control_period_s": 0.5}}
    data = compare(scenario, "/tmp/servelab-autoscaling-live/compare", repeats=args.repeats,
                   force=True)
    took = time.perf_counter() - t0
    totals = np.asarray(load["samples_s"])
    build = np.asarray(load["phases_s"]["build_s"])
    first = np.asarray(load["phases_s"]["first_forward_s"])
    lines = ["# Autoscaling live vs simulated (MiniLM on CPU)", "",
             f"Machine: {platform.machine()}; took {took / 60:.1f} min. Cold start measured "
             f"{args.load_reps} times in-process (1 thread): median {np.median(totals):.3f} s "
             f"(min {totals.min():.3f}, max {totals.max():.3f}); build + weights "
             f"{np.median(build):.3f} s, first forward {np.median(first):.3f} s (medians). "
             f"Burst: 5 s at 15 req/s, 10 s at 100 req/s, 10 s at 10 req/s; target policy, "
             f"1..2 replicas; {args.repeats} live runs, predictions on the probed profile.",
             "", "| metric | sim | live median | error | live min–max |",
             "|---|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(f"| {r['label']} | {r['sim']:.4g} | {r['live_median']:.4g} | "
                     f"{100 * r['rel_error']:+.1f}% | {r['live_min']:.4g}–{r['live_max']:.4g} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / "autoscaling_live-cpu.md").write_text(text)
    (RESULTS / "autoscaling_live-cpu.json").write_text(json.dumps(
        {"load": load, "scenario": scenario, "rows": data["rows"], "versions": versions(),
         "machine": platform.platform()}, indent=1, default=float) + "\n")
    print(text)


if __name__ == "__main__":
    main()
