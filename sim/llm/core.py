"""The LLM engine core: admission, one step at a time, token bookkeeping and the per-step checks.

Drivers are clocks around :meth:`LlmCore.plan` and :meth:`LlmCore.complete`: the simulated
clock (:func:`sim.llm.runner.simulate`) advances by the step model's time, a live driver would
by the wall clock. Arrivals that come during a step join between steps, as in an engine core.

Records: per request arrival, first token, finish and status; every output token's time (in
one flat array, request ``i``'s tokens at ``token_offset[i]:token_offset[i + 1]``); per step
its start, duration, composition and the KV and queue state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sim.fleet import DRAINING, READY, STARTING, Fleet
from sim.llm.kv import Seq
from sim.llm.schedulers import LlmScheduler, StepPlan
from sim.llm.step_model import Composition, composition

QUEUED, RUNNING, OK, REJECTED, FAILED, IN_FLIGHT = (
    "queued", "running", "ok", "rejected", "failed", "in_flight")


class StepInvariantError(RuntimeError):
    """A step broke a limit (sequences, token budget, KV blocks) or a token was lost or
    produced twice: a bug in a scheduler or the core.
    """


@dataclass
class StepLog:
    """Per-step columns (lists, converted to a table at the end)."""

    replica: list[int] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    prefill_context: list[int] = field(default_factory=list)
    decode_seqs: list[int] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)
    num_seqs: list[int] = field(default_factory=list)
    kv_blocks_used: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)


ROUTINGS = ("jsq", "round_robin")


class LlmCore:
    """Requests, one scheduler per replica and the bookkeeping both drivers share.

    Args:
        arrival_s: Arrival times (ascending).
        prompt_tokens: Prompt length per request.
        output_tokens: Output length per request (generated to exactly this).
        schedulers: One scheduler per replica (each owns its queues and KV accounting); a
            single scheduler is one replica.
        routing: Which replica an arrival joins: ``jsq`` (fewest requests waiting or
            running, lowest index on ties) or ``round_robin``.
    """

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                 output_tokens: np.ndarray, schedulers: LlmScheduler | list[LlmScheduler],
                 routing: str = "jsq", priority: np.ndarray | None = None,
                 fleet: Fleet | None = None) -> None:
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
        self._next_rr = 0
        self.scheduler = self.schedulers[0]
        self.limits = self.scheduler.limits
        self.replica = np.full(n, -1, dtype=np.int64)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.status = np.full(n, QUEUED, dtype=object)
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
        if fleet is not None and len(fleet.state) != len(self.schedulers):
            raise ValueError(f"fleet has {len(fleet.state)} slots for "
                             f"{len(self.schedulers)} schedulers")

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

    def _route(self) -> int:
        if self.fleet is not None:
            slots = self._candidates()
            if self.routing == "round_robin":
                r = slots[self._next_rr % len(slots)]
                self._next_rr += 1
                return r
            return min(slots, key=lambda k: (self._outstanding[k], k))
        if len(self.schedulers) == 1:
            return 0
        if self.routing == "round_robin":
            r = self._next_rr
            self._next_rr = (r + 1) % len(self.schedulers)
            return r
        loads = self._outstanding
        return loads.index(min(loads))

    # -- autoscaling -------------------------------------------------------------------------
    def _candidates(self) -> list[int]:
        """Where an arrival may go (:meth:`sim.fleet.Fleet.candidates`)."""
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
        cold start) and retire others (they finish every request they hold, then stop).
        """
        fleet = self.fleet
        assert fleet is not None
        queued = sum(s.queued() for s in self.schedulers)
        view = fleet.view(now_s, queued, sum(self._outstanding) - queued)
        launch, retire = fleet.plan(view, list(self._outstanding))
        for r in launch:
            fleet.launch(r, now_s)
            self.launched.append(r)
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
            self.admitted += 1
            r = self._route()
            sched = self.schedulers[r]
            self.replica[i] = r
            why = sched.refuse(seq)
            if why is not None:
                self.status[i], self.reason[i] = REJECTED, why
                self.finish_s[i] = seq.arrival_s
                continue
            self._seqs[i] = seq
            sched.add(seq)
            self._outstanding[r] += 1
            touched.add(r)
        for r in touched:
            self._record_queue(r, now_s)

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
        """Mark what is unfinished as in flight, check conservation, return status counts.

        Raises:
            StepInvariantError: a request lost or produced a token twice.
        """
        for i in range(self.admitted):
            seq = self._seqs[i]
            if seq is not None and self.status[i] in (QUEUED, RUNNING):
                self.status[i] = IN_FLIGHT
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
        statuses, counts = np.unique(self.status[: self.admitted].astype(str),
                                     return_counts=True)
        return {str(k): int(v) for k, v in zip(statuses, counts, strict=True)}
