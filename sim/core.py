"""The serving state machine shared by both drivers.

:class:`ServingCore` owns the queues, admission (bounded queues, per-request timeouts),
routing, the calls to the policies and the records. It has no clock: a driver (the SimPy
engine, or the live executor) tells it what time it is and when batches finish, and it
answers with batches to start and times to wake up. Both drivers therefore apply the very
same decision logic, and differ only in how time passes and how a batch runs.

Arrivals are admitted lazily: a driver calls :meth:`admit_until` before anything that reads
the queues, and every arrival and expiry up to that time is applied in time order, with its
own timestamp. A driver only has to wake up for an arrival while some replica is free.

Invariants (checked by :meth:`check_invariants`):
  * admitted = ok + rejected + timed_out + dropped + failed + queued + running;
  * every queue's ``length`` equals its requests with status QUEUED;
  * no batch holds more than its policy's ``max_batch_size`` requests (checked at dispatch).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.queues import RequestQueue, make_queue
from sim.records import BatchTable, QueueSeries, RequestTable
from sim.routing import ReplicaLoad, Router
from sim.types import (
    DROPPED,
    FAILED,
    OK,
    QUEUED,
    REJECTED,
    RUNNING,
    TIMED_OUT,
    Policy,
    ReplicaView,
)
from sim.workloads import ThinkSampler

REASON_QUEUE_FULL = "queue_full"
_NONE: set[int] = set()
_SHARED = {0}
REASON_TIMEOUT = "queue_timeout"


class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the contract (a bug in the policy)."""


class InvariantError(RuntimeError):
    """Requests were lost or double-counted (a bug in a driver or the core)."""


@dataclass(slots=True)
class Batch:
    """A dispatched batch.

    Attributes:
        id: Batch id (row in the batch table).
        replica: Replica that runs it.
        request_ids: Its requests, in dispatch order.
        items: Total items (what the service time depends on).
        start_s: Dispatch time.
        expected_s: The latency model's estimate of its service time.
    """

    id: int
    replica: int
    request_ids: tuple[int, ...]
    items: int
    start_s: float
    expected_s: float


class ScheduleSource:
    """Open-loop arrivals: walks the preloaded arrival schedule in the request table."""

    def __init__(self, table: RequestTable) -> None:
        self._arrival = table.arrival_s
        self.next_id = 0
        self.n = table.n

    @property
    def admitted(self) -> int:
        """Requests handed out so far."""
        return self.next_id

    def peek_s(self) -> float:
        """Time of the next arrival (inf when none is left)."""
        return self._arrival[self.next_id] if self.next_id < self.n else math.inf

    def pop(self) -> int:
        """Hand out the next arrival's id."""
        rid = self.next_id
        self.next_id += 1
        return rid

    def on_done(self, request_id: int, time_s: float) -> None:
        """Open loop: answers do not create arrivals."""

    def close(self) -> None:
        """No further arrivals (a stopped live run)."""
        self.n = self.next_id


class ClientSource:
    """Closed-loop arrivals: each client sends again one think time after its answer."""

    def __init__(self, table: RequestTable, clients: int, think: ThinkSampler, size: int,
                 duration_s: float, n_requests: int | None, slo_s: float | None) -> None:
        self.table = table
        self.think = think
        self.size = size
        self.duration_s = duration_s
        self.n_requests = n_requests
        self.slo_s = slo_s
        self._heap: list[tuple[float, int]] = []
        self._sent = 0
        for client in range(clients):
            self._arm(client, 0.0)

    @property
    def admitted(self) -> int:
        """Requests sent so far."""
        return self.table.n

    def _arm(self, client: int, after_s: float) -> None:
        at_s = after_s + self.think()
        if at_s >= self.duration_s:
            return
        if self.n_requests is not None and self._sent >= self.n_requests:
            return
        self._sent += 1
        heapq.heappush(self._heap, (at_s, client))

    def peek_s(self) -> float:
        """Time of the next send (inf when no client will send again)."""
        return self._heap[0][0] if self._heap else math.inf

    def pop(self) -> int:
        """Register the next send as a request and return its id."""
        at_s, client = heapq.heappop(self._heap)
        deadline = at_s + self.slo_s if self.slo_s is not None else math.inf
        return self.table.append(at_s, self.size, 0, deadline, client)

    def on_done(self, request_id: int, time_s: float) -> None:
        """The client got its answer (or error): think, then send again."""
        self._arm(self.table.client[request_id], time_s)

    def close(self) -> None:
        """No further sends (a stopped live run)."""
        self._heap.clear()
        self.duration_s = -math.inf


Source = ScheduleSource | ClientSource


class ServingCore:
    """Queues, admission, routing, policy calls and records, without a clock.

    Args:
        table: Request records (preloaded schedule for open loop).
        source: Where arrivals come from.
        policies: One policy object per replica.
        router: Per-replica queues fed by this router; ``None`` = one shared queue.
        discipline: Queue discipline (fifo, priority, edf).
        max_len: Reject an arrival when its queue already holds this many (None: unbounded).
        timeout_s: Expire a request still waiting this long after arrival (None: never).
        estimate_s: Latency model, seconds for a batch of ``items`` items (for routing by
            work and for batch expectations).
    """

    def __init__(self, table: RequestTable, source: Source, policies: Sequence[Policy], *,
                 router: Router | None = None, discipline: str = "fifo",
                 max_len: int | None = None, timeout_s: float | None = None,
                 estimate_s: Callable[[int], float] = lambda items: 0.0) -> None:
        self.table = table
        self.source = source
        self.policies = list(policies)
        self.n_replicas = len(self.policies)
        self.router = router
        self.max_len = max_len
        self.timeout_s = timeout_s
        self.estimate_s = estimate_s
        n_queues = 1 if router is None else self.n_replicas
        self.queues: list[RequestQueue] = [make_queue(discipline, table, q)
                                           for q in range(n_queues)]
        self.queue_of = [0 if router is None else r for r in range(self.n_replicas)]
        self.replicas_of = [[r for r in range(self.n_replicas) if self.queue_of[r] == q]
                            for q in range(n_queues)]
        self.running = [0] * self.n_replicas
        self._max_running = [p.max_concurrent_batches for p in self.policies]
        self._free_replicas = self.n_replicas  # replicas with running < max (kept exact)
        self._closed = isinstance(source, ClientSource)
        self._bulk = router is None and max_len is None and timeout_s is None and not self._closed
        if self._bulk:
            sizes = np.frombuffer(table.size, dtype=np.int64)
            self._cum_items = np.concatenate(([0], np.cumsum(sizes)))
        self.running_batches: list[dict[int, Batch]] = [{} for _ in range(self.n_replicas)]
        self.batches = BatchTable()
        self.queue_series = QueueSeries()
        self._expiry: deque[tuple[float, int]] = deque()
        self._idle_views = [ReplicaView(r, 0, p.max_concurrent_batches)
                            for r, p in enumerate(self.policies)]
        self._needs_work = bool(getattr(router, "needs_work_estimate", False))
        self._max_batch = max(p.max_batch_size for p in self.policies)
        for q in range(n_queues):
            self.queue_series.record(0.0, q, 0)

    # -- state queries -----------------------------------------------------------------------
    def free(self, replica: int) -> bool:
        """Whether the replica may start another batch."""
        return self.running[replica] < self._max_running[replica]

    def any_free(self) -> bool:
        """Whether some replica may start a batch."""
        return self._free_replicas > 0

    def free_replicas_of(self, queues: set[int], skip: int = -1) -> list[int]:
        """Free replicas that serve any of ``queues`` (to consult after arrivals joined them),
        in index order, leaving out ``skip``.
        """
        return [r for q in sorted(queues) for r in self.replicas_of[q]
                if r != skip and self.free(r)]

    def next_arrival_s(self) -> float:
        """Time of the next arrival not yet admitted (inf when none)."""
        return self.source.peek_s()

    def loads(self, now_s: float) -> list[ReplicaLoad]:
        """Per-replica load at ``now_s`` (what routers see)."""
        out = []
        for r in range(self.n_replicas):
            queue = self.queues[self.queue_of[r]]
            work = self._work_s(r, queue, now_s) if self._needs_work else 0.0
            out.append(ReplicaLoad(r, queue.length, queue.items, self.running[r], work))
        return out

    def _work_s(self, replica: int, queue: RequestQueue, now_s: float) -> float:
        remaining = sum(max(0.0, b.expected_s - (now_s - b.start_s))
                        for b in self.running_batches[replica].values())
        full, rest = divmod(queue.items, self._max_batch)
        queued = full * self.estimate_s(self._max_batch) + (self.estimate_s(rest) if rest else 0)
        return remaining + queued

    # -- admission ---------------------------------------------------------------------------
    def admit_until(self, now_s: float) -> set[int]:
        """Apply every arrival and expiry up to ``now_s`` in time order.

        Returns:
            The queues that received requests.
        """
        touched: set[int] = set()
        source, timeout_s = self.source, self.timeout_s
        if self._bulk:
            return self._admit_bulk(now_s)
        while True:
            arrival_s = source.peek_s()
            if timeout_s is not None and self._expiry:
                self._expire_until(min(arrival_s, now_s))
            if arrival_s > now_s:
                return touched
            self._admit(source.pop(), arrival_s, touched)

    def _admit_bulk(self, now_s: float) -> set[int]:
        """Open loop, one shared queue, no admission limits: admit a run of arrivals at once
        (same records as one by one).
        """
        source = self.source
        assert isinstance(source, ScheduleSource)
        first = source.next_id
        if first >= source.n or self.table.arrival_s[first] > now_s:
            return _NONE
        queue = self.queues[0]
        arrival = self.table.arrival_s
        if first + 1 >= source.n or arrival[first + 1] > now_s:  # the common case: one arrival
            source.next_id = first + 1
            queue.push(first)
            self.queue_series.record(arrival[first], 0, queue.length)
            return _SHARED
        last = bisect.bisect_right(arrival, now_s, first, source.n)
        source.next_id = last
        before = queue.length
        queue.extend(range(first, last), int(self._cum_items[last] - self._cum_items[first]))
        self.queue_series.record_run(arrival[first:last], 0, before + 1)
        return _SHARED

    def _admit(self, rid: int, arrival_s: float, touched: set[int]) -> None:
        table = self.table
        if self.router is None:
            q = 0
        else:
            q = self.router.route(arrival_s, rid, self.loads(arrival_s))
            table.replica[rid] = q
        queue = self.queues[q]
        if self.max_len is not None and queue.length >= self.max_len:
            self._terminate(rid, REJECTED, arrival_s, REASON_QUEUE_FULL)
            return
        queue.push(rid)
        self.queue_series.record(arrival_s, q, queue.length)
        touched.add(q)
        if self.timeout_s is not None:
            self._expiry.append((arrival_s + self.timeout_s, rid))

    def _expire_until(self, until_s: float) -> None:
        expiry, status = self._expiry, self.table.status
        while expiry and expiry[0][0] <= until_s:
            at_s, rid = expiry.popleft()
            if status[rid] != QUEUED:
                continue
            q = 0 if self.router is None else self.table.replica[rid]
            queue = self.queues[q]
            self._terminate(rid, TIMED_OUT, at_s, REASON_TIMEOUT)
            queue.forget(rid)
            self.queue_series.record(at_s, q, queue.length)

    def _terminate(self, rid: int, status: int, time_s: float, reason: str) -> None:
        table = self.table
        table.status[rid] = status
        table.finish_s[rid] = time_s
        if reason:
            table.reasons[rid] = reason
        self.source.on_done(rid, time_s)

    # -- decisions ---------------------------------------------------------------------------
    def decide(self, replica: int, now_s: float) -> tuple[Batch | None, float | None]:
        """Ask the replica's policy what to do; apply drops and the dispatch.

        Returns:
            The batch to start now (or None) and the time to ask again (or None).
        """
        q = self.queue_of[replica]
        queue = self.queues[q]
        if queue.length == 0:
            return None, None
        policy = self.policies[replica]
        view = (self._idle_views[replica] if self.running[replica] == 0 else
                ReplicaView(replica, self.running[replica], policy.max_concurrent_batches))
        decision = policy.decide(now_s, queue.view, view)
        if decision.drop:
            self._apply_drops(policy, queue, decision.drop, now_s)
        batch = self._dispatch(replica, policy, queue, decision.dispatch, now_s) \
            if decision.dispatch else None
        wake_s = decision.wake_at_s
        if batch is None and wake_s is not None and wake_s <= now_s:
            raise PolicyError(f"{policy!r} asked to wake at {wake_s} s, not after now "
                              f"({now_s} s), without dispatching")
        return batch, wake_s

    def _check_queued(self, policy: Policy, queue: RequestQueue, rid: int) -> None:
        table = self.table
        if not 0 <= rid < table.n or table.status[rid] != QUEUED or (
                self.router is not None and table.replica[rid] != queue.index):
            raise PolicyError(f"{policy!r} chose request {rid}, which is not waiting in "
                              f"queue {queue.index}")

    def _apply_drops(self, policy: Policy, queue: RequestQueue,
                     drops: Sequence[tuple[int, str]], now_s: float) -> None:
        for rid, reason in drops:
            self._check_queued(policy, queue, rid)
            self._terminate(rid, DROPPED, now_s, reason or "dropped_by_policy")
            queue.forget(rid)
        self.queue_series.record(now_s, queue.index, queue.length)

    def _dispatch(self, replica: int, policy: Policy, queue: RequestQueue,
                  ids: tuple[int, ...], now_s: float) -> Batch:
        n = len(ids)
        if n > policy.max_batch_size:
            raise PolicyError(f"{policy!r} dispatched {n} requests, above its "
                              f"max_batch_size {policy.max_batch_size}")
        table = self.table
        status, size, start, batch_id, where = (table.status, table.size, table.start_s,
                                                table.batch_id, table.replica)
        routed = self.router is not None
        bid = len(self.batches.start_s)
        items = 0
        for rid in ids:
            if status[rid] != QUEUED or (routed and where[rid] != queue.index):
                self._check_queued(policy, queue, rid)
                raise PolicyError(f"{policy!r} dispatched request {rid} twice in {ids}")
            status[rid] = RUNNING
            items += size[rid]
            start[rid] = now_s
            batch_id[rid] = bid
            where[rid] = replica
        self.batches.open(replica, now_s, n, items)
        queue.length -= n
        queue.items -= items
        self.queue_series.record(now_s, queue.index, queue.length)
        running = self.running[replica] + 1
        self.running[replica] = running
        if running == self._max_running[replica]:
            self._free_replicas -= 1
        batch = Batch(bid, replica, ids, items, now_s,
                      self.estimate_s(items) if self._needs_work else 0.0)
        self.running_batches[replica][bid] = batch
        return batch

    def finish(self, batch: Batch, now_s: float, service_s: float,
               error: str | None = None) -> None:
        """Record a finished batch (``error``: it failed, with this reason) and free its slot.

        Requests already failed while it ran (see :meth:`fail_running`) keep their outcome.
        """
        table = self.table
        status, finish = table.status, table.finish_s
        outcome = OK if error is None else FAILED
        ended = []
        for rid in batch.request_ids:
            if status[rid] == RUNNING:
                status[rid] = outcome
                finish[rid] = now_s
                ended.append(rid)
        if error is not None:
            for rid in ended:
                table.reasons[rid] = error
        if self._closed:
            for rid in ended:
                self.source.on_done(rid, now_s)
        self.batches.close(batch.id, now_s, error is not None)
        replica = batch.replica
        if self.running[replica] == self._max_running[replica]:
            self._free_replicas += 1
        self.running[replica] -= 1
        del self.running_batches[replica][batch.id]
        self.policies[replica].on_batch_done(now_s, len(batch.request_ids), service_s)

    def fail_running(self, batch: Batch, time_s: float, reason: str) -> None:
        """Fail a running batch's requests now (e.g. a batch timeout); the replica stays busy
        until :meth:`finish` is called for the batch.
        """
        status = self.table.status
        for rid in batch.request_ids:
            if status[rid] == RUNNING:
                self._terminate(rid, FAILED, time_s, reason)

    # -- invariants --------------------------------------------------------------------------
    def check_invariants(self) -> dict[str, int]:
        """Check request conservation; return the status counts.

        Raises:
            InvariantError: a request was lost or counted twice.
        """
        admitted = self.source.admitted
        counts = self.table.status_counts(admitted)
        queued = sum(q.length for q in self.queues)
        status = self.table.status
        running = sum(1 for rb in self.running_batches for b in rb.values()
                      for rid in b.request_ids if status[rid] == RUNNING)
        if counts["in_flight"] != queued + running:
            raise InvariantError(f"in-flight requests {counts['in_flight']} != queued {queued} "
                                 f"+ running {running}")
        if sum(counts.values()) != admitted:
            raise InvariantError(f"status counts {counts} do not add up to {admitted} arrivals")
        for q in self.queues:
            live = sum(1 for _ in q.iter_ids())
            if live != q.length:
                raise InvariantError(f"queue {q.index} holds {live} requests but counts "
                                     f"{q.length}")
        return counts
