"""Stand-in runners for tests and overhead measurements (no model; precise sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def precise_sleep(seconds: float) -> None:
    """Sleep ``seconds`` accurately: coarse sleep, then spin the last half millisecond."""
    end = time.perf_counter() + seconds
    if seconds > 0.001:
        time.sleep(seconds - 0.0005)
    while time.perf_counter() < end:
        pass


class SleepRunner:
    """Takes ``service_s(batch_size)`` seconds per batch; can fail or stall on given batches.

    Args:
        service_s: Seconds a batch of n payloads takes.
        fail_on: 0-based batch numbers whose call raises ``RuntimeError``.
        stall_on: Batch number -> extra seconds that batch takes.
    """

    name = "sleep"
    device = "cpu"

    def __init__(self, service_s: Callable[[int], float], fail_on: Sequence[int] = (),
                 stall_on: dict[int, float] | None = None) -> None:
        self.service_s = service_s
        self.fail_on = set(fail_on)
        self.stall_on = dict(stall_on or {})
        self.calls = 0

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` placeholder payloads."""
        return [None] * n

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Sleep for the batch's service time (plus any stall); raise when told to."""
        index = self.calls
        self.calls += 1
        precise_sleep(self.service_s(len(payloads)) + self.stall_on.get(index, 0.0))
        if index in self.fail_on:
            raise RuntimeError(f"injected failure in batch {index}")
        return len(payloads)

    def describe(self) -> dict[str, Any]:
        """A description like the real runners'."""
        return {"model": {"name": self.name}, "device": {"kind": "cpu", "name": "cpu"},
                "dtype": "fp32", "threads": 1}
