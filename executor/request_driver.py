"""The live driver: the wall clock and a real model around
:meth:`sim.serving.core.ServingCore.step`.

Like :class:`sim.drivers.engine.SimPyDriver` it is only a clock: it calls the core's one event loop
with the time and the batches that finished, and runs the batches the core starts. Time is
``time.perf_counter()`` since the start and a batch runs ``runner.run_batch`` on a worker
thread (one per replica; torch releases the GIL). The main thread sleeps until the time the
core asked for and wakes early when a batch completes. Arrivals keep their scheduled times in
the records (the latency a client of the schedule sees); how late the driver actually
noticed each one is reported as timer lateness.

Draining: after the last arrival the driver finishes queued work, but not past
``drain_until_s`` (the horizon plus the drain timeout): what is still queued or running then
stays in flight (censored in the summary), and the run ends on time.

Faults: a batch whose model call raises fails only its requests (reason kept); a batch that
outlives ``batch_timeout_s`` fails its requests at the timeout while its replica stays busy
until the call returns. A runner whose ``payloads()`` raises fails that batch the same way. A
worker that cannot start at all (``prepare_thread()`` or its CUDA stream raises) fails every
batch it is given with that reason and stops the run: :attr:`LiveDriver.fatal_error` says why.
:meth:`LiveDriver.stop` (Ctrl-C or SIGTERM, see :mod:`executor.lifecycle`) takes in the
arrivals already due, stops admitting and then either drains what is queued and running
(queued requests still expire) or abandons the queue; either way the records stay consistent.
:meth:`LiveDriver.hurry` (a second signal) ends the run at once.

Autoscaling: a launched replica's worker loads its model (the real cold start); a drained
replica's worker ends and its model is released. A replica killed at its
``graceful_shutdown_timeout_s`` while a model call runs (a running call cannot be killed):
the core has failed the call's requests at the deadline; the driver drops the worker at once
(the slot may be launched again), ignores the call's result when it returns, and the worker
then releases its model.

A hung model call: when the loop ends, the workers get at most ``hung_grace_s`` in all to
return (:data:`executor.lifecycle.HUNG_GRACE_S`; a signal cuts it short); a batch still inside
the model then stays in flight (its requests censored, or failed if ``batch_timeout_s``
failed them) and is listed in :attr:`LiveDriver.unfinished_batches`. A batch failed by the batch
timeout is marked failed in the batch table at once; its ``finish_s`` is when its call
returned (NaN if it had not returned by the end of the run).
"""

from __future__ import annotations

import gc
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.model_runners import ModelRunner
from executor.lifecycle import HUNG_GRACE_S, check_stop_mode, join_within
from sim.serving.core import Batch, Finished, ServingCore
from sim.serving.fleet import STARTING

_POLL_S = 0.05
# Waking a sleeping thread takes ~0.1-0.3 ms on our VMs: that much would be added to every
# arrival's start. So the driver sleeps until this close to a due arrival or wake-up and then
# polls (yielding the GIL and the CPU each time) until it is due.
SPIN_S = 0.0005


@dataclass
class _Fatal:
    replica: int
    error: str


@dataclass
class _Ready:
    """A launched replica has loaded its model (autoscaling)."""

    replica: int
    ready_s: float
    phases_s: dict[str, float]
    worker: _Worker  # which launch: a cancelled one's report is dropped


ReplicaLoader = Callable[[int], tuple[ModelRunner, dict[str, float]]]


def _reason(where: str, exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return f"{where}: {text}" if where else text


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
        loop_lateness_s: Per wait of the driver's loop: how long past its planned end it
            woke (a busy machine starves the thread; this bounds how late a deadline is seen).
        notice_lateness_s: Per finished batch: from its end (on the worker) to the time of
            the core step that took it in, the time any batch it let start is stamped with.
    """

    arrival_lateness_s: list[float] = field(default_factory=list)
    wake_lateness_s: list[float] = field(default_factory=list)
    dispatch_overhead_s: list[float] = field(default_factory=list)
    handoff_s: list[float] = field(default_factory=list)
    loop_lateness_s: list[float] = field(default_factory=list)
    notice_lateness_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, float]]:
        """p50 / p99 / max (ms) and count of each series."""
        out: dict[str, dict[str, float]] = {}
        for name in ("arrival_lateness_s", "wake_lateness_s", "dispatch_overhead_s",
                     "handoff_s", "loop_lateness_s", "notice_lateness_s"):
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

    def __init__(self, replica: int, runner: ModelRunner | None, inbox: queue.Queue[Any],
                 start_s: float, seed: int, health: Health, own_stream: bool = True,
                 loader: ReplicaLoader | None = None) -> None:
        super().__init__(name=f"replica-{replica}", daemon=True)
        self.replica = replica
        self.jobs: queue.Queue[Batch | None] = queue.Queue()
        self.runner, self.inbox, self.start_s = runner, inbox, start_s
        self.rng = np.random.default_rng(seed)
        self.health = health
        self.own_stream = own_stream
        self.loader = loader
        # a launch the core cancelled (a scale-down during its cold start): set by the
        # driving thread under the lock, so the load is either announced ready before the
        # cancel (then the driver drops the report) or never
        self.cancelled = False
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Drop this launch: it never becomes ready, and what it loads is released (by this
        thread, once the load ends: the driving thread does not wait for it).
        """
        with self._lock:
            self.cancelled = True
        self.jobs.put(None)

    def run(self) -> None:
        if self.runner is None:  # a launched replica: its cold start is real
            assert self.loader is not None
            try:
                runner, phases = self.loader(self.replica)
            except Exception as exc:
                if not self.cancelled:  # a cancelled launch's failure stops nothing
                    self._refuse(_reason("replica could not load its model", exc))
                return
            with self._lock:
                self.runner = runner
                announced = not self.cancelled
                if announced:
                    self.inbox.put(_Ready(self.replica, time.perf_counter() - self.start_s,
                                          phases, self))
            del runner  # self.runner holds the only reference: release() can collect it
            if not announced:
                self._release_runner()
                return
        try:
            prepare = getattr(self.runner, "prepare_thread", None)
            if prepare is not None:
                prepare()
            context = self._stream_context()
        except Exception as exc:
            self._refuse(_reason("replica could not start (prepare_thread/stream)", exc))
            return
        try:
            with context:
                self._loop()
        except Exception as exc:  # the stream context itself failed
            self._refuse(_reason("replica stream failed", exc))
        if self.cancelled:  # cancelled after it announced ready: nobody else releases it
            self._release_runner()

    def _release_runner(self) -> None:
        """Drop this cancelled launch's model and free its device's memory
        (:func:`calibration.cold_start.release`).
        """
        from calibration.cold_start import release

        device = str(getattr(self.runner, "device", "cpu"))
        self.runner = None  # the last reference: release() can collect it
        release(device)

    def _refuse(self, error: str) -> None:
        """This worker cannot run anything: say so, then fail every batch it is given."""
        self.inbox.put(_Fatal(self.replica, error))
        while True:
            batch = self.jobs.get()
            if batch is None:
                return
            now = time.perf_counter() - self.start_s
            self.inbox.put(Finished(batch, now, 0.0, error))

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
            if self.cancelled:  # killed: batches still queued here were abandoned too
                continue
            error: str | None = None
            runner = self.runner
            assert runner is not None
            try:
                payloads = runner.payloads(len(batch.request_ids), self.rng)
            except Exception as exc:
                payloads, error = None, _reason("payloads", exc)
            begin = time.perf_counter()
            self.health.handoff_s.append(begin - self.start_s - batch.start_s)
            if error is None:
                try:
                    runner.run_batch(payloads)  # type: ignore[arg-type]
                except Exception as exc:
                    error = _reason("", exc)
            end = time.perf_counter()
            self.inbox.put(Finished(batch, end - self.start_s, end - begin, error))


class LiveDriver:
    """Runs a :class:`ServingCore` in real time against ``runners`` (one per replica).

    An autoscaled core (``core.fleet``) has runners only for its resident replicas (None for
    the others); a replica the autoscaler launches gets a worker that loads its model with
    ``loader`` (the real cold start, reported back when done), and a replica that has
    drained is stopped and its model released.
    """

    def __init__(self, core: ServingCore, runners: Sequence[ModelRunner | None], *,
                 batch_timeout_s: float | None = None, seed: int = 0,
                 drain_timeout_s: float = 30.0, drain_until_s: float = math.inf,
                 stream_per_replica: bool = True, spin_s: float = SPIN_S,
                 loader: ReplicaLoader | None = None,
                 hung_grace_s: float = HUNG_GRACE_S) -> None:
        if len(runners) != core.n_replicas:
            raise ValueError(f"need one runner per replica ({core.n_replicas}), "
                             f"got {len(runners)}")
        if core.fleet is not None and loader is None:
            raise ValueError("an autoscaled core needs a loader to start replicas")
        self.core = core
        self.runners = list(runners)
        self.batch_timeout_s = batch_timeout_s
        self.seed = seed
        self.drain_timeout_s = drain_timeout_s
        self.drain_until_s = drain_until_s
        self.stream_per_replica = stream_per_replica
        self.spin_s = spin_s
        self.health = Health()
        self._inbox: queue.Queue[Finished | _Fatal | _Ready] = queue.Queue()
        self._stop = threading.Event()
        self._hurry = threading.Event()
        self.hung_grace_s = hung_grace_s
        self.unfinished_batches: list[int] = []  # still inside the model when the run ended
        self.join_wait_s = 0.0  # how long the end waited for running model calls
        self.stopped_by: str | None = None  # SIGINT, SIGTERM, stop(), fatal error
        self._stop_mode = "drain"
        self._timed_out: set[int] = set()
        self.stopped_early = False
        self.stopped_at_s: float | None = None  # when stop() took effect
        self.drain_timed_out = False  # work was left in flight at the drain deadline
        self.fatal_error: str | None = None  # a replica's worker could not start
        self.start_perf = 0.0
        self._wake_s = 0.0
        self.loader = loader
        self._ready: list[tuple[int, float]] = []
        self._workers: dict[int, _Worker] = {}
        self.load_phases_s: list[dict[str, float]] = []  # each launched replica's cold start

    def stop(self, mode: str = "drain") -> None:
        """Stop admitting arrivals; ``drain`` finishes queued work, ``abandon`` does not.

        A later call may turn a drain into an abandon, never back.
        """
        check_stop_mode(mode)
        if self.stopped_by is None:
            self.stopped_by = "stop()"
        if self._stop_mode != "abandon":
            self._stop_mode = mode
        self._stop.set()

    def hurry(self) -> None:
        """End the run now: abandon the queue and do not wait for running model calls."""
        self._hurry.set()
        self.stop("abandon")

    def now_s(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start_perf

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> float:
        """Run until the schedule is exhausted and all work is done (or stopped, or the drain
        deadline passed); return the end time (s since the start).
        """
        core = self.core
        # the collector leaves what existed before the run alone: a full collection of a big
        # heap (a notebook's, the dashboard's, a long test session's) pauses the clock loop
        # for a fifth of a second, late enough to change what the autoscaler decides
        gc.freeze()
        self.start_perf = time.perf_counter()
        self._workers = {r: self._worker(r, runner) for r, runner in enumerate(self.runners)
                         if runner is not None}
        for w in self._workers.values():
            w.start()
        deadline = self.drain_until_s
        stop_noted = False
        finished: list[Finished] = []
        try:
            while True:
                now = self.now_s()
                if self._stop.is_set() and not stop_noted:
                    stop_noted = True
                    self.stopped_early = True
                    self.stopped_at_s = now
                    deadline = min(deadline, now + (
                        self.drain_timeout_s if self._stop_mode == "drain" else 0.0))
                    core.admit_until(now)  # what was due by the stop still arrives
                    core.source.close()
                abandoning = self._stop.is_set() and self._stop_mode == "abandon"
                if abandoning:  # a drain turned into an abandon ends now too
                    deadline = min(deadline, now)
                self._step(now, finished, dispatch=not abandoning)
                finished = []
                now = self.now_s()
                self._expire_batches(now)
                busy = any(core.running) or (
                    core.fleet is not None and core.fleet.count(STARTING) > 0)
                queued = core.queued()
                if not busy and core.source.peek_s() == math.inf and (
                        queued == 0 or (core.next_policy_wake_s() == math.inf
                                        and core.admission.next_retry_s() == math.inf)):
                    break  # (a routing task due may still place a held request)
                if abandoning and (now >= deadline or not busy):
                    break  # running batches still end and are recorded; the queue stays
                if now >= deadline:
                    self.drain_timed_out = True  # the rest stays in flight (censored)
                    break
                wait_until = min(self._wake_s, self._next_batch_timeout(), deadline)
                wait_s = wait_until - self.now_s()
                if wait_s > self.spin_s:
                    block_s = min(wait_s - self.spin_s, _POLL_S)
                    planned_s = self.now_s() + block_s
                    finished = self._collect(block_s=block_s)
                    self.health.loop_lateness_s.append(max(0.0, self.now_s() - planned_s))
                else:
                    time.sleep(0)  # due within spin_s: yield, then look again
                    finished = self._collect(block_s=0.0)
        finally:
            end_s = self.now_s()
            workers = list(self._workers.values())
            for w in workers:
                w.jobs.put(None)
            # a hung model call holds its worker: wait a bounded time, then leave it
            joined_s = time.perf_counter()
            join_within(workers, self.hung_grace_s, self._hurry)
            self.join_wait_s = time.perf_counter() - joined_s
            if not self.drain_timed_out:  # batches that ended with the loop: record them
                finished += self._collect(block_s=0.0)
                if finished:
                    core.step(self.now_s(), finished, dispatch=False)
            self.unfinished_batches = sorted(b.id for rb in core.running_batches
                                             for b in rb.values())
            gc.unfreeze()
        return end_s

    # -- steps -------------------------------------------------------------------------------
    def _step(self, now: float, finished: list[Finished], *, dispatch: bool) -> None:
        core = self.core
        was_free = core.any_free()
        admitted = core.source.admitted
        due = core.next_policy_wake_s()
        for done in finished:
            self.health.notice_lateness_s.append(max(0.0, now - done.finish_s))
        t0 = time.perf_counter()
        ready, self._ready = self._ready, []
        actions = core.step(now, finished, dispatch=dispatch, ready=ready)
        overhead = time.perf_counter() - t0
        if was_free and core.source.admitted > admitted:  # an arrival found a replica free
            # the first one taken in now: it waited longest to be noticed
            first = core.table.arrival_s[admitted]
            self.health.arrival_lateness_s.append(max(0.0, now - first))
        if due <= now:
            self.health.wake_lateness_s.append(now - due)
        if actions.start:
            self.health.dispatch_overhead_s.append(overhead)
        for batch in actions.start:
            self._workers[batch.replica].jobs.put(batch)
        for replica in actions.cancel:  # its loader ends on its own and frees the model
            self._workers.pop(replica).cancel()
        for replica in actions.stop:
            self._retire(replica)
        for replica in actions.kill:  # its model call returns on its own: not waited for
            self._workers.pop(replica).cancel()
        for replica in actions.launch:  # the worker loads the model, then reports it ready
            worker = self._worker(replica, None)
            self._workers[replica] = worker
            worker.start()
        self._wake_s = actions.wake_s

    def _worker(self, replica: int, runner: ModelRunner | None) -> _Worker:
        return _Worker(replica, runner, self._inbox, self.start_perf,
                       self.seed * 1000 + replica, self.health, self.stream_per_replica,
                       loader=self.loader)

    def _retire(self, replica: int) -> None:
        """A drained replica: end its worker and let its model go."""
        from calibration.cold_start import release

        worker = self._workers.pop(replica, None)
        if worker is None:
            return
        worker.jobs.put(None)
        join_within([worker], self.hung_grace_s, self._hurry)
        device = str(getattr(worker.runner, "device", "cpu"))
        worker.runner = None
        release(device)

    def _collect(self, block_s: float) -> list[Finished]:
        out: list[Finished] = []
        try:
            item = self._inbox.get(timeout=block_s) if block_s > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return out
        while True:
            if isinstance(item, _Ready):
                if self._workers.get(item.replica) is item.worker:  # not a cancelled launch
                    self._ready.append((item.replica, item.ready_s))
                    self.load_phases_s.append({"replica": item.replica, **item.phases_s})
            elif isinstance(item, _Fatal):
                if self.fatal_error is None:
                    self.fatal_error = f"replica {item.replica}: {item.error}"
                if self.stopped_by is None:
                    self.stopped_by = "fatal error"
                self.stop("abandon")
            elif self.core.abandoned and self.core.drop_abandoned(item.batch.id):
                self._timed_out.discard(item.batch.id)  # its replica was killed: ignored
            else:
                error = item.error
                if item.batch.id in self._timed_out:
                    self._timed_out.discard(item.batch.id)
                    error = error or "batch_timeout"
                out.append(Finished(item.batch, item.finish_s, item.service_s, error))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return out

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
