"""The live LLM engine: the simulator's LLM core and scheduler objects, the wall clock, and a
real decoder (:class:`calibration.llm_decoder.LlamaDecoder`, the one calibration measures).

Like the simulated clock (:func:`sim.llm.runner.simulate`) it only keeps time: it admits the
arrivals due by now, asks the core for a replica's plan, executes that plan's prefill chunks
and decodes as one step on the decoder (each sequence in its own KV-cache slot, from its
``computed`` position), and hands the step back with its measured start and end. Token times
therefore go into the same records and metrics code as the simulator's. Outputs are forced to
each request's length: the sampled token is ignored (greedy), as ``--ignore-eos`` does.

Sequences join a free slot when first scheduled and leave it when they finish, fail or are
preempted (a preempted sequence recomputes from position 0 when scheduled again, in whatever
slot is free then). A step that raises fails only its requests. :meth:`LiveLlmEngine.stop`
(Ctrl-C or SIGTERM, see :mod:`executor.stopping`) stops admitting; ``drain`` finishes what was
admitted, ``abandon`` leaves it in flight; :meth:`LiveLlmEngine.hurry` (a second signal) ends
the run at once. The drain deadline (horizon + drain timeout) ends the run on time; what is
unfinished stays in flight (censored). A step that hangs holds its worker thread, not the
process: the workers get at most ``hung_grace_s`` to return after the run ends.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from calibration.llm_decoder import LlamaDecoder, StepEntry
from executor.stopping import HUNG_GRACE_S, check_stop_mode, join_within
from sim.llm.core import LlmCore
from sim.llm.schedulers import StepPlan
from sim.llm.step_model import Composition, StepModel


class SlotTable:
    """Which KV-cache slot each running sequence occupies."""

    def __init__(self, slots: int) -> None:
        self.free = list(range(slots - 1, -1, -1))
        self.of: dict[int, int] = {}

    def slot(self, seq_id: int) -> int:
        """The sequence's slot, taking a free one the first time."""
        if seq_id not in self.of:
            if not self.free:
                raise RuntimeError("no free KV-cache slot: the decoder holds fewer sequences "
                                   "than the scheduler runs (raise the decoder's max_slots)")
            self.of[seq_id] = self.free.pop()
        return self.of[seq_id]

    def release(self, seq_id: int) -> None:
        """Give the sequence's slot back (finished, failed or preempted)."""
        slot = self.of.pop(seq_id, None)
        if slot is not None:
            self.free.append(slot)


class ReplayDecoder:
    """A constant-speed stand-in for the decoder: each step sleeps for the step model's own
    time of its composition. A live run on it measures what the engine adds (clock, Python
    bookkeeping, hand-off), free of the device's drift.
    """

    def __init__(self, model: StepModel, max_slots: int, max_len: int) -> None:
        from calibration.llm_decoder import DecoderConfig

        self.model = model
        self.cfg = DecoderConfig(hidden=2, layers=1, heads=1, kv_heads=1, intermediate=1,
                                 vocab=2, max_slots=max_slots, max_len=max_len)

    def run(self, comp: Composition) -> None:
        """Sleep for the step's modelled time."""
        from executor.testing import precise_sleep

        precise_sleep(self.model.step_s(comp))

    def describe(self) -> dict[str, Any]:
        """Marked as a replay."""
        return {"name": "replay", "model": repr(self.model)}


class LiveLlmEngine:
    """Runs an :class:`LlmCore` in real time, one decoder per replica."""

    def __init__(self, core: LlmCore, decoders: Sequence[Any], *,
                 drain_until_s: float = math.inf,
                 loader: Callable[[int], Any] | None = None,
                 hung_grace_s: float = HUNG_GRACE_S) -> None:
        if len(decoders) != len(core.schedulers):
            raise ValueError(f"need one decoder per replica ({len(core.schedulers)}), got "
                             f"{len(decoders)}")
        if core.fleet is not None and loader is None:
            raise ValueError("an autoscaled core needs a loader to start engines")
        self.core = core
        self.decoders: list[Any] = list(decoders)  # None: an engine not loaded (autoscaling)
        self.loader = loader
        self.slots = [SlotTable(d.cfg.max_slots) if d is not None else SlotTable(0)
                      for d in decoders]
        self._loading: dict[int, threading.Thread] = {}
        self._loaded: list[tuple[int, Any, float, float]] = []  # replica, decoder, t0, t1
        self._lock = threading.Lock()
        self.cold_starts_s: list[dict[str, float]] = []
        self.fatal_error: str | None = None
        self.drain_until_s = drain_until_s
        self._stop = threading.Event()
        self._hurry = threading.Event()
        self.hung_grace_s = hung_grace_s
        self.stopped_by: str | None = None  # SIGINT, SIGTERM, stop()
        self._mode = "drain"
        self.stopped_at_s: float | None = None
        self.drain_timed_out = False
        self.step_errors: list[str] = []
        self.start_perf = 0.0

    def stop(self, mode: str = "drain") -> None:
        """Stop admitting arrivals; ``drain`` finishes admitted work, ``abandon`` does not.

        A later call may turn a drain into an abandon, never back.
        """
        check_stop_mode(mode)
        if self.stopped_by is None:
            self.stopped_by = "stop()"
        if self._mode != "abandon":
            self._mode = mode
        self._stop.set()

    def hurry(self) -> None:
        """End the run now: abandon admitted work and do not wait for running steps."""
        self._hurry.set()
        self.stop("abandon")

    def now_s(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start_perf

    def _entries(self, replica: int, plan: StepPlan) -> list[StepEntry]:
        table = self.slots[replica]
        for seq in plan.preempted:
            table.release(seq.id)
        return [StepEntry(table.slot(seq.id), seq.computed, n) for seq, n in plan.entries]

    def _execute(self, replica: int, plan: StepPlan,
                 comp: Composition) -> tuple[float, float, str | None]:
        start = self.now_s()
        error = None
        decoder = self.decoders[replica]
        try:
            entries = self._entries(replica, plan)
            if isinstance(decoder, ReplayDecoder):  # a stand-in: the step model's own time
                decoder.run(comp)
                return start, self.now_s(), None
            if entries:
                decoder.step(entries)
            if plan.padding_seqs:  # static batching's finished rows are still computed
                pads = [StepEntry(self.slots[replica].slot(-1 - k), 0, 1)
                        for k in range(plan.padding_seqs)]
                decoder.step(pads)
                for k in range(plan.padding_seqs):
                    self.slots[replica].release(-1 - k)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return start, self.now_s(), error

    # -- autoscaling -------------------------------------------------------------------------
    def _launch(self, replica: int) -> None:
        """Load an engine's decoder on its own thread (its real cold start)."""
        assert self.loader is not None
        loader = self.loader

        def load() -> None:
            t0 = self.now_s()
            try:
                decoder = loader(replica)
            except Exception as exc:  # the run cannot go on as the autoscaler planned
                self.fatal_error = (f"engine {replica} could not load its model: "
                                    f"{type(exc).__name__}: {exc}").splitlines()[0][:300]
                self.stop("abandon")
                return
            with self._lock:
                self._loaded.append((replica, decoder, t0, self.now_s()))

        thread = threading.Thread(target=load, name=f"load-engine-{replica}", daemon=True)
        self._loading[replica] = thread
        thread.start()

    def _fleet(self, now: float) -> None:
        """Engines loaded since the last look become ready; control periods that fell due
        and an arrival to an empty fleet consult the autoscaler; launches start loading and
        stopped engines let their decoder go.
        """
        core = self.core
        fleet = core.fleet
        assert fleet is not None
        with self._lock:
            loaded, self._loaded = self._loaded, []
        for replica, decoder, t0, t1 in sorted(loaded, key=lambda x: x[3]):
            self._loading.pop(replica, None)
            self.decoders[replica] = decoder
            self.slots[replica] = SlotTable(decoder.cfg.max_slots)
            core.admit_until(t1)
            core.ready(replica, t1)
            self.cold_starts_s.append({"replica": replica, "total_s": t1 - t0})
        if self.stopped_at_s is None:
            core.autoscale_until(now)
        for replica in core.launched:
            self._launch(replica)
        core.launched.clear()
        for replica in core.stopped:
            self.decoders[replica] = None  # the model is released with its last reference
        core.stopped.clear()

    def run(self) -> float:
        """Run until every admitted request is done (or stopped, or past the drain deadline);
        return the end time (s since the start).

        Each engine steps on its own worker thread, as independent engines do (torch
        releases the GIL); the calling thread admits arrivals at their times and runs the
        autoscaler. The core is shared under one lock. At the deadline, or when abandoned,
        steps still running are not recorded (censored, as in the simulator).
        """
        core = self.core
        n = len(core.schedulers)
        self.start_perf = time.perf_counter()
        self._cond = threading.Condition()
        self._busy = [False] * n
        self._done = False
        workers = [threading.Thread(target=self._worker, args=(r,), name=f"engine-{r}",
                                    daemon=True) for r in range(n)]
        for w in workers:
            w.start()
        try:
            return self._drive()
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()
            join_within(workers, self.hung_grace_s, self._hurry)  # a hung step: bounded

    def _drive(self) -> float:
        """The admitting thread: arrivals, the stop, the autoscaler, the end."""
        core, cond = self.core, self._cond
        deadline = self.drain_until_s
        while True:
            with cond:
                now = self.now_s()
                if self._stop.is_set() and self.stopped_at_s is None:
                    self.stopped_at_s = now
                    core.admit_until(now)  # what was due by the stop still arrives
                if self._stop.is_set() and self._mode == "abandon":
                    return now  # also when a drain turned into an abandon
                if self.stopped_at_s is None:
                    core.admit_until(now)
                if core.fleet is not None:
                    self._fleet(now)
                if now >= deadline:
                    self.drain_timed_out = any(s.has_work() for s in core.schedulers) or any(
                        self._busy)
                    return now
                cond.notify_all()  # new arrivals, new engines: the workers look again
                upcoming = core.next_arrival_s() if self.stopped_at_s is None else math.inf
                wake = math.inf
                fleet = core.fleet
                if fleet is not None and self.stopped_at_s is None and core.ticking():
                    wake = fleet.next_tick_s
                loading = bool(self._loading)
                working = any(self._busy) or any(
                    s.has_work() for r, s in enumerate(core.schedulers) if core.steps_on(r))
                if upcoming == math.inf and wake == math.inf and not loading and not working:
                    return now  # nothing left to run or to wait for
                nxt = min(upcoming, wake, deadline,
                          now + 0.005 if loading else math.inf, now + 0.05)
                pause = nxt - self.now_s()
                if pause > 0:
                    cond.wait(pause)  # a finished step or a stop wakes it early

    def _worker(self, r: int) -> None:
        """One engine: plan under the lock, run the step outside it, record under it."""
        core, cond = self.core, self._cond
        while True:
            with cond:
                while True:
                    if self._done:
                        return
                    timeout = 0.05
                    if core.steps_on(r) and self.decoders[r] is not None:
                        now = self.now_s()
                        plan, comp = core.plan(now, r)
                        if comp is not None:
                            self._busy[r] = True
                            break
                        if plan.wake_at_s is not None:
                            timeout = max(min(plan.wake_at_s - now, 0.05), 0.0)
                    cond.wait(timeout)
            start, end, error = self._execute(r, plan, comp)
            with cond:
                self._busy[r] = False
                if self._done:
                    return  # stopped mid-step: not recorded (censored)
                if error is None:
                    core.complete(plan, comp, start, end, r)
                    self._release_finished(r, plan)
                else:
                    self.step_errors.append(error)
                    core.fail_step(plan, end, error, r)
                    for seq, _ in plan.entries:
                        self.slots[r].release(seq.id)
                cond.notify_all()

    def _release_finished(self, replica: int, plan: StepPlan) -> None:
        for seq, _ in plan.entries:
            if seq.emitted >= seq.output:
                self.slots[replica].release(seq.id)


def decoder_for(spec: dict[str, Any], max_slots: int, max_len: int) -> LlamaDecoder:
    """A decoder of ``spec`` (shape and sizes, device, dtype) holding at least ``max_slots``
    sequences of ``max_len`` tokens. The cache keeps the profile's size when that is enough:
    its size changes the step time (memory locality), and the engine must run the decoder
    the profile measured.
    """
    from calibration.llm_decoder import SHAPES, DecoderConfig, dtype_of

    params = dict(spec.get("params") or {})
    shape = str(params.pop("shape", "small"))
    if shape not in SHAPES:
        raise ValueError(f"model.params.shape {shape!r}: allowed: {', '.join(SHAPES)}")
    base = {**SHAPES[shape].__dict__, **{k: int(v) for k, v in params.items()
                                         if k in DecoderConfig.__dataclass_fields__}}
    base.update(max_slots=max(max_slots, base["max_slots"]),
                max_len=max(max_len, base["max_len"]))
    return LlamaDecoder(DecoderConfig(**base), device=str(spec.get("device") or "cpu"),
                        dtype=dtype_of(str(spec.get("dtype") or "fp32")))
