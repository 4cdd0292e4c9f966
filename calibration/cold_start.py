"""A model's cold start: what a new replica pays before it can serve.

:func:`load_replica` is the one way a replica comes up, in calibration and in the live
executor alike: build the runner (construct the model, load its weights, move them to the
device) and run its first forward (one request), synchronising the device around the timing.
:func:`measure_load` repeats it and keeps the samples, which the profile stores as
``load_samples_s`` (the simulator draws a new replica's cold start from them).

Measured in the calibrating process: a replica started in a fresh process also pays for
importing torch and initialising the device, which is not included (a serving process that
scales by starting workers in a warm host process sees what is measured here).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np

from calibration.model_runners import ModelRunner, build_runner


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def load_replica(name: str, *, device: str = "auto", dtype: str = "fp32",
                 threads: int | None = None, params: dict[str, Any] | None = None,
                 seed: int = 0) -> tuple[ModelRunner, dict[str, float]]:
    """Bring up one replica's model and time it.

    Returns:
        The runner, ready to serve, and the seconds of each phase: ``build_s`` (construct,
        load weights, move to the device), ``first_forward_s`` and ``total_s``.
    """
    t0 = time.perf_counter()
    runner = build_runner(name, device=device, dtype=dtype, threads=threads,
                          params=params or {})
    where = str(getattr(runner, "device", "cpu"))
    _sync(where)
    t1 = time.perf_counter()
    runner.run_batch(runner.payloads(1, np.random.default_rng(seed)))
    _sync(where)
    t2 = time.perf_counter()
    return runner, {"build_s": t1 - t0, "first_forward_s": t2 - t1, "total_s": t2 - t0}


def release(device: str) -> None:
    """After the last reference to a stopped replica's runner is dropped: collect it and
    hand its device memory back (CUDA).
    """
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def measure_load(name: str, *, reps: int, device: str = "auto", dtype: str = "fp32",
                 threads: int | None = None, params: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """``reps`` cold starts, one after another (each replica freed before the next).

    Returns:
        ``samples_s`` (totals), ``phases_s`` (per phase, per rep) and a note on what is in
        them.
    """
    phases: dict[str, list[float]] = {"build_s": [], "first_forward_s": [], "total_s": []}
    for rep in range(reps):
        runner, times = load_replica(name, device=device, dtype=dtype, threads=threads,
                                     params=params, seed=rep)
        where = str(getattr(runner, "device", "cpu"))
        del runner
        release(where)
        for key, value in times.items():
            phases[key].append(value)
    return {"samples_s": phases["total_s"], "phases_s": phases, "reps": reps,
            "note": "in-process: construct + load weights + to device + first forward; "
                    "a fresh process adds its imports and device initialisation"}
