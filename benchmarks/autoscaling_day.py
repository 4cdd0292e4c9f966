"""Resident vs on demand over a day: cost per million, P99 and cold starts for fixed 1/2/4
replicas, Ray Serve's target policy and Knative's concurrency policy with scale to zero
(the course lesson's comparison, :mod:`sim.experiments.day`), with several seeds.

Usage: python benchmarks/autoscaling_day.py [--seeds 3] [--cold-start-s 10] [--day-s 1200]
       [--mean-rps 60]
Writes benchmarks/results/autoscaling_day.md and .json (config, versions and machine inside).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.experiments.day import DAY_CONFIGS, compare_day, day_scenario  # noqa: E402
from sim.metrics.rundir import versions  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
COLUMNS = ["cost_per_million_usd", "p50_ms", "p99_ms", "goodput_share", "replicas_mean",
           "replicas_max", "cold_starts", "cold_start_waits", "cold_start_tail_share"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cold-start-s", type=float, default=10.0)
    ap.add_argument("--mean-rps", type=float, default=60.0)
    ap.add_argument("--day-s", type=float, default=1200.0)
    args = ap.parse_args()
    knobs = {"cold_start_s": args.cold_start_s, "mean_rps": args.mean_rps,
             "day_s": args.day_s}
    t0 = time.perf_counter()
    per_seed = [compare_day(seed=seed, **knobs)[0] for seed in range(args.seeds)]
    took = time.perf_counter() - t0
    lines = ["# Resident vs on demand over a day", "",
             f"Machine: {platform.machine()}, {platform.python_version()}; simulated (no "
             f"device). One 'day' of {args.day_s:g} s: a sinusoid from 0 req/s at night "
             f"to {2 * args.mean_rps:g} req/s at the peak (mean {args.mean_rps:g}), "
             "builtin:minilm-cpu replicas (~65 req/s each), dynamic batching (max 8, 5 ms), "
             f"one shared queue, {args.cold_start_s:g} s cold start per new replica, 1 USD "
             f"per replica-hour, SLO 500 ms. Mean over {args.seeds} seeds (± the standard "
             f"error where it is not 0); took {took:.1f} s.", "",
             "| fleet | USD / million | P50 ms | P99 ms | within SLO | replicas mean / max "
             "| cold starts | waited on a cold start | their share of the P99 tail |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary = []
    for i, name in enumerate(DAY_CONFIGS):
        rows = [seed_rows[i] for seed_rows in per_seed]
        mean = {c: float(np.mean([r[c] for r in rows])) for c in COLUMNS}
        se = {c: (float(np.std([r[c] for r in rows], ddof=1)) / np.sqrt(len(rows))
                  if len(rows) > 1 else 0.0) for c in COLUMNS}

        def cell(col: str, digits: int, mean=mean, se=se) -> str:
            text = f"{mean[col]:,.{digits}f}"
            return text + (f" ± {se[col]:,.{digits}f}" if se[col] > 0 else "")

        lines.append(f"| {name} | {cell('cost_per_million_usd', 2)} | {cell('p50_ms', 0)} | "
                     f"{cell('p99_ms', 0)} | {100 * mean['goodput_share']:.1f}% | "
                     f"{mean['replicas_mean']:.2f} / {mean['replicas_max']:.0f} | "
                     f"{cell('cold_starts', 1)} | {cell('cold_start_waits', 0)} | "
                     f"{100 * mean['cold_start_tail_share']:.0f}% |")
        summary.append({"fleet": name, "mean": mean, "se": se, "per_seed": rows})
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "autoscaling_day.md").write_text(text)
    config = {name: day_scenario(fleet, **knobs) for name, fleet in DAY_CONFIGS.items()}
    (RESULTS / "autoscaling_day.json").write_text(json.dumps(
        {"args": vars(args), "versions": versions(), "machine": platform.platform(),
         "scenarios": config, "results": summary}, indent=1, default=float) + "\n")
    print(text)


if __name__ == "__main__":
    main()
