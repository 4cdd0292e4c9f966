"""Measure three decoder shapes' step times in one shuffled session, for the roofline
validation (``benchmarks/roofline.py``) and the shipped CPU coefficient set.

The three shapes (``tiny``: d 256, 4 layers; ``small``: d 512, 4 layers, the builtin
``llm-small-cpu`` shape; ``wide``: d 768, 6 layers) run the same grid of step compositions,
all their repetitions shuffled together, so that what the shared machine does meanwhile falls
on the three alike instead of on whichever shape ran last. Each step is timed twice: the
wall clock, and the calling thread's CPU time (torch runs one thread inline, so its CPU time
is the step's compute without the time other processes took the core: on a 2-core machine
shared with other jobs the wall clock of a step varied 3× between sessions, its CPU time far
less). The profiles store the CPU time; ``meta.wall_over_cpu`` records the ratio.

Usage: python benchmarks/roofline_measure.py [--reps 3] [--seed 0]
Writes benchmarks/results/roofline_cpu/{tiny,small,wide}.json (step profiles: servelab fit
reads them).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from calibration.step_measure import build_decoder, entries_for  # noqa: E402
from calibration.step_profile import StepProfile  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "roofline_cpu"
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 768},
    "small": {},
    "wide": {"hidden": 768, "layers": 6, "heads": 12, "kv_heads": 4, "intermediate": 2048},
}
PREFILL = (0, 16, 64, 256, 512)
DECODES = (0, 1, 4, 8, 16)
CONTEXT = (128, 512, 1024)
CHUNKS = ((64, 256), (64, 1024), (256, 256), (256, 1024))  # (tokens, start) of a later chunk


def grid_points() -> list[tuple[int, int, int, int]]:
    """(P, D, L, start) of every measured step: the grid, then the prefix chunks."""
    points = []
    for p in PREFILL:
        for d in DECODES:
            if d == 0:
                if p:
                    points.append((p, 0, CONTEXT[0], 0))
                continue
            points.extend((p, d, ctx, 0) for ctx in CONTEXT)
    return points + [(n, 0, CONTEXT[0], start) for n, start in CHUNKS]


def main() -> None:
    """Measure and write the three profiles."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    decoders = {name: build_decoder("small", params, "cpu", "fp32", 1)
                for name, params in SHAPES.items()}
    points = grid_points()
    jobs = [(name, k) for name in SHAPES for k in range(len(points)) for _ in range(args.reps)]
    rng = np.random.default_rng(args.seed)
    rng.shuffle(jobs)
    for dec in decoders.values():  # one untimed run of every point first
        for p, d, ctx, start in points:
            dec.step(entries_for(p, d, ctx, start))
    cpu: dict[str, list[list[float]]] = {n: [[] for _ in points] for n in SHAPES}
    wall: dict[str, list[list[float]]] = {n: [[] for _ in points] for n in SHAPES}
    t_start = time.perf_counter()
    with torch.inference_mode():
        for i, (name, k) in enumerate(jobs):
            entries = entries_for(*points[k])
            w0, c0 = time.perf_counter(), time.thread_time()
            decoders[name].step(entries)
            cpu[name][k].append(time.thread_time() - c0)
            wall[name][k].append(time.perf_counter() - w0)
            if (i + 1) % 200 == 0:
                print(f"{i + 1}/{len(jobs)} steps, {time.perf_counter() - t_start:.0f} s",
                      flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, dec in decoders.items():
        samples, chunks = {}, {}
        for k, (p, d, ctx, start) in enumerate(points):
            if start:
                chunks[f"{p},{start}"] = cpu[name][k]
                continue
            samples[StepProfile.key(p, d, ctx)] = cpu[name][k]
            if d == 0 and p in dict(CHUNKS):  # the same chunk from position 0
                chunks[f"{p},0"] = cpu[name][k]
        ratio = [np.median(w) / max(np.median(c), 1e-9) for w, c in zip(wall[name], cpu[name],
                                                                         strict=True)]
        meta: dict[str, Any] = {
            "model": {"name": "llm", "params": dec.describe()["params"],
                      "parameters": dec.describe().get("parameters")},
            "device": {"kind": "cpu", "name": platform.machine()}, "dtype": "float32",
            "threads": 1, "torch_version": torch.__version__,
            "method": {"reps": args.reps, "order": "shuffled across three shapes",
                       "seed": args.seed, "clock": "thread CPU time (time.thread_time)"},
            "wall_over_cpu": {"median": float(np.median(ratio)),
                              "max": float(np.max(ratio))},
            "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "shape": name, "note": "shared 2-core machine: noisy"}
        profile = StepProfile(list(PREFILL), list(DECODES), list(CONTEXT), samples,
                              meta=meta, prefill_context_s=chunks)
        print(f"{name}: {profile.save(OUT / f'{name}.json')}  wall/cpu median "
              f"{meta['wall_over_cpu']['median']:.2f}")


if __name__ == "__main__":
    main()
