"""Drift probe: is a model's batch-1 latency stable over time and after idle gaps?

Runs the same 60 minilm payloads in blocks — back to back, or each after an idle gap — in a
fixed order, and prints each block's median. Used to explain sim-vs-live errors: if the
blocks differ by more than the fidelity targets, the latency model cannot be better than that
on this machine.

Usage: python benchmarks/drift_probe.py [--threads 1]
Writes benchmarks/results/drift_probe.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.model_runners import build_runner  # noqa: E402

BLOCKS = [("back to back", 0.0), ("each after 5 ms idle", 0.005),
          ("each after 30 ms idle", 0.03), ("each after 200 ms idle", 0.2),
          ("back to back again", 0.0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    runner = build_runner("minilm", device="cpu", threads=args.threads)
    rng = np.random.default_rng(0)
    payloads = [runner.payloads(1, rng) for _ in range(60)]
    for p in payloads[:10]:
        runner.run_batch(p)
    t_start = time.perf_counter()
    lines = ["# Drift probe: minilm batch 1 on CPU", "",
             f"Machine: {platform.processor() or platform.machine()}; {args.threads} thread(s); "
             "the same 60 payloads in every block, blocks in this order.", "",
             "| block | starts at s | median ms | mean ms |", "|---|---:|---:|---:|"]
    for label, gap_s in BLOCKS:
        began = time.perf_counter() - t_start
        times = []
        for p in payloads:
            if gap_s:
                time.sleep(gap_s)
            t0 = time.perf_counter()
            runner.run_batch(p)
            times.append((time.perf_counter() - t0) * 1e3)
        lines.append(f"| {label} | {began:.1f} | {statistics.median(times):.2f} | "
                     f"{np.mean(times):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "benchmarks" / "results" / "drift_probe.md").write_text(text)


if __name__ == "__main__":
    main()
