"""The live LLM engine: the simulator's LLM core and scheduler objects, the wall clock, and a
real decoder (:class:`calibration.llm_decoder.LlamaDecoder`, the one calibration measures).

Like the simulated clock (:func:`sim.drivers.llm_simulate.simulate`) it only keeps time: the
driving thread calls :meth:`sim.serving.llm.core.LlmCore.step` with the steps that ended and
the engines that finished loading, and hands each step it returns to that engine's worker
thread, which executes the plan's prefill chunks and decodes as one step on the decoder (each
sequence in its own KV-cache slot, from its ``computed`` position) and reports the step back
with its measured start and end. The core is touched by the driving thread only, so the two
drivers apply events in the same order. Token times go into the same records and metrics
code as the simulator's. Outputs are forced to each request's length: the sampled token is
ignored (greedy), as ``--ignore-eos`` does.

With prefix caching on, the engine follows the scheduler's KV manager
(:class:`sim.serving.llm.prefix_cache.PrefixCachingBlockPool`, the simulator's): a sequence
admitted with a cached prefix has that prefix's blocks copied from the decoder's block store
into its slot before its first step (:meth:`calibration.llm_decoder.LlamaDecoder.load_blocks`),
and each full prompt block the pool caches is copied from the slot into the store block of the
same id after the step that computed it (``save_blocks``). The copies run inside the step, so
their time is in the measured step time (:attr:`LiveLlmEngine.kv_copies` counts them). A block
cached and hit within one step is copied in before it is copied out (its KV is then stale;
the tokens are random and outputs forced, so only the time matters).

Sequences join a free slot when first scheduled and leave it when they finish, fail or are
preempted (a preempted sequence recomputes from position 0 when scheduled again, in whatever
slot is free then). A step that raises fails only its requests. :meth:`LiveLlmEngine.stop`
(Ctrl-C or SIGTERM, see :mod:`executor.lifecycle`) stops admitting; ``drain`` finishes what was
admitted, ``abandon`` leaves it in flight; :meth:`LiveLlmEngine.hurry` (a second signal) ends
the run at once. The drain deadline (horizon + drain timeout) ends the run on time; what is
unfinished stays in flight (censored). A step that hangs holds its worker thread, not the
process: the workers get at most ``hung_grace_s`` to return after the run ends.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from calibration.llm_decoder import LlamaDecoder, StepEntry
from executor.lifecycle import HUNG_GRACE_S, check_stop_mode, join_within
from sim.scenario.step_time import StepModel
from sim.serving.llm.core import LlmCore
from sim.serving.llm.prefix_cache import PrefixCachingBlockPool
from sim.serving.llm.schedulers import StepPlan
from sim.serving.llm.step_model import Composition
from sim.serving.llm.steps import LlmActions, StepDone


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
        # per engine: its current launch's generation (a cancelled load's decoder, when it
        # comes, carries an older one and is dropped)
        self._launch_gen = [0] * len(decoders)
        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()  # to the driving thread
        self._busy: list[bool] = []
        self._inboxes: list[queue.Queue[Any]] = []
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
        # prefix caching: tokens copied into slots (loaded) and into the store (saved), and
        # the seconds those copies took, per replica
        self.kv_copies = [{"loaded_tokens": 0, "saved_tokens": 0, "copy_s": 0.0}
                          for _ in decoders]

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
        self._events.put(("stop",))  # wake the driving thread now

    def hurry(self) -> None:
        """End the run now: abandon admitted work and do not wait for running steps."""
        self._hurry.set()
        self.stop("abandon")

    def now_s(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start_perf

    def _pool(self, replica: int) -> PrefixCachingBlockPool | None:
        kv = getattr(self.core.schedulers[replica], "kv", None)
        return kv if isinstance(kv, PrefixCachingBlockPool) else None

    def _entries(self, replica: int, plan: StepPlan
                 ) -> tuple[list[StepEntry], list[tuple[int, list[int]]],
                            list[tuple[int, list[tuple[int, int]]]]]:
        """The step's entries, the cached prefixes to load into new slots ``(slot, block
        ids)`` and the blocks to save after it ``(slot, [(block index, block id)])``.
        """
        table = self.slots[replica]
        for seq in plan.preempted:
            table.release(seq.id)
        pool = self._pool(replica)
        entries, loads, saves = [], [], []
        for seq, n in plan.entries:
            new = seq.id not in table.of
            slot = table.slot(seq.id)
            entries.append(StepEntry(slot, seq.computed, n))
            if pool is None:
                continue
            held, bs = pool.held.get(seq.id, []), pool.block_size
            if new and seq.computed:  # admitted with a cached prefix (whole blocks)
                loads.append((slot, held[:seq.computed // bs]))
            done = min((seq.computed + n) // bs, len(seq.hashes), len(held))
            pairs = [(j, held[j]) for j in range(seq.computed // bs, done)
                     if pool.key[held[j]] >= 0]
            if pairs:
                saves.append((slot, pairs))
        return entries, loads, saves

    def _execute(self, replica: int, plan: StepPlan,
                 comp: Composition) -> tuple[float, float, str | None]:
        start = self.now_s()
        error = None
        decoder = self.decoders[replica]
        try:
            entries, loads, saves = self._entries(replica, plan)
            if isinstance(decoder, ReplayDecoder):  # a stand-in: the step model's own time
                decoder.run(comp)
                return start, self.now_s(), None
            copies = self.kv_copies[replica]
            t0 = time.perf_counter()
            for slot, blocks in loads:
                decoder.load_blocks(slot, blocks)
                copies["loaded_tokens"] += len(blocks) * decoder.block_size
            copies["copy_s"] += time.perf_counter() - t0
            if entries:
                decoder.step(entries)
            t0 = time.perf_counter()
            for slot, pairs in saves:
                decoder.save_blocks(slot, pairs)
                copies["saved_tokens"] += len(pairs) * decoder.block_size
            copies["copy_s"] += time.perf_counter() - t0
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
        self._launch_gen[replica] += 1
        gen = self._launch_gen[replica]

        def load() -> None:
            t0 = self.now_s()
            try:
                decoder = loader(replica)
            except Exception as exc:  # the run cannot go on as the autoscaler planned
                if gen != self._launch_gen[replica]:
                    return  # a cancelled launch: the run no longer needs it
                self.fatal_error = (f"engine {replica} could not load its model: "
                                    f"{type(exc).__name__}: {exc}").splitlines()[0][:300]
                self.stop("abandon")
                return
            self._events.put(("loaded", replica, decoder, t0, self.now_s(), gen))

        thread = threading.Thread(target=load, name=f"load-engine-{replica}", daemon=True)
        self._loading[replica] = thread
        thread.start()

    # -- the clock ---------------------------------------------------------------------------
    def run(self) -> float:
        """Run until every admitted request is done (or stopped, or past the drain deadline);
        return the end time (s since the start).

        Each engine steps on its own worker thread, as independent engines do (torch
        releases the GIL); the calling thread owns the core: it calls
        :meth:`LlmCore.step` at arrivals, timers, control periods, ended steps and loaded
        engines. At the deadline, or when abandoned, steps still running are not recorded
        (censored, as in the simulator).
        """
        n = len(self.core.schedulers)
        self.start_perf = time.perf_counter()
        self._busy = [False] * n
        inboxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(n)]
        self._inboxes = inboxes
        workers = [threading.Thread(target=self._worker, args=(r, inboxes[r]),
                                    name=f"engine-{r}", daemon=True) for r in range(n)]
        for w in workers:
            w.start()
        try:
            return self._drive()
        finally:
            for inbox in inboxes:
                inbox.put(None)
            join_within(workers, self.hung_grace_s, self._hurry)  # a hung step: bounded

    def _drive(self) -> float:
        """The driving thread: one :meth:`LlmCore.step` per event, the stop, the end."""
        core = self.core
        deadline = self.drain_until_s
        finished: list[StepDone] = []
        ready: list[tuple[int, float]] = []
        while True:
            now = self.now_s()
            admit = self.stopped_at_s is None  # what was due by the stop still arrives
            if self._stop.is_set() and self.stopped_at_s is None:
                self.stopped_at_s = now
            abandon = self.stopped_at_s is not None and self._mode == "abandon"
            actions = core.step(now, finished, ready=ready, admit=admit,
                                plan=now < deadline and not abandon)
            self._apply(actions, finished)
            finished, ready = [], []
            if abandon:
                return now
            if now >= deadline:
                self.drain_timed_out = any(s.has_work() for s in core.schedulers) or any(
                    self._busy)
                return now
            working = any(self._busy) or any(
                s.has_work() for r, s in enumerate(core.schedulers) if core.steps_on(r))
            if actions.wake_s == math.inf and not self._loading and not working:
                return now  # nothing left to run or to wait for
            self._collect(min(actions.wake_s, deadline, now + 0.05), finished, ready)

    def _apply(self, actions: LlmActions, finished: list[StepDone]) -> None:
        """Free the slots of what ended, start loads, free stopped engines, start steps."""
        for done in finished:
            table = self.slots[done.replica]
            for seq, _ in done.plan.entries:
                if done.error is not None or seq.emitted >= seq.output:
                    table.release(seq.id)
        for replica in actions.cancel:  # its load goes on; what it loads is dropped
            self._launch_gen[replica] += 1
            self._loading.pop(replica, None)
        for replica in actions.stop:
            self.decoders[replica] = None  # the model is released with its last reference
        for replica in actions.launch:
            self._launch(replica)
        for start in actions.start:
            self._busy[start.replica] = True
            self._inboxes[start.replica].put(start)

    def _collect(self, until_s: float, finished: list[StepDone],
                 ready: list[tuple[int, float]]) -> None:
        """Wait until ``until_s`` or the first event (a step ended, an engine loaded, a
        stop), then take every event that is there.
        """
        try:
            event = self._events.get(timeout=max(until_s - self.now_s(), 0.0))
        except queue.Empty:
            return
        while True:
            if event[0] == "done":
                done: StepDone = event[1]
                self._busy[done.replica] = False
                if done.error is not None:
                    self.step_errors.append(done.error)
                finished.append(done)
            elif event[0] == "loaded":
                _, replica, decoder, t0, t1, gen = event
                # a cancelled launch's decoder is dropped here (released with this
                # reference); only the current launch becomes ready
                if gen == self._launch_gen[replica]:
                    self._loading.pop(replica, None)
                    self.decoders[replica] = decoder
                    self.slots[replica] = SlotTable(decoder.cfg.max_slots)
                    self.cold_starts_s.append({"replica": replica, "total_s": t1 - t0})
                    ready.append((replica, t1))
                del decoder, event
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return

    def _worker(self, r: int, inbox: queue.Queue[Any]) -> None:
        """One engine: run each step it is given and report it back."""
        while True:
            start = inbox.get()
            if start is None:
                return
            t0, t1, error = self._execute(r, start.plan, start.comp)
            self._events.put(("done", StepDone(r, start.plan, start.comp, t0, t1, error)))


def decoder_for(spec: dict[str, Any], max_slots: int, max_len: int) -> LlamaDecoder:
    """A decoder of ``spec`` (shape and sizes, device, dtype) holding at least ``max_slots``
    sequences of ``max_len`` tokens. The cache keeps the profile's size when that is enough:
    its size changes the step time (memory locality), and the engine must run the decoder
    the profile measured.
    """
    from dataclasses import asdict

    from calibration.llm_decoder import DecoderConfig, dtype_of
    from calibration.llm_shapes import config_for

    base = asdict(config_for(spec.get("params")))
    base.update(max_slots=max(max_slots, base["max_slots"]),
                max_len=max(max_len, base["max_len"]))
    return LlamaDecoder(DecoderConfig(**base), device=str(spec.get("device") or "cpu"),
                        dtype=dtype_of(str(spec.get("dtype") or "fp32")))
