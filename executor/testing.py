"""Stand-in runners for tests and overhead measurements (no model; precise sleeps).

A sleep is never shorter than asked, but on a busy machine it can be much longer (the thread
waits for a core after waking: several ms with two CPU hogs on two cores). Each stand-in
therefore records what it drew (``drawn_s``) and how long each call really took
(``took_s``), so a test compares against what the machine did in that run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from calibration.profile import LatencyProfile


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
        self.took_s: list[float] = []  # per call: how long it really took (s)
        self.sizes: list[int] = []  # per call: the batch size

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` placeholder payloads."""
        return [None] * n

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Sleep for the batch's service time (plus any stall); raise when told to."""
        index = self.calls
        self.calls += 1
        begin = time.perf_counter()
        precise_sleep(self.service_s(len(payloads)) + self.stall_on.get(index, 0.0))
        self.took_s.append(time.perf_counter() - begin)
        self.sizes.append(len(payloads))
        if index in self.fail_on:
            raise RuntimeError(f"injected failure in batch {index}")
        return len(payloads)

    def describe(self) -> dict[str, Any]:
        """A description like the real runners'."""
        return {"model": {"name": self.name}, "device": {"kind": "cpu", "name": "cpu"},
                "dtype": "fp32", "threads": 1}


class ReplayRunner:
    """A stand-in device of constant speed: each batch sleeps for a service time drawn from a
    latency profile, as the simulator draws it (cold samples after an idle gap included).

    Running the executor on it measures the fidelity of everything but the device — the
    real-time driver, timers, thread hand-off and the simulator's queueing semantics — with the
    real model's latency distribution, on a machine whose own speed drifts.

    Args:
        profile: The latency profile to replay.
        seed: Seeds the draws (independent of the simulator's).
        same_draws_as_seed: Instead, draw exactly the simulator's service-time stream for a
            scenario with this seed, restarted for every worker thread (every live run), so a
            live run and the simulation of the same scenario see the same service times in the
            same dispatch order: what differs is only what the executor adds (common random
            numbers; the most precise check of the executor).
    """

    def __init__(self, profile: LatencyProfile, seed: int = 12345,
                 same_draws_as_seed: int | None = None) -> None:
        self.profile = profile
        self.device = str(profile.device.get("kind", "cpu"))
        self.name = str(profile.model.get("name", "replay"))
        self.same_draws_as_seed = same_draws_as_seed
        self._service = self._fresh_service(seed)
        self._last_end = -math.inf
        self.drawn_s: list[float] = []  # per call: the service time drawn (s)
        self.idle_s: list[float] = []  # per call: idle since the previous call ended (s)
        self.took_s: list[float] = []  # per call: how long it really took (s)

    def _fresh_service(self, seed: int) -> Any:
        from sim.scenario.build import Streams
        from sim.scenario.service import ProfileService

        if self.same_draws_as_seed is None:
            return ProfileService(self.profile, np.random.default_rng(seed))
        return ProfileService(self.profile, Streams.from_seed(self.same_draws_as_seed).service)

    def prepare_thread(self) -> None:
        """A new worker (a new live run): restart the simulator's stream when replaying it."""
        if self.same_draws_as_seed is not None:
            self._service = self._fresh_service(0)
            self._last_end = -math.inf

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` placeholder payloads."""
        return [None] * n

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Sleep for one draw of the profile's service time at this batch size."""
        begin = time.perf_counter()
        idle = begin - self._last_end
        drawn = self._service.sample_s(len(payloads), idle)
        precise_sleep(drawn)
        self.idle_s.append(idle)
        self._last_end = time.perf_counter()
        self.drawn_s.append(drawn)
        self.took_s.append(self._last_end - begin)
        return len(payloads)

    def describe(self) -> dict[str, Any]:
        """The profile's model and device, marked as a replay."""
        return {"model": {**self.profile.model, "runner": "replay"},
                "device": dict(self.profile.device),
                "dtype": self.profile.meta.get("dtype", "fp32"),
                "threads": self.profile.meta.get("threads")}
