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

from sim.llm.kv import Seq
from sim.llm.schedulers import LlmScheduler, StepPlan
from sim.llm.step_model import Composition, composition

QUEUED, RUNNING, OK, REJECTED, IN_FLIGHT = "queued", "running", "ok", "rejected", "in_flight"


class StepInvariantError(RuntimeError):
    """A step broke a limit (sequences, token budget, KV blocks) or a token was lost or
    produced twice: a bug in a scheduler or the core.
    """


@dataclass
class StepLog:
    """Per-step columns (lists, converted to a table at the end)."""

    start_s: list[float] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decode_seqs: list[int] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)
    num_seqs: list[int] = field(default_factory=list)
    kv_blocks_used: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)


class LlmCore:
    """Requests, a scheduler and the bookkeeping both drivers share.

    Args:
        arrival_s: Arrival times (ascending).
        prompt_tokens: Prompt length per request.
        output_tokens: Output length per request (generated to exactly this).
        scheduler: The scheduler (owns its queues and KV accounting).
    """

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                 output_tokens: np.ndarray, scheduler: LlmScheduler) -> None:
        n = arrival_s.size
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens.astype(np.int64)
        self.output_tokens = output_tokens.astype(np.int64)
        self.scheduler = scheduler
        self.limits = scheduler.limits
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.status = np.full(n, QUEUED, dtype=object)
        self.reason = np.full(n, "", dtype=object)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.work_tokens = np.zeros(n, dtype=np.int64)
        self.token_offset = np.concatenate(([0], np.cumsum(self.output_tokens)))
        self.token_s = np.full(int(self.token_offset[-1]), np.nan)
        self.steps = StepLog()
        self.queue_time_s: list[float] = [0.0]
        self.queue_len: list[int] = [0]
        self.admitted = 0
        self._seqs: list[Seq | None] = [None] * n

    # -- arrivals ----------------------------------------------------------------------------
    def next_arrival_s(self) -> float:
        """When the next request arrives (inf when none is left)."""
        return float(self.arrival_s[self.admitted]) if self.admitted < self.arrival_s.size \
            else math.inf

    def admit_until(self, now_s: float) -> None:
        """Hand every request that arrived by ``now_s`` to the scheduler (or reject it)."""
        sched = self.scheduler
        changed = False
        while self.admitted < self.arrival_s.size and self.arrival_s[self.admitted] <= now_s:
            i = self.admitted
            seq = Seq(i, float(self.arrival_s[i]), int(self.prompt_tokens[i]),
                      int(self.output_tokens[i]))
            self.admitted += 1
            why = sched.refuse(seq)
            if why is not None:
                self.status[i], self.reason[i] = REJECTED, why
                self.finish_s[i] = seq.arrival_s
                continue
            self._seqs[i] = seq
            sched.add(seq)
            changed = True
        if changed:
            self._record_queue(now_s)

    def _record_queue(self, now_s: float) -> None:
        self.queue_time_s.append(now_s)
        self.queue_len.append(self.scheduler.queued())

    # -- steps -------------------------------------------------------------------------------
    def plan(self, now_s: float) -> tuple[StepPlan, Composition | None]:
        """The next step's plan and composition (None when there is nothing to compute)."""
        plan = self.scheduler.schedule(now_s)
        if plan.empty:
            return plan, None
        self._check(plan)
        return plan, composition(plan)

    def _check(self, plan: StepPlan) -> None:
        lim = self.limits
        seqs = len(plan.entries) + plan.padding_seqs
        tokens = sum(n for _, n in plan.entries)
        if seqs > lim.max_num_seqs:
            raise StepInvariantError(f"{self.scheduler!r} planned {seqs} sequences, above "
                                     f"max_num_seqs {lim.max_num_seqs}")
        if tokens > lim.max_num_batched_tokens:
            raise StepInvariantError(f"{self.scheduler!r} planned {tokens} tokens, above "
                                     f"max_num_batched_tokens {lim.max_num_batched_tokens}")
        if lim.num_blocks is not None and self.scheduler.kv_used_blocks() > lim.num_blocks:
            raise StepInvariantError(f"{self.scheduler!r} holds "
                                     f"{self.scheduler.kv_used_blocks()} KV blocks of "
                                     f"{lim.num_blocks}")
        for seq, n in plan.entries:
            if n < 1 or n > seq.remaining:
                raise StepInvariantError(f"{self.scheduler!r} planned {n} tokens for request "
                                         f"{seq.id}, which needs {seq.remaining}")

    def complete(self, plan: StepPlan, comp: Composition, start_s: float,
                 end_s: float) -> None:
        """The step ran from ``start_s`` to ``end_s``: advance its sequences, record tokens,
        free the finished.
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
        self.scheduler.finished(done)
        log = self.steps
        log.start_s.append(start_s)
        log.duration_s.append(end_s - start_s)
        log.prefill_tokens.append(comp.prefill_tokens)
        log.decode_seqs.append(comp.decode_seqs)
        log.kv_tokens.append(comp.kv_tokens)
        log.num_seqs.append(len(plan.entries) + plan.padding_seqs)
        log.kv_blocks_used.append(self.scheduler.kv_used_blocks())
        log.waiting.append(self.scheduler.queued())
        log.preempted.append(len(plan.preempted))
        self._record_queue(end_s)

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
        produced = ~np.isnan(self.token_s)
        per_request = np.add.reduceat(produced, self.token_offset[:-1]) if produced.size \
            else np.zeros(self.admitted, dtype=np.int64)
        per_request = per_request[: self.admitted] if per_request.size else per_request
        full = self.output_tokens[: self.admitted]
        if per_request.size and np.any(per_request[ok] != full[ok]):
            bad = int(np.flatnonzero(per_request[ok] != full[ok])[0])
            raise StepInvariantError(f"request {np.flatnonzero(ok)[bad]} finished with "
                                     f"{per_request[ok][bad]} of {full[ok][bad]} tokens")
        statuses, counts = np.unique(self.status[: self.admitted].astype(str),
                                     return_counts=True)
        return {str(k): int(v) for k, v in zip(statuses, counts, strict=True)}
