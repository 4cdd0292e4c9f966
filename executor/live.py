"""The live driver: the wall clock and a real model around :class:`sim.core.ServingCore`.

It mirrors :class:`sim.engine.SimPyDriver` event for event — an arrival while a replica is
free, a replica freed, a wake-up due — but time is ``time.perf_counter()`` since the start and
a batch runs ``runner.run_batch`` on a worker thread (one per replica; torch releases the GIL).
The main thread sleeps until the next arrival or wake-up and wakes early when a batch
completes. Arrivals keep their scheduled times in the records (the latency a client of the
schedule sees); how late the driver actually noticed each one is reported as timer lateness.

Draining: after the last arrival the driver finishes queued work, but not past
``drain_until_s`` (the horizon plus the drain timeout): what is still queued or running then
stays in flight (censored in the summary), and the run ends on time.

Faults: a batch whose model call raises fails only its requests (reason kept); a batch that
outlives ``batch_timeout_s`` fails its requests at the timeout while its replica stays busy
until the call returns. :meth:`LiveDriver.stop` (Ctrl-C) stops admitting and then either drains
what is queued and running or abandons the queue; either way the records stay consistent.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.runners import ModelRunner
from sim.core import Batch, ServingCore

_POLL_S = 0.05
# Waking a sleeping thread takes ~0.1-0.3 ms on our VMs: that much would be added to every
# arrival's start. So the driver sleeps until this close to a due arrival or wake-up and then
# polls (yielding the GIL and the CPU each time) until it is due.
SPIN_S = 0.0005


@dataclass
class _Done:
    batch: Batch
    finish_s: float
    service_s: float
    error: str | None


@dataclass
class Health:
    """Executor-health measurements (seconds).

    Attributes:
        arrival_lateness_s: For each arrival that found a replica free: how long after its
            scheduled time the driver admitted it.
        wake_lateness_s: For each policy wake-up: how late it fired.
        dispatch_overhead_s: Per decision that dispatched: the time spent in the core and the
            policy (decide, drops, bookkeeping), excluding the model.
        handoff_s: Per batch: from dispatch to the worker starting the model call.
    """

    arrival_lateness_s: list[float] = field(default_factory=list)
    wake_lateness_s: list[float] = field(default_factory=list)
    dispatch_overhead_s: list[float] = field(default_factory=list)
    handoff_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, float]]:
        """p50 / p99 / max (ms) and count of each series."""
        out: dict[str, dict[str, float]] = {}
        for name in ("arrival_lateness_s", "wake_lateness_s", "dispatch_overhead_s",
                     "handoff_s"):
            values = np.asarray(getattr(self, name)) * 1e3
            key = name.removesuffix("_s") + "_ms"
            if values.size == 0:
                out[key] = {"count": 0, "p50": math.nan, "p99": math.nan, "max": math.nan}
            else:
                out[key] = {"count": int(values.size), "p50": float(np.percentile(values, 50)),
                            "p99": float(np.percentile(values, 99)),
                            "max": float(values.max())}
        return out


class _Worker(threading.Thread):
    """Runs one replica's batches on the model, one at a time."""

    def __init__(self, replica: int, runner: ModelRunner, inbox: queue.Queue[Any],
                 start_s: float, seed: int, health: Health, own_stream: bool = True) -> None:
        super().__init__(name=f"replica-{replica}", daemon=True)
        self.jobs: queue.Queue[Batch | None] = queue.Queue()
        self.runner, self.inbox, self.start_s = runner, inbox, start_s
        self.rng = np.random.default_rng(seed)
        self.health = health
        self.own_stream = own_stream

    def run(self) -> None:
        prepare = getattr(self.runner, "prepare_thread", None)
        if prepare is not None:
            prepare()
        with self._stream_context():
            self._loop()

    def _stream_context(self) -> Any:
        """On CUDA, run this replica's batches on its own stream (``cuda_streams``)."""
        import contextlib

        device = str(getattr(self.runner, "device", "cpu"))
        if not (self.own_stream and device.startswith("cuda")):
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(torch.cuda.Stream(device=device))  # type: ignore[no-untyped-call]

    def _loop(self) -> None:
        while True:
            batch = self.jobs.get()
            if batch is None:
                return
            payloads = self.runner.payloads(len(batch.request_ids), self.rng)
            begin = time.perf_counter()
            self.health.handoff_s.append(begin - self.start_s - batch.start_s)
            error: str | None = None
            try:
                self.runner.run_batch(payloads)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            end = time.perf_counter()
            self.inbox.put(_Done(batch, end - self.start_s, end - begin, error))


class LiveDriver:
    """Runs a :class:`ServingCore` in real time against ``runners`` (one per replica)."""

    def __init__(self, core: ServingCore, runners: Sequence[ModelRunner], *,
                 batch_timeout_s: float | None = None, seed: int = 0,
                 drain_timeout_s: float = 30.0, drain_until_s: float = math.inf,
                 stream_per_replica: bool = True, spin_s: float = SPIN_S) -> None:
        if len(runners) != core.n_replicas:
            raise ValueError(f"need one runner per replica ({core.n_replicas}), "
                             f"got {len(runners)}")
        self.core = core
        self.runners = list(runners)
        self.batch_timeout_s = batch_timeout_s
        self.seed = seed
        self.drain_timeout_s = drain_timeout_s
        self.drain_until_s = drain_until_s
        self.stream_per_replica = stream_per_replica
        self.spin_s = spin_s
        self.health = Health()
        self._inbox: queue.Queue[_Done] = queue.Queue()
        self._stop = threading.Event()
        self._stop_mode = "drain"
        self._wake_at = [math.inf] * core.n_replicas
        self._timed_out: set[int] = set()
        self.stopped_early = False
        self.stopped_at_s: float | None = None  # when stop() took effect
        self.drain_timed_out = False  # work was left in flight at the drain deadline
        self._closing = False
        self.start_perf = 0.0

    def stop(self, mode: str = "drain") -> None:
        """Stop admitting arrivals; ``drain`` finishes queued work, ``abandon`` does not."""
        if mode not in ("drain", "abandon"):
            raise ValueError(f"stop mode {mode!r}: allowed: drain, abandon")
        self._stop_mode = mode
        self._stop.set()

    def now_s(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start_perf

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> float:
        """Run until the schedule is exhausted and all work is done (or stopped)."""
        core = self.core
        self.start_perf = time.perf_counter()
        workers = [_Worker(r, runner, self._inbox, self.start_perf, self.seed * 1000 + r,
                           self.health, self.stream_per_replica)
                   for r, runner in enumerate(self.runners)]
        for w in workers:
            w.start()
        self._workers = workers
        stop_deadline = self.drain_until_s
        stop_noted = False
        try:
            while True:
                now = self.now_s()
                if self._stop.is_set() and not stop_noted:
                    stop_noted = True
                    self.stopped_early = True
                    self.stopped_at_s = now
                    stop_deadline = min(stop_deadline, now + (
                        self.drain_timeout_s if self._stop_mode == "drain" else 0.0))
                    self._close_source()
                self._collect(block_s=0.0)
                now = self.now_s()
                was_free = core.any_free()
                touched = core.admit_until(now) if not self._stop.is_set() else set()
                if touched and was_free:  # (while all are busy, an arrival only queues)
                    self._note_arrival_lateness(now)
                self._consult_touched(touched, now)
                self._fire_wakes(now)
                self._expire_batches(now)
                busy = any(core.running)
                queued = sum(q.length for q in core.queues)
                next_arrival = core.next_arrival_s() if not self._stop.is_set() else math.inf
                if not busy and next_arrival == math.inf and (
                        queued == 0 or min(self._wake_at) == math.inf):
                    break
                abandoning = self._stop.is_set() and self._stop_mode == "abandon"
                if abandoning and (now >= stop_deadline or not busy):
                    break  # running batches still end and are recorded; the queue stays
                if now >= stop_deadline:
                    self.drain_timed_out = True  # the rest stays in flight (censored)
                    break
                wait_until = min(next_arrival if core.any_free() else math.inf,
                                 min(self._wake_at), self._next_batch_timeout(), stop_deadline)
                wait_s = wait_until - self.now_s()
                if wait_s > self.spin_s:
                    self._collect(block_s=min(wait_s - self.spin_s, _POLL_S))
                else:
                    time.sleep(0)  # due within spin_s: yield, then look again
        finally:
            end_s = self.now_s()
            self._closing = True
            for w in workers:
                w.jobs.put(None)
            for w in workers:
                w.join(timeout=60)
            if not self.drain_timed_out:  # batches that ended with the loop: record them
                self._collect(block_s=0.0)
        return end_s

    # -- steps -------------------------------------------------------------------------------
    def _close_source(self) -> None:
        """Stop admitting: arrivals not yet admitted never happen."""
        self.core.source.close()

    def _collect(self, block_s: float) -> None:
        try:
            item = self._inbox.get(timeout=block_s) if block_s > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._complete(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _complete(self, done: _Done) -> None:
        core = self.core
        batch = done.batch
        error = done.error
        if batch.id in self._timed_out:
            self._timed_out.discard(batch.id)
            error = error or "batch_timeout"
        core.finish(batch, done.finish_s, done.service_s, error)
        if self._closing or (self._stop.is_set() and self._stop_mode == "abandon"):
            return
        now = self.now_s()
        touched = core.admit_until(now) if not self._stop.is_set() else set()
        self._consult(batch.replica, now)
        self._consult_touched(touched, now, skip=batch.replica)

    def _note_arrival_lateness(self, now: float) -> None:
        # lateness of the newest admitted arrival (the one the driver was waiting for)
        admitted = self.core.source.admitted
        if admitted:
            last = self.core.table.arrival_s[admitted - 1]
            self.health.arrival_lateness_s.append(max(0.0, now - last))

    def _consult_touched(self, touched: set[int], now: float, skip: int = -1) -> None:
        for replica in self.core.free_replicas_of(touched, skip):
            self._consult(replica, now)

    def _fire_wakes(self, now: float) -> None:
        for replica, due in enumerate(self._wake_at):
            if due <= now and self.core.free(replica):
                self.health.wake_lateness_s.append(now - due)
                self._wake_at[replica] = math.inf
                self._consult(replica, max(now, due))

    def _consult(self, replica: int, now: float) -> None:
        core = self.core
        if self._stop.is_set() and self._stop_mode == "abandon":
            return
        while core.free(replica):
            t0 = time.perf_counter()
            batch, wake = core.decide(replica, now)
            overhead = time.perf_counter() - t0
            if batch is None:
                self._wake_at[replica] = math.inf if wake is None else wake
                return
            self.health.dispatch_overhead_s.append(overhead)
            self._wake_at[replica] = math.inf
            self._workers[replica].jobs.put(batch)

    def _next_batch_timeout(self) -> float:
        if self.batch_timeout_s is None:
            return math.inf
        starts = [b.start_s for rb in self.core.running_batches for b in rb.values()
                  if b.id not in self._timed_out]
        return min(starts) + self.batch_timeout_s if starts else math.inf

    def _expire_batches(self, now: float) -> None:
        if self.batch_timeout_s is None:
            return
        for rb in self.core.running_batches:
            for batch in list(rb.values()):
                if batch.id not in self._timed_out and now - batch.start_s >= self.batch_timeout_s:
                    self._timed_out.add(batch.id)
                    self.core.fail_running(batch, batch.start_s + self.batch_timeout_s,
                                           "batch_timeout")
