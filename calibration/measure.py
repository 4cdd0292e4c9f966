"""Measure a runner's batched latency curve and turn it into a :class:`LatencyProfile`.

Method (see the README, "Calibration: measuring the real model"):
  1. Probe the batch sizes in ascending order with ``warmup`` untimed runs each; the first size
     that runs out of memory is recorded as infeasible together with every larger size (memory
     is freed and the sweep goes on). Peak device memory per size is recorded on CUDA.
  2. Time ``reps`` runs per feasible size in a *shuffled* order of (size, rep) pairs, so that
     drift and cache state do not favour one size, as in real serving with mixed sizes. Each
     run draws fresh payloads (outside the timed region) and times ``runner.run_batch``:
     collation, the forward pass under ``torch.inference_mode`` and, on CUDA, a device
     synchronisation before the clock starts and inside ``run_batch`` before it stops.
     ``time.perf_counter_ns`` is the clock.
  3. Keep every sample (outliers included: the simulator samples from them); summaries use
     median, p5, p95, p99 and CV. A fit ``a + b * batch`` (two pieces where the curve bends)
     is stored for reporting and extrapolation only.

Ctrl-C stops the timed loop; what was measured so far is kept (``interrupted: true``).
"""

from __future__ import annotations

import datetime as _dt
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.fit import fit_curve
from calibration.model_runners import InfeasibleBatch, ModelRunner, synchronize
from calibration.profile import LatencyProfile
from sim.errors import UserError

DEFAULT_REPS = 30
DEFAULT_WARMUP = 3

Progress = Callable[[int, int, int], None]  # (done, total, batch size)


class CalibrationError(UserError):
    """Bad calibration arguments (batch sizes, reps, ...)."""


def parse_batch_sizes(spec: str) -> list[int]:
    """Parse ``"1-64"``, ``"1-64:8"``, ``"1,2,4,8"`` or combinations (``"1-16,32,64"``).

    A plain range ``a-b`` is dense up to 16 and then powers of two (enough to catch the steps
    GPUs show; pass ``a-b:1`` for every size). ``a-b:s`` steps by ``s``.
    """
    sizes: set[int] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not match:
            raise CalibrationError(f"--batch-sizes {spec!r}: cannot read {part!r}; use e.g. "
                                   "1-64, 1-64:8 or 1,2,4,8")
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if lo < 1 or hi < lo:
            raise CalibrationError(f"--batch-sizes {spec!r}: {part!r} must satisfy 1 <= a <= b")
        if match.group(3):
            step = int(match.group(3))
            if step < 1:
                raise CalibrationError(f"--batch-sizes {spec!r}: step must be >= 1")
            sizes.update(range(lo, hi + 1, step))
            sizes.add(hi)
        elif match.group(2):
            sizes.update(range(lo, min(hi, 16) + 1))
            p = 32
            while p <= hi:
                sizes.add(p)
                p *= 2
            sizes.add(hi)
        else:
            sizes.add(lo)
    if not sizes:
        raise CalibrationError(f"--batch-sizes {spec!r}: no sizes given; use e.g. 1-64")
    return sorted(sizes)


@dataclass
class Calibration:
    """Result of a calibration sweep.

    Attributes:
        profile: The measured profile (feasible sizes only).
        infeasible: Batch sizes that ran out of memory (and the error seen).
        peak_memory_bytes: Peak device memory per batch size (CUDA only).
        elapsed_s: Wall time of the whole sweep.
        interrupted: The timed loop was stopped by Ctrl-C.
    """

    profile: LatencyProfile | None
    infeasible: dict[int, str] = field(default_factory=dict)
    peak_memory_bytes: dict[int, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    interrupted: bool = False


def _peak_memory(device: str) -> tuple[Callable[[], None], Callable[[], int | None]]:
    if device.startswith("cuda"):
        import torch

        return (lambda: torch.cuda.reset_peak_memory_stats(device),
                lambda: int(torch.cuda.max_memory_allocated(device)))
    return (lambda: None), (lambda: None)


def calibrate(runner: ModelRunner, batch_sizes: Sequence[int], *, reps: int = DEFAULT_REPS,
              warmup: int = DEFAULT_WARMUP, seed: int = 0,
              progress: Progress | None = None, cold_idle_s: float = 0.0,
              cold_reps: int | None = None, cold_after_s: float = 0.01) -> Calibration:
    """Measure ``runner`` at each batch size (see the module docstring for the method).

    Args:
        runner: The model runner (the same object the live executor calls).
        batch_sizes: Sizes to measure.
        reps: Timed runs per size (>= 1; default 30, enough for a stable p99 summary).
        warmup: Untimed runs per size before timing.
        seed: Seeds the payloads and the shuffled order.
        progress: Called after each timed run with (done, total, batch size).
        cold_idle_s: When > 0, also time ``cold_reps`` runs per size each after this idle
            gap ("cold" samples: on CPUs a model runs slower after idling); the simulator
            draws from them for batches that start after at least ``cold_after_s`` of idle.
        cold_reps: Cold runs per size (default: half of ``reps``, at least 5).
        cold_after_s: The idle time from which the simulator treats a batch as cold.
    """
    if reps < 1:
        raise CalibrationError(f"--reps {reps}: must be >= 1")
    if warmup < 0:
        raise CalibrationError(f"--warmup {warmup}: must be >= 0")
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise CalibrationError("--batch-sizes: need at least one size >= 1")
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    reset_peak, read_peak = _peak_memory(runner.device)
    infeasible: dict[int, str] = {}
    peaks: dict[int, int] = {}
    feasible: list[int] = []
    for size in sizes:
        try:
            reset_peak()
            for _ in range(max(warmup, 1)):
                runner.run_batch(runner.payloads(size, rng))
        except InfeasibleBatch as exc:
            for bigger in sizes[sizes.index(size):]:
                infeasible[bigger] = str(exc) if bigger == size else f"larger than {size}"
            break
        peak = read_peak()
        if peak is not None:
            peaks[size] = peak
        feasible.append(size)

    order = [(size, rep) for size in feasible for rep in range(reps)]
    random.Random(seed).shuffle(order)
    samples: dict[int, list[float]] = {size: [] for size in feasible}
    cold: dict[int, list[float]] = {size: [] for size in feasible}
    n_cold = max(5, reps // 2) if cold_reps is None else cold_reps
    cold_order = [(size, rep) for size in feasible for rep in range(n_cold)] \
        if cold_idle_s > 0 else []
    random.Random(seed + 1).shuffle(cold_order)
    total = len(order) + len(cold_order)
    interrupted = False
    done = 0
    try:
        for size, _ in order:
            if size in infeasible:
                continue
            payloads = runner.payloads(size, rng)
            synchronize(runner.device)
            start = time.perf_counter_ns()
            try:
                runner.run_batch(payloads)
            except InfeasibleBatch as exc:
                infeasible[size] = str(exc)
                samples.pop(size, None)
                continue
            samples[size].append((time.perf_counter_ns() - start) / 1e9)
            done += 1
            if progress is not None:
                progress(done, total, size)
        for size, _ in cold_order:
            if size in infeasible:
                continue
            payloads = runner.payloads(size, rng)
            time.sleep(cold_idle_s)
            synchronize(runner.device)
            start = time.perf_counter_ns()
            runner.run_batch(payloads)
            cold[size].append((time.perf_counter_ns() - start) / 1e9)
            done += 1
            if progress is not None:
                progress(done, total, size)
    except KeyboardInterrupt:
        interrupted = True
    measured = {b: np.array(v) for b, v in samples.items() if v}
    elapsed = time.perf_counter() - t0
    if not measured:
        return Calibration(None, infeasible, peaks, elapsed, interrupted)
    info = runner.describe()
    meta: dict[str, Any] = {
        "dtype": info.get("dtype"), "threads": info.get("threads"),
        "torch_version": info.get("torch_version"), "cuda_version": info.get("cuda_version"),
        "cpu": info.get("cpu"), "host": info.get("host"),
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "servelab_version": _version(),
        "synthetic": False,
        "method": {"reps": reps, "warmup": warmup, "seed": seed, "order": "shuffled",
                   "clock": "perf_counter_ns", "sync": runner.device.startswith("cuda")},
        "infeasible_batch_sizes": {str(k): v for k, v in infeasible.items()},
        "peak_memory_bytes": {str(k): v for k, v in peaks.items()},
        "interrupted": interrupted,
        "elapsed_s": round(elapsed, 3),
    }
    cold_measured = {b: np.array(v) for b, v in cold.items() if v and b in measured}
    if cold_measured:
        meta["cold"] = {"idle_ms": cold_idle_s * 1e3, "after_ms": cold_after_s * 1e3,
                        "reps": n_cold}
    medians = {b: float(np.median(v)) for b, v in measured.items()}
    meta["fit"] = fit_curve(list(medians), list(medians.values()))
    profile = LatencyProfile(samples_s=measured, model=dict(info.get("model", {})),
                             cold_samples_s=cold_measured,
                             device=dict(info.get("device", {})), meta=meta)
    return Calibration(profile, infeasible, peaks, elapsed, interrupted)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("servelab")
    except metadata.PackageNotFoundError:
        return "unknown"
