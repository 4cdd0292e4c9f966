"""Calibration stability: calibrate minilm repeatedly on CPU and compare medians per size.

Three sweeps in one run: two with the same seed (the same payloads: the difference is the
machine's own noise) and, for the time target, one with the CLI defaults (torch's default
thread count). The per-size standard error of each median (from its samples) is shown next
to the difference, because minilm's requests vary in length (CV ~0.3 at batch 1), so a
30-sample median is itself uncertain by several percent. Targets: medians within 3% between
runs; a default minilm calibration (1-64, 30 reps) under 2 minutes.

Usage: python benchmarks/calibration_stability.py [--threads 1] [--reps 30]
Writes benchmarks/results/calibration_stability.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.measure import calibrate, parse_batch_sizes  # noqa: E402
from calibration.model_runners import build_runner  # noqa: E402
from calibration.profile import profile_summary  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batch-sizes", default="1-64")
    args = ap.parse_args()
    sizes = parse_batch_sizes(args.batch_sizes)
    runner = build_runner("minilm", device="cpu", threads=args.threads)
    runs = []
    for _ in range(2):
        t0 = time.perf_counter()
        result = calibrate(runner, sizes, reps=args.reps, seed=0)
        assert result.profile is not None
        runs.append((result.profile, time.perf_counter() - t0))
    # CLI defaults in a fresh process: torch.set_num_threads above is process-wide
    import subprocess

    t0 = time.perf_counter()
    subprocess.run(["servelab", "calibrate", "--model", "minilm", "--device", "cpu",
                    "--batch-sizes", args.batch_sizes, "--reps", str(args.reps), "--out",
                    "/tmp/servelab-default-calibration.json"], check=True,
                   capture_output=True)
    default_s = time.perf_counter() - t0
    default_threads = "default"
    (a, ta), (b, tb) = runs
    se_a = {r["batch_size"]: r["se_median_pct"] for r in profile_summary(a)}
    se_b = {r["batch_size"]: r["se_median_pct"] for r in profile_summary(b)}
    lines = ["# Calibration stability: minilm on CPU", "",
             f"Machine: {platform.processor() or platform.machine()}; sizes "
             f"{args.batch_sizes}; {args.reps} reps; shuffled order; both sweeps seed 0 "
             f"(identical payloads) at {args.threads} thread(s).", "",
             f"Wall time: default calibration (`servelab calibrate --model minilm`, torch's "
             f"{default_threads} threads, incl. model load) {default_s:.1f} s; at "
             f"{args.threads} thread(s) {ta:.1f} s and "
             f"{tb:.1f} s (target < 120 s).", "",
             "| batch | median 1 ms | median 2 ms | difference | ±se 1 | ±se 2 | CV 1 | CV 2 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    diffs = []
    for size in sizes:
        s1, s2 = a.samples_s[size], b.samples_s[size]
        m1, m2 = float(np.median(s1)), float(np.median(s2))
        diff = (m2 - m1) / m1
        diffs.append(abs(diff))
        lines.append(f"| {size} | {m1 * 1e3:.2f} | {m2 * 1e3:.2f} | {100 * diff:+.1f}% | "
                     f"{se_a[size]:.1f}% | {se_b[size]:.1f}% | "
                     f"{np.std(s1) / np.mean(s1):.3f} | {np.std(s2) / np.mean(s2):.3f} |")
    d = np.array(diffs)
    lines += ["", f"|median difference|: mean {100 * d.mean():.1f}%, max {100 * d.max():.1f}%; "
              f"within 3% for {int((d <= 0.03).sum())}/{d.size} sizes."]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "calibration_stability.md").write_text(text)


if __name__ == "__main__":
    main()
