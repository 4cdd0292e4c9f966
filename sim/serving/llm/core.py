"""The LLM engine core: admission, one step at a time, token bookkeeping and the per-step checks.

One loop, :meth:`LlmCore.step`, that both LLM drivers call, as both request-level drivers
call :meth:`sim.serving.core.ServingCore.step`. A driver is only a clock: the simulated one
(:func:`sim.drivers.llm_simulate.simulate`) advances by the step model's time, the live one
(:class:`executor.llm_driver.LiveLlmEngine`) by the wall clock on a real decoder. Each call
applies, in this fixed order:

1. the steps that ended since the last call (by end time): tokens recorded, finished
   requests freed; a step that raised fails its requests;
2. the engines whose model finished loading (by time), each after the arrivals before it;
3. the autoscaler's control periods that fell due (each after the arrivals before it), and
   an arrival to an empty fleet;
4. the arrivals up to now;
5. every engine that runs and is not in a step plans its next one (an engine with work that
   plans nothing and sets no timer is a scheduler bug).

Arrivals that come during a step join between steps, as in an engine core.

Records: per request arrival, first token, finish and status; every output token's time (in
one flat array, request ``i``'s tokens at ``token_offset[i]:token_offset[i + 1]``); per step
its start, duration, composition and the KV and queue state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sim.serving.fleet import DRAINING, READY, STARTING, Fleet
from sim.serving.llm.affinity import PrefixAffinity
from sim.serving.llm.kv import Seq
from sim.serving.llm.prefix_cache import PrefixCachingBlockPool
from sim.serving.llm.schedulers import LlmScheduler, StepPlan
from sim.serving.llm.step_model import Composition, composition
from sim.serving.llm.steps import LlmActions, StepDone, StepInvariantError, StepLog, StepStart
from sim.serving.routing import JoinShortestQueue, ReplicaLoad, RoundRobin, Router
from sim.serving.types import FAILED, OK, QUEUED, REJECTED, RUNNING, status_labels

ROUTINGS = ("jsq", "round_robin", "prefix_affinity")


class LlmCore:
    """Requests, one scheduler per replica and the bookkeeping both drivers share.

    Args:
        arrival_s: Arrival times (ascending).
        prompt_tokens: Prompt length per request.
        output_tokens: Output length per request (generated to exactly this).
        schedulers: One scheduler per replica (each owns its queues and KV accounting); a
            single scheduler is one replica.
        routing: Which replica an arrival joins: ``jsq`` (fewest requests waiting or
            running, lowest index on ties), ``round_robin`` or ``prefix_affinity`` (the
            longest cached prefix within a load bound: :mod:`sim.serving.llm.affinity`).
        block_keys: Per request, the keys of its full prompt blocks (prefix caching).
        affinity: The ``prefix_affinity`` rule's knobs (default: its defaults).
    """

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                 output_tokens: np.ndarray, schedulers: LlmScheduler | list[LlmScheduler],
                 routing: str = "jsq", priority: np.ndarray | None = None,
                 fleet: Fleet | None = None, block_keys: list[tuple[int, ...]] | None = None,
                 affinity: PrefixAffinity | None = None) -> None:
        n = arrival_s.size
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens.astype(np.int64)
        self.output_tokens = output_tokens.astype(np.int64)
        self.priority = (np.zeros(n, dtype=np.int64) if priority is None
                         else priority.astype(np.int64))
        self.schedulers = schedulers if isinstance(schedulers, list) else [schedulers]
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: allowed: {', '.join(ROUTINGS)}")
        self.routing = routing
        self.router: Router = RoundRobin() if routing == "round_robin" else JoinShortestQueue()
        self.block_keys = block_keys
        self.affinity = affinity or PrefixAffinity()
        self.scheduler = self.schedulers[0]
        self.limits = self.scheduler.limits
        self.replica = np.full(n, -1, dtype=np.int64)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.status = np.full(n, QUEUED, dtype=np.int8)  # sim.serving.types codes
        self.reason = np.full(n, "", dtype=object)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.work_tokens = np.zeros(n, dtype=np.int64)
        # one slot per token that can be generated: a request no replica could ever hold
        # (refused on arrival, e.g. too big for the KV cache) gets none, so one row with 1e9
        # output tokens costs nothing before it is refused
        slots = np.where(self._never_runs(), 0, self.output_tokens)
        self.token_offset = np.concatenate(([0], np.cumsum(slots, dtype=np.int64)))
        self.token_s = np.full(int(self.token_offset[-1]), np.nan)
        self.steps = StepLog()
        self.queue_time_s: list[float] = [0.0] * len(self.schedulers)
        self.queue_len: list[int] = [0] * len(self.schedulers)
        self.queue_replica: list[int] = list(range(len(self.schedulers)))
        self._outstanding = [0] * len(self.schedulers)
        self.admitted = 0
        self._seqs: list[Seq | None] = [None] * n
        self.fleet = fleet
        self.launched: list[int] = []  # replicas launched since the driver last looked
        self.stopped: list[int] = []  # drained replicas stopped since then
        self.cancelled: list[int] = []  # launches dropped since then (before they were ready)
        self._in_step = [False] * len(self.schedulers)  # an engine the driver is running
        self._wake_s = [math.inf] * len(self.schedulers)  # an idle engine's timer
        if fleet is not None and len(fleet.state) != len(self.schedulers):
            raise ValueError(f"fleet has {len(fleet.state)} slots for "
                             f"{len(self.schedulers)} schedulers")

    # -- the loop both drivers call ----------------------------------------------------------
    def step(self, now_s: float, finished: Sequence[StepDone] = (), *,
             ready: Sequence[tuple[int, float]] = (), admit: bool = True,
             plan: bool = True) -> LlmActions:
        """Advance the core to ``now_s``; see the module docstring for the order.

        Args:
            now_s: The driver's time.
            finished: Steps that ended since the last call (``end_s`` <= ``now_s``).
            ready: Launched engines whose model finished loading since the last call, with
                the time it finished (autoscaling).
            admit: False: admit no more arrivals and consult no autoscaler (a live run that
                was stopped).
            plan: False: record what ended but start no step (a run that is being abandoned
                or is past its drain deadline).

        Returns:
            The steps to start now, when to call again, and engines to launch or stop.

        Raises:
            StepInvariantError: a scheduler broke a limit, or has work but planned nothing
                and set no timer.
        """
        for done in sorted(finished, key=lambda d: (d.end_s, d.replica)):
            self._in_step[done.replica] = False
            if done.error is None:
                self.complete(done.plan, done.comp, done.start_s, done.end_s, done.replica)
            else:
                self.fail_step(done.plan, done.end_s, done.error, done.replica)
        fleet = self.fleet
        if fleet is not None:
            for replica, ready_s in sorted(ready, key=lambda x: x[1]):
                if admit:
                    self.admit_until(ready_s)
                self.ready(replica, ready_s)
            if admit:
                self.autoscale_until(now_s)
        if admit:
            self.admit_until(now_s)
        launch, stop, cancel = tuple(self.launched), tuple(self.stopped), tuple(self.cancelled)
        self.launched.clear()
        self.stopped.clear()
        self.cancelled.clear()
        start: list[StepStart] = []
        if plan:
            for r in range(len(self.schedulers)):
                if self._in_step[r] or not self.steps_on(r):
                    continue
                step_plan, comp = self.plan(now_s, r)
                if comp is not None:
                    self._in_step[r] = True
                    self._wake_s[r] = math.inf
                    start.append(StepStart(r, step_plan, comp))
                    continue
                wake_at_s = step_plan.wake_at_s
                self._wake_s[r] = wake_at_s if wake_at_s is not None else math.inf
                if wake_at_s is None and self.schedulers[r].has_work() \
                        and not step_plan.preempted:
                    raise StepInvariantError(f"{self.schedulers[r]!r} has work but planned "
                                             "nothing and set no timer: it would never finish")
        wake_s = min(self._wake_s)
        if admit:
            wake_s = min(wake_s, self.next_arrival_s())
            if fleet is not None and self.ticking():
                wake_s = min(wake_s, fleet.next_tick_s)
        return LlmActions(start, wake_s, launch, stop, cancel)

    def in_step(self, replica: int) -> bool:
        """Whether the driver is running a step on ``replica`` (started, not yet ended)."""
        return self._in_step[replica]

    def _never_runs(self) -> np.ndarray:
        """Requests that every replica's scheduler would refuse on arrival (the replicas
        share one configuration, so the first one answers for all).
        """
        sched = self.schedulers[0]
        out = np.zeros(self.arrival_s.size, dtype=bool)
        for i in np.flatnonzero(self.output_tokens > 0):
            seq = Seq(int(i), 0.0, int(self.prompt_tokens[i]), int(self.output_tokens[i]), 0)
            out[i] = sched.refuse(seq) is not None
        return out

    # -- arrivals ----------------------------------------------------------------------------
    def next_arrival_s(self) -> float:
        """When the next request arrives (inf when none is left)."""
        return float(self.arrival_s[self.admitted]) if self.admitted < self.arrival_s.size \
            else math.inf

    def _route(self, now_s: float, seq: Seq) -> int:
        """The replica an arrival joins: ``prefix_affinity`` (:mod:`sim.serving.llm.affinity`),
        else the router of :mod:`sim.serving.routing` over the candidate replicas (all, or an
        autoscaled fleet's), each loaded with the requests it holds (waiting or running).
        """
        if self.routing == "prefix_affinity":
            candidates = self._candidates() if self.fleet is not None else range(
                len(self.schedulers))
            return self.affinity.choose(seq, candidates, self._outstanding, self.schedulers)
        if self.fleet is None and len(self.schedulers) == 1:
            return 0
        slots = self._candidates() if self.fleet is not None else range(len(self.schedulers))
        loads = [ReplicaLoad(i, self._outstanding[slot], 0, 0, 0.0)
                 for i, slot in enumerate(slots)]
        return slots[self.router.route(now_s, seq.id, loads)]

    # -- autoscaling -------------------------------------------------------------------------
    def _candidates(self) -> list[int]:
        """Where an arrival may go (:meth:`sim.serving.fleet.Fleet.candidates`)."""
        assert self.fleet is not None
        return self.fleet.candidates(self._outstanding)

    def steps_on(self, replica: int) -> bool:
        """Whether a replica runs steps: always without a fleet; ready or draining with."""
        return self.fleet is None or self.fleet.state[replica] in (READY, DRAINING)

    def ticking(self) -> bool:
        """Whether the autoscaler has anything left to react to."""
        fleet = self.fleet
        assert fleet is not None
        return (self.next_arrival_s() < math.inf or sum(self._outstanding) > 0
                or fleet.count(STARTING) > 0 or fleet.count(DRAINING) > 0)

    def control(self, now_s: float) -> None:
        """Consult the autoscaler: launch engines (the driver reports them ready after their
        cold start), cancel starting ones and retire ready ones (they finish every request
        they hold, then stop), as :meth:`sim.serving.fleet.Fleet.plan` says.
        """
        fleet = self.fleet
        assert fleet is not None
        queued = sum(s.queued() for s in self.schedulers)
        view = fleet.view(now_s, queued, sum(self._outstanding) - queued)
        launch, cancel, retire = fleet.plan(view, list(self._outstanding))
        for r in launch:
            fleet.launch(r, now_s)
            self.launched.append(r)
        for r in cancel:
            self.cancel_launch(r, now_s)
        for r in retire:
            fleet.retire(r, now_s)
            self.stop_if_drained(r, now_s)

    def autoscale_until(self, now_s: float) -> None:
        """Run the control periods that fell due (each after the arrivals before it), then
        admit up to ``now_s`` and consult the autoscaler when the fleet is empty with
        requests waiting (the activator's poke). Both drivers call it.
        """
        fleet = self.fleet
        assert fleet is not None
        while fleet.next_tick_s <= now_s and self.ticking():
            self.admit_until(fleet.next_tick_s)
            self.control(fleet.next_tick_s)
            fleet.next_tick_s += fleet.control_period_s
        self.admit_until(now_s)
        if fleet.empty() and sum(self._outstanding) > 0:
            self.control(now_s)

    def cancel_launch(self, replica: int, now_s: float) -> None:
        """A loading engine is dropped: it goes off now, and the requests routed to it while
        no engine was ready go back to the router (Ray's router holds a request until some
        replica runs; see :meth:`sim.serving.fleet.Fleet.plan`).
        """
        fleet = self.fleet
        assert fleet is not None
        fleet.cancel_for(replica, now_s, self.launched, self.cancelled)
        sched = self.schedulers[replica]
        if getattr(sched, "running", None) or getattr(sched, "batch", None):
            raise StepInvariantError(f"replica {replica} ran requests before it was ready")
        if not sched.waiting:
            return
        moved = list(sched.waiting)
        sched.waiting.clear()
        self._outstanding[replica] -= len(moved)
        self._record_queue(replica, now_s)
        touched: set[int] = set()
        for seq in moved:  # the replicas share one configuration: none refuses it now
            self._place(seq, self._route(now_s, seq), touched)
        for r in sorted(touched):
            self._record_queue(r, now_s)

    def ready(self, replica: int, now_s: float) -> None:
        """A launched engine has loaded its model."""
        assert self.fleet is not None
        self.fleet.ready(replica, now_s)

    def stop_if_drained(self, replica: int, now_s: float) -> None:
        """A retired engine with nothing left stops."""
        fleet = self.fleet
        if fleet is not None and fleet.state[replica] == DRAINING and \
                self._outstanding[replica] == 0:
            fleet.stop(replica, now_s)
            self.stopped.append(replica)

    def admit_until(self, now_s: float) -> None:
        """Hand every request that arrived by ``now_s`` to a replica's scheduler (or reject
        it); the router sees the replicas' loads at that moment.
        """
        touched: set[int] = set()
        while self.admitted < self.arrival_s.size and self.arrival_s[self.admitted] <= now_s:
            i = self.admitted
            seq = Seq(i, float(self.arrival_s[i]), int(self.prompt_tokens[i]),
                      int(self.output_tokens[i]), int(self.priority[i]))
            if self.block_keys is not None:
                seq.hashes = self.block_keys[i]
            self.admitted += 1
            r = self._route(seq.arrival_s, seq)
            sched = self.schedulers[r]
            self.replica[i] = r
            why = sched.refuse(seq)
            if why is not None:
                self.status[i], self.reason[i] = REJECTED, why
                self.finish_s[i] = seq.arrival_s
                continue
            self._seqs[i] = seq
            self._place(seq, r, touched)
        for r in touched:
            self._record_queue(r, now_s)

    def _place(self, seq: Seq, replica: int, touched: set[int]) -> None:
        """Give a sequence to ``replica``'s scheduler, adding it to ``touched``."""
        self.replica[seq.id] = replica
        self.schedulers[replica].add(seq)
        self._outstanding[replica] += 1
        touched.add(replica)

    def _record_queue(self, replica: int, now_s: float) -> None:
        self.queue_time_s.append(now_s)
        self.queue_len.append(self.schedulers[replica].queued())
        self.queue_replica.append(replica)

    # -- steps -------------------------------------------------------------------------------
    def plan(self, now_s: float, replica: int = 0) -> tuple[StepPlan, Composition | None]:
        """A replica's next step: plan and composition (None when there is nothing to do)."""
        if not self.steps_on(replica):
            raise StepInvariantError(f"replica {replica} is {self.fleet.state[replica]} "  # type: ignore[union-attr]
                                     "and cannot run a step")
        plan = self.schedulers[replica].schedule(now_s)
        if plan.empty:
            return plan, None
        self._check(plan, self.schedulers[replica])
        return plan, composition(plan)

    def _check(self, plan: StepPlan, sched: LlmScheduler) -> None:
        lim = self.limits
        seqs = len(plan.entries) + plan.padding_seqs
        tokens = sum(n for _, n in plan.entries)
        if seqs > lim.max_num_seqs:
            raise StepInvariantError(f"{sched!r} planned {seqs} sequences, above "
                                     f"max_num_seqs {lim.max_num_seqs}")
        if tokens > lim.max_num_batched_tokens:
            raise StepInvariantError(f"{sched!r} planned {tokens} tokens, above "
                                     f"max_num_batched_tokens {lim.max_num_batched_tokens}")
        pool = getattr(sched, "kv", None)
        if isinstance(pool, PrefixCachingBlockPool):
            pool.check_counts()  # KvInvariantError: blocks lost or counted twice
        if lim.num_blocks is not None and sched.kv_used_blocks() > lim.num_blocks:
            raise StepInvariantError(f"{sched!r} holds {sched.kv_used_blocks()} KV blocks of "
                                     f"{lim.num_blocks}")
        for seq, n in plan.entries:
            if n < 1 or n > seq.remaining:
                raise StepInvariantError(f"{sched!r} planned {n} tokens for request "
                                         f"{seq.id}, which needs {seq.remaining}")

    def complete(self, plan: StepPlan, comp: Composition, start_s: float,
                 end_s: float, replica: int = 0) -> None:
        """A replica's step ran from ``start_s`` to ``end_s``: advance its sequences, record
        tokens, free the finished.
        """
        done: list[Seq] = []
        offset, token_s = self.token_offset, self.token_s
        for seq, n in plan.entries:
            seq.computed += n
            seq.work += n
            if seq.computed == seq.prompt + seq.emitted:  # caught up: one token sampled
                i = seq.id
                token_s[offset[i] + seq.emitted] = end_s
                seq.emitted += 1
                if seq.emitted == 1:
                    self.first_token_s[i] = end_s
                    self.status[i] = RUNNING
                if seq.emitted == seq.output:
                    self.finish_s[i] = end_s
                    self.status[i] = OK
                    self.preemptions[i] = seq.preemptions
                    self.work_tokens[i] = seq.work
                    done.append(seq)
        sched = self.schedulers[replica]
        sched.finished(done)
        self._outstanding[replica] -= len(done)
        log = self.steps
        log.replica.append(replica)
        log.start_s.append(start_s)
        log.duration_s.append(end_s - start_s)
        log.prefill_tokens.append(comp.prefill_tokens)
        log.prefill_context.append(comp.prefill_context)
        log.decode_seqs.append(comp.decode_seqs)
        log.kv_tokens.append(comp.kv_tokens)
        log.num_seqs.append(len(plan.entries) + plan.padding_seqs)
        log.kv_blocks_used.append(sched.kv_used_blocks())
        log.waiting.append(sched.queued())
        log.preempted.append(len(plan.preempted))
        self._record_queue(replica, end_s)
        self.stop_if_drained(replica, end_s)

    def fail_step(self, plan: StepPlan, now_s: float, reason: str, replica: int = 0) -> None:
        """A replica's step raised: its requests fail (with the reason) and leave the
        scheduler; every other request goes on.
        """
        failed = [seq for seq, _ in plan.entries]
        for seq in failed:
            i = seq.id
            self.status[i], self.reason[i] = FAILED, reason
            self.finish_s[i] = now_s
            self.preemptions[i] = seq.preemptions
            self.work_tokens[i] = seq.work
        self.schedulers[replica].finished(failed)
        self._outstanding[replica] -= len(failed)
        self._record_queue(replica, now_s)
        self.stop_if_drained(replica, now_s)

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> dict[str, int]:
        """Record what is unfinished (its status reads ``in_flight``), check conservation,
        return status counts.

        Raises:
            StepInvariantError: a request lost or produced a token twice.
        """
        for i in range(self.admitted):
            seq = self._seqs[i]
            if seq is not None and self.status[i] in (QUEUED, RUNNING):
                self.preemptions[i] = seq.preemptions
                self.work_tokens[i] = seq.work
        ok = self.status[: self.admitted] == OK
        produced = np.concatenate(([0], np.cumsum(~np.isnan(self.token_s), dtype=np.int64)))
        per_request = produced[self.token_offset[1:self.admitted + 1]] \
            - produced[self.token_offset[:self.admitted]]
        full = self.output_tokens[: self.admitted]
        if per_request.size and np.any(per_request[ok] != full[ok]):
            bad = int(np.flatnonzero(per_request[ok] != full[ok])[0])
            raise StepInvariantError(f"request {np.flatnonzero(ok)[bad]} finished with "
                                     f"{per_request[ok][bad]} of {full[ok][bad]} tokens")
        statuses, counts = np.unique(status_labels(self.status[: self.admitted]),
                                     return_counts=True)
        return {str(k): int(v) for k, v in zip(statuses, counts, strict=True)}
