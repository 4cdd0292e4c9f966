"""Iteration-level LLM schedulers: pure objects that plan each engine step.

The contract, like the request-level policies': a scheduler decides and the driver acts. It
keeps its waiting and running queues and its KV accounting, but has no clock (``now_s`` is an
argument), imports neither simpy nor torch, and never runs a model. Per step the driver calls
:meth:`schedule` and gets a :class:`StepPlan` (which sequences compute how many tokens); it
runs the step, advances each sequence (``computed``, ``emitted``) and calls :meth:`finished`
with the sequences that produced their last token.

* :class:`VllmScheduler`: vLLM V1. Running requests first, each given what it still needs
  (capped by ``long_prefill_token_threshold`` and the remaining token budget), allocating KV
  blocks as it goes; when a block is missing, the most recently admitted running request is
  preempted (recompute: its blocks are freed, its progress reset, and it goes to the front of
  the waiting queue). Waiting requests are admitted in arrival order only if nothing was
  preempted in this step, while the budget, ``max_num_seqs`` and the blocks allow; without
  chunked prefill a prompt that does not fit the remaining budget waits. With
  ``scheduling_policy: priority`` the waiting queue is ordered by (priority, arrival), level 0
  first, and the preemption victim is the running request of the lowest priority (latest
  arrival among equals), as in vLLM's priority policy. ``prefill_first``
  gives vLLM V0's default instead (what Vidur models): a step is prefill-only whenever a
  waiting prompt fits, otherwise every running request decodes.
* :class:`SarathiScheduler`: Sarathi-Serve. Decodes first, then the running prefills' chunks,
  then new prompts, all within a fixed per-step token budget (stall-free chunked prefill).
* :class:`ContinuousScheduler`: Orca. Iteration-level admission with the KV of prompt + whole
  output reserved up front (so never a preemption); a prompt is prefilled in one step.
* :class:`StaticScheduler`: request-level batching of whole generations. A batch forms when
  ``max_batch_size`` requests wait or the oldest waited ``max_wait_ms`` (the dynamic
  batcher's rule); it runs one prefill step and then decodes until its longest output ends,
  finished rows still computed (padding) until the batch ends.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from sim.serving.llm.kv import BlockManager, Seq
from sim.serving.llm.prefix_cache import PrefixCachingBlockPool


@dataclass
class StepPlan:
    """What one engine step computes.

    Attributes:
        entries: (sequence, tokens to compute) pairs; a decode computes 1.
        preempted: Sequences preempted while planning this step.
        padding_seqs: Rows computed without producing anything (static batching's finished
            rows): they count as decode sequences in the step time.
        padding_kv_tokens: The context those rows still attend to.
        wake_at_s: With nothing to run: when to ask again (a batching timer), else None.
    """

    entries: list[tuple[Seq, int]] = field(default_factory=list)
    preempted: list[Seq] = field(default_factory=list)
    padding_seqs: int = 0
    padding_kv_tokens: int = 0
    wake_at_s: float | None = None

    @property
    def empty(self) -> bool:
        """Nothing to compute."""
        return not self.entries and self.padding_seqs == 0


@dataclass(frozen=True)
class Limits:
    """What every step must respect (the driver checks each plan against them)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_blocks: int | None


class _Queues:
    """A waiting queue (arrival order) and the running requests."""

    waiting: deque[Seq]
    running: list[Seq]

    priority: bool = False

    def add(self, seq: Seq) -> None:
        """A new request joins the waiting queue (by (priority, arrival) under the priority
        policy, level 0 first; at the back otherwise).
        """
        if self.priority and self.waiting and (seq.priority, seq.arrival_s) < (
                self.waiting[-1].priority, self.waiting[-1].arrival_s):
            keys = [(s.priority, s.arrival_s) for s in self.waiting]
            self.waiting.insert(bisect.bisect_right(keys, (seq.priority, seq.arrival_s)), seq)
            return
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Anything waiting or running."""
        return bool(self.waiting or self.running)

    def queued(self) -> int:
        """Requests waiting (not running)."""
        return len(self.waiting)


class VllmScheduler(_Queues):
    """vLLM V1's scheduler (``prefill_first``: V0's default). See the module docstring."""

    name = "vllm"

    def __init__(self, *, num_blocks: int, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, enable_chunked_prefill: bool = True,
                 long_prefill_token_threshold: int = 0, prefill_first: bool = False,
                 scheduling_policy: str = "fcfs", enable_prefix_caching: bool = False) -> None:
        if scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"policy.scheduling_policy {scheduling_policy!r}: allowed: fcfs, "
                             "priority")
        self.priority = scheduling_policy == "priority"
        self.kv: BlockManager | PrefixCachingBlockPool = (
            PrefixCachingBlockPool(num_blocks, block_size) if enable_prefix_caching
            else BlockManager(num_blocks, block_size))
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked = enable_chunked_prefill
        self.threshold = long_prefill_token_threshold
        self.prefill_first = prefill_first
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_num_seqs={self.max_num_seqs}, "
                f"max_num_batched_tokens={self.max_num_batched_tokens}, "
                f"blocks={self.kv.num_blocks}x{self.kv.block_size}, "
                f"chunked={self.chunked}, prefill_first={self.prefill_first})")

    @property
    def limits(self) -> Limits:
        """The step limits."""
        return Limits(self.max_num_seqs, self.max_num_batched_tokens, self.kv.num_blocks)

    def refuse(self, seq: Seq) -> str | None:
        """Why ``seq`` can never run here (None if it can): vLLM rejects such requests."""
        if self.kv.blocks_for(seq.prompt + seq.output) > self.kv.num_blocks:
            return "kv_cache_too_small"
        unchunked = self.prefill_first or not self.chunked
        # without chunks a prompt (and, after a preemption, its outputs) prefills in one step
        if unchunked and seq.prompt + seq.output - 1 > self.max_num_batched_tokens:
            return "prompt_exceeds_max_num_batched_tokens"
        return None

    def kv_used_blocks(self) -> int:
        """KV blocks held."""
        return self.kv.used

    # -- planning ----------------------------------------------------------------------------
    def _cap(self, n: int) -> int:
        return self.threshold if 0 < self.threshold < n else n

    def _preempt(self, plan: StepPlan) -> Seq:
        if self.priority:  # the lowest priority (highest level), latest arrival among them
            victim = max(self.running, key=lambda s: (s.priority, s.arrival_s))
            self.running.remove(victim)
        else:  # FCFS: the most recently admitted
            victim = self.running.pop()
        self.kv.release(victim)
        victim.computed = 0
        victim.preemptions += 1
        if self.priority:
            self.add(victim)
        else:
            self.waiting.appendleft(victim)
        plan.preempted.append(victim)
        return victim

    def _running_order(self) -> list[Seq]:
        return self.running

    def schedule(self, now_s: float) -> StepPlan:
        """Plan the next step."""
        if self.prefill_first:
            return self._schedule_v0()
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        planned: set[int] = set()
        gone: set[int] = set()
        for seq in list(self._running_order()):
            if budget <= 0:
                break
            if seq.id in gone:
                continue  # preempted while planning an earlier one
            n = min(self._cap(seq.remaining), budget)
            ok = True
            while not self.kv.allocate(seq, n):
                victim = self._preempt(plan)
                gone.add(victim.id)
                if victim is seq:
                    ok = False
                    break
                if victim.id in planned:  # give back what it was planned
                    for k, (s, m) in enumerate(plan.entries):
                        if s is victim:
                            budget += m
                            del plan.entries[k]
                            break
                    planned.discard(victim.id)
            if not ok:
                break
            plan.entries.append((seq, n))
            planned.add(seq.id)
            budget -= n
        if not plan.preempted:
            self._admit(plan, budget)
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.kv.cached_prefix_tokens(seq)  # 0 without prefix caching
            n = self._cap(seq.remaining - hit)
            if not self.chunked and n > budget:
                break
            n = min(n, budget)
            if not self.kv.allocate(seq, n, hit):
                break
            seq.computed += hit
            self.waiting.popleft()
            self.running.append(seq)
            plan.entries.append((seq, n))
            budget -= n

    def _schedule_v0(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.kv.cached_prefix_tokens(seq)
            n = seq.remaining - hit
            if n > budget or not self.kv.allocate(seq, n, hit):
                break
            seq.computed += hit
            self.waiting.popleft()
            self.running.append(seq)
            plan.entries.append((seq, n))
            budget -= n
        if plan.entries:
            return plan  # a prefill-only step
        gone: set[int] = set()
        for seq in list(self.running):
            if seq.id in gone:
                continue
            ok = True
            while not self.kv.allocate(seq, 1):
                victim = self._preempt(plan)
                gone.add(victim.id)
                if victim is seq:
                    ok = False
                    break
            if not ok:
                break
            plan.entries.append((seq, 1))
        if gone:
            plan.entries = [(s, n) for s, n in plan.entries if s.id not in gone]
        return plan

    def finished(self, seqs: list[Seq]) -> None:
        """These sequences produced their last token (or failed): free them."""
        if not seqs:
            return
        done = {s.id for s in seqs}
        for seq in seqs:
            self.kv.release(seq)
        self.running = [s for s in self.running if s.id not in done]


class SarathiScheduler(VllmScheduler):
    """Sarathi-Serve: decode-first, then prefill chunks, in a fixed token budget."""

    name = "sarathi"

    def __init__(self, *, num_blocks: int, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 512, enable_prefix_caching: bool = False) -> None:
        super().__init__(num_blocks=num_blocks, block_size=block_size,
                         max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens,
                         enable_chunked_prefill=True,
                         enable_prefix_caching=enable_prefix_caching)

    def _running_order(self) -> list[Seq]:
        decodes = [s for s in self.running if s.decoding]
        return decodes + [s for s in self.running if not s.decoding]


class ContinuousScheduler(_Queues):
    """Orca's iteration-level scheduling with KV reserved for prompt + output up front."""

    name = "continuous"

    def __init__(self, *, num_blocks: int, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192) -> None:
        self.capacity_tokens = num_blocks * block_size
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.reserved_tokens = 0
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []

    def __repr__(self) -> str:
        return (f"ContinuousScheduler(max_num_seqs={self.max_num_seqs}, "
                f"kv_tokens={self.capacity_tokens})")

    @property
    def limits(self) -> Limits:
        """The step limits."""
        return Limits(self.max_num_seqs, self.max_num_batched_tokens, self.num_blocks)

    def _need(self, seq: Seq) -> int:
        blocks = -(-(seq.prompt + seq.output) // self.block_size)
        return blocks * self.block_size

    def refuse(self, seq: Seq) -> str | None:
        """Why ``seq`` can never run here."""
        if self._need(seq) > self.capacity_tokens:
            return "kv_cache_too_small"
        if seq.prompt > self.max_num_batched_tokens:
            return "prompt_exceeds_max_num_batched_tokens"
        return None

    def kv_used_blocks(self) -> int:
        """KV blocks reserved."""
        return self.reserved_tokens // self.block_size

    def schedule(self, now_s: float) -> StepPlan:
        """Every running request computes what it needs; then admit while KV and seqs allow."""
        plan = StepPlan(entries=[(s, s.remaining) for s in self.running])
        budget = self.max_num_batched_tokens - sum(n for _, n in plan.entries)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            need = self._need(seq)
            if seq.prompt > budget or self.reserved_tokens + need > self.capacity_tokens:
                break
            self.waiting.popleft()
            self.reserved_tokens += need
            self.running.append(seq)
            plan.entries.append((seq, seq.remaining))
            budget -= seq.remaining
        return plan

    def finished(self, seqs: list[Seq]) -> None:
        """Release the reservations of finished sequences."""
        if not seqs:
            return
        done = {s.id for s in seqs}
        for seq in seqs:
            self.reserved_tokens -= self._need(seq)
        self.running = [s for s in self.running if s.id not in done]


class StaticScheduler:
    """Request-level batching of whole generations (see the module docstring)."""

    name = "static"

    def __init__(self, *, max_batch_size: int = 8, max_wait_ms: float = 0.0) -> None:
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1e3
        self.waiting: deque[Seq] = deque()
        self.batch: list[Seq] = []

    def __repr__(self) -> str:
        return (f"StaticScheduler(max_batch_size={self.max_batch_size}, "
                f"max_wait_ms={self.max_wait_s * 1e3:g})")

    @property
    def limits(self) -> Limits:
        """The step limits (no token budget: a batch's prompts prefill together)."""
        return Limits(self.max_batch_size, 2**62, None)

    def refuse(self, seq: Seq) -> str | None:
        """Static batching accepts every request."""
        return None

    def add(self, seq: Seq) -> None:
        """A new request joins the waiting queue."""
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Anything waiting or in the batch."""
        return bool(self.waiting or self.batch)

    def queued(self) -> int:
        """Requests waiting for a batch."""
        return len(self.waiting)

    def kv_used_blocks(self) -> int:
        """No paged cache."""
        return 0

    def schedule(self, now_s: float) -> StepPlan:
        """Decode the running batch, or start one when full or its oldest waited enough."""
        if self.batch:
            live = [s for s in self.batch if s.emitted < s.output]
            done = [s for s in self.batch if s.emitted >= s.output]
            return StepPlan(entries=[(s, s.remaining) for s in live], padding_seqs=len(done),
                            padding_kv_tokens=sum(s.computed for s in done))
        if not self.waiting:
            return StepPlan()
        due = self.waiting[0].arrival_s + self.max_wait_s
        if len(self.waiting) < self.max_batch_size and now_s < due:
            return StepPlan(wake_at_s=due)
        take = min(self.max_batch_size, len(self.waiting))
        self.batch = [self.waiting.popleft() for _ in range(take)]
        return StepPlan(entries=[(s, s.remaining) for s in self.batch])

    def finished(self, seqs: list[Seq]) -> None:
        """Sequences that ended early (a failed step) leave the batch; the batch ends when
        its longest output has ended.
        """
        gone = {s.id for s in seqs if s.emitted < s.output}
        if gone:
            self.batch = [s for s in self.batch if s.id not in gone]
        if self.batch and all(s.emitted >= s.output for s in self.batch):
            self.batch = []


LlmScheduler = VllmScheduler | SarathiScheduler | ContinuousScheduler | StaticScheduler

