"""Dispatch and completion: the policy calls, batches started on replicas and finished.

The :class:`Dispatcher` knows what runs where. It asks a free replica's policy what to do,
checks the decision against the contract (only queued requests, none twice, no batch above
``max_batch_size``; a :class:`PolicyError` otherwise), applies drops, starts the batch and
records its end. It has no clock: times come from the caller.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.errors import PolicyError
from sim.serving.queues import HEAD_RUN, NOT_HEAD, RequestQueue
from sim.serving.records import (
    BATCH_ID,
    REPLICA,
    BatchTable,
    Discarded,
    QueueSeries,
    RequestTable,
    constant,
)
from sim.serving.routing import ReplicaLoad
from sim.serving.sources import ClientSource, Source, end_request
from sim.serving.types import DROPPED, FAILED, OK, QUEUED, RUNNING, Policy, ReplicaView

__all__ = ["Batch", "Dispatcher", "PolicyError"]


@dataclass
class Batch:
    """A dispatched batch.

    Attributes:
        id: Batch id (row in the batch table).
        replica: Replica that runs it.
        request_ids: Its requests, in dispatch order.
        items: Total items (what the service time depends on).
        start_s: Dispatch time.
        expected_s: The latency model's estimate of its service time (routers by work).
        idle_s: How long the replica had been idle before this batch (0 when it was busy):
            a profile with cold samples draws from them after a long enough idle.
        run: Its ids are consecutive (``request_ids[0] + i``): their records are read and
            written as slices.
    """

    id: int
    replica: int
    request_ids: tuple[int, ...]
    items: int
    start_s: float
    expected_s: float
    idle_s: float = 0.0
    run: bool = False


class Dispatcher:
    """Replicas, their policies and their running batches.

    Args:
        table: Request records.
        source: Where arrivals come from (told when a request ends).
        policies: One policy object per replica.
        queues: The queues; replica ``r`` pulls from ``queues[queue_of[r]]``.
        queue_of: Queue index per replica.
        queue_series: Where queue-length changes are recorded.
        estimate_s: Latency model, seconds for a batch of ``items`` items.
        needs_work: Keep work estimates (a router that routes by outstanding work).
    """

    def __init__(self, table: RequestTable, source: Source, policies: Sequence[Policy],
                 queues: Sequence[RequestQueue], queue_of: Sequence[int],
                 queue_series: QueueSeries, estimate_s: Callable[[int], float], *,
                 needs_work: bool = False) -> None:
        self.table = table
        self.source = source
        self.policies = list(policies)
        self.n_replicas = len(self.policies)
        self.queues = list(queues)
        self.queue_of = list(queue_of)
        self.queue_series = queue_series
        self.estimate_s = estimate_s
        self.needs_work = needs_work
        self._closed = isinstance(source, ClientSource)  # only clients hear of answers
        self.running = [0] * self.n_replicas
        self.max_running = [p.max_concurrent_batches for p in self.policies]
        self.free_replicas = self.n_replicas  # replicas with running < max (kept exact)
        self.n_dropped = 0  # requests policies dropped from queues (room at their replica)
        self.running_batches: list[dict[int, Batch]] = [{} for _ in range(self.n_replicas)]
        self.idle_since_s = [0.0] * self.n_replicas
        self.batches = BatchTable()
        self._idle_views = [ReplicaView(r, 0, p.max_concurrent_batches)
                            for r, p in enumerate(self.policies)]
        self._max_batch = max(p.max_batch_size for p in self.policies)
        self._full = table.records == "full"  # else starts, finishes and batch ids are not kept
        self._where = not isinstance(table.replica, Discarded)  # the serving replica is kept

    # -- state ------------------------------------------------------------------------------
    def free(self, replica: int) -> bool:
        """Whether the replica may start another batch."""
        return self.running[replica] < self.max_running[replica]

    def loads(self, now_s: float, replicas: Sequence[int] | None = None) -> list[ReplicaLoad]:
        """Per-replica load at ``now_s`` (what routers see): of every replica, or of
        ``replicas`` only, indexed by their position in it (an autoscaled fleet shows a
        router only the replicas that can take work).
        """
        out = []
        for i, r in enumerate(range(self.n_replicas) if replicas is None else replicas):
            queue = self.queues[self.queue_of[r]]
            work = self.work_s(r, queue, now_s) if self.needs_work else 0.0
            out.append(ReplicaLoad(i, queue.length, queue.items, self.running[r], work))
        return out

    def set_active(self, replica: int, active: bool, now_s: float) -> None:
        """Let a replica take batches again (its policy's concurrency) or stop it taking
        new ones (what runs still finishes); an autoscaled fleet's replicas come and go.
        """
        was_free = self.free(replica)
        self.max_running[replica] = self.policies[replica].max_concurrent_batches \
            if active else 0
        self.free_replicas += int(self.free(replica)) - int(was_free)
        if active and self.running[replica] == 0:
            self.idle_since_s[replica] = now_s

    def work_s(self, replica: int, queue: RequestQueue, now_s: float) -> float:
        """Estimated seconds of work left on ``replica``: what its running batches still need
        plus its queue cut into batches of ``max_batch_size`` *requests*, each carrying the
        queue's mean items per request.
        """
        remaining = sum(max(0.0, b.expected_s - (now_s - b.start_s))
                        for b in self.running_batches[replica].values())
        if queue.length == 0:
            return remaining
        per_request = queue.items / queue.length
        full, rest = divmod(queue.length, self._max_batch)
        queued = full * self.estimate_s(max(1, round(self._max_batch * per_request)))
        if rest:
            queued += self.estimate_s(max(1, round(rest * per_request)))
        return remaining + queued

    # -- decisions ---------------------------------------------------------------------------
    def decide(self, replica: int, now_s: float) -> tuple[Batch | None, float | None]:
        """Ask the replica's policy what to do; apply drops and the dispatch.

        Returns:
            The batch to start now (or None) and the time to ask again (or None).
        """
        queue = self.queues[self.queue_of[replica]]
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
        if not 0 <= rid < table.n or not queue.holds(rid):
            raise PolicyError(f"{policy!r} chose request {rid}, which is not waiting in "
                              f"queue {queue.index}")

    def _apply_drops(self, policy: Policy, queue: RequestQueue,
                     drops: Sequence[tuple[int, str]], now_s: float) -> None:
        for rid, reason in drops:
            self._check_queued(policy, queue, rid)
            end_request(self.table, self.source, rid, DROPPED, now_s,
                        reason or "dropped_by_policy")
            queue.forget(rid)
        self.n_dropped += len(drops)
        self.queue_series.record(now_s, queue.index, queue.length)

    def _dispatch(self, replica: int, policy: Policy, queue: RequestQueue,
                  ids: tuple[int, ...], now_s: float) -> Batch:
        n = len(ids)
        if n > policy.max_batch_size:
            raise PolicyError(f"{policy!r} dispatched {n} requests, above its "
                              f"max_batch_size {policy.max_batch_size}")
        table = self.table
        bid = self.batches.next_id
        head = queue.take_head(ids)  # the queue's first n ids, all waiting: no check per id
        run = head == HEAD_RUN and n > 1
        if run:
            first = ids[0]
            end = first + n
            items = n if table.unit_size else sum(table.size[first:end])
            table.status[first:end] = constant("b", RUNNING, n)
            if self._full:
                table.start_s[first:end] = array("d", (now_s,)) * n
                table.batch_id[first:end] = array(BATCH_ID, (bid,)) * n
            if self._where:
                table.replica[first:end] = array(REPLICA, (replica,)) * n
        elif head != NOT_HEAD:
            items = self._mark_running(ids, replica, bid, now_s)
        else:
            items = self._mark_running_checked(policy, queue, ids, replica, bid, now_s)
        self.batches.open(replica, now_s, n, items)
        queue.length -= n
        queue.items -= items
        self.queue_series.record(now_s, queue.index, queue.length)
        was = self.running[replica]
        self.running[replica] = was + 1
        if was + 1 == self.max_running[replica]:
            self.free_replicas -= 1
        batch = Batch(bid, replica, ids, items, now_s,
                      self.estimate_s(items) if self.needs_work else 0.0,
                      now_s - self.idle_since_s[replica] if was == 0 else 0.0, run)
        self.running_batches[replica][bid] = batch
        return batch

    def _mark_running(self, ids: tuple[int, ...], replica: int, bid: int,
                      now_s: float) -> int:
        """Mark requests known to be waiting as running in batch ``bid``; return the items."""
        table = self.table
        status, size, start, batch_id, where = (table.status, table.size, table.start_s,
                                                table.batch_id, table.replica)
        items = 0
        if self._full:
            for rid in ids:
                status[rid] = RUNNING
                items += size[rid]
                start[rid] = now_s
                batch_id[rid] = bid
                where[rid] = replica
            return items
        for rid in ids:  # a summary-only run: the batch knows its start
            status[rid] = RUNNING
            if self._where:
                where[rid] = replica
        return len(ids) if table.unit_size else sum(size[rid] for rid in ids)

    def _mark_running_checked(self, policy: Policy, queue: RequestQueue,
                              ids: tuple[int, ...], replica: int, bid: int,
                              now_s: float) -> int:
        """:meth:`_mark_running`, checking first that each id waits in ``queue`` once."""
        table = self.table
        status, where, n_rows = table.status, table.replica, table.n
        routed = queue.routed
        seen: set[int] = set()
        for rid in ids:
            if not 0 <= rid < n_rows or status[rid] != QUEUED or (
                    routed and where[rid] != queue.index):
                self._check_queued(policy, queue, rid)
            if rid in seen:
                raise PolicyError(f"{policy!r} dispatched request {rid} twice in {ids}")
            seen.add(rid)
        return self._mark_running(ids, replica, bid, now_s)

    # -- completion --------------------------------------------------------------------------
    def finish(self, batch: Batch, now_s: float, service_s: float,
               error: str | None = None, *, abandoned: bool = False) -> None:
        """Record a finished batch (``error``: it failed, with this reason) and free its slot.

        Requests already failed while it ran (see :meth:`fail_running`) keep their outcome.
        ``abandoned``: the batch did not end; its replica was killed at ``now_s`` (the
        policy is not told of a service time, which this is not).
        """
        table = self.table
        status, finish = table.status, table.finish_s
        outcome = OK if error is None else FAILED
        ids = batch.request_ids
        n = len(ids)
        ended: Sequence[int]
        sink = table.sink
        if batch.run and status[ids[0]:ids[0] + n] == constant("b", RUNNING, n):
            first = ids[0]
            status[first:first + n] = constant("b", outcome, n)
            ended = ids
            if sink is None:
                finish[first:first + n] = array("d", (now_s,)) * n
            else:
                sink.ended_run(first, n, batch.start_s, now_s, outcome)
        elif sink is None:
            ended = []
            for rid in ids:
                if status[rid] == RUNNING:
                    status[rid] = outcome
                    finish[rid] = now_s
                    ended.append(rid)
        else:
            ended = [rid for rid in ids if status[rid] == RUNNING]
            for rid in ended:
                status[rid] = outcome
            if ended:
                sink.ended(ended, batch.start_s, now_s, outcome)
        if error is not None:
            for rid in ended:
                table.reasons[rid] = error
        if self._closed:
            for rid in ended:
                self.source.on_done(rid, now_s)
        self.batches.close(batch.id, now_s, error is not None)
        replica = batch.replica
        running, limit = self.running, self.max_running[replica]
        left = running[replica] - 1
        running[replica] = left
        if left + 1 == limit:  # it was full, it is free now
            self.free_replicas += 1
        if left == 0:
            self.idle_since_s[replica] = now_s
        del self.running_batches[replica][batch.id]
        if not abandoned:
            self.policies[replica].on_batch_done(now_s, n, service_s)

    def fail_running(self, batch: Batch, time_s: float, reason: str) -> None:
        """Fail a running batch's requests now (e.g. a batch timeout) and mark the batch
        failed; the replica stays busy until :meth:`finish` is called for the batch (which
        records when the call returned).
        """
        status = self.table.status
        for rid in batch.request_ids:
            if status[rid] == RUNNING:
                end_request(self.table, self.source, rid, FAILED, time_s, reason)
        self.batches.mark_failed(batch.id)  # its row agrees with its requests at once

    def running_requests_of(self, replica: int) -> int:
        """Requests in ``replica``'s running batches that have not ended yet."""
        status = self.table.status
        return sum(1 for b in self.running_batches[replica].values()
                   for rid in b.request_ids if status[rid] == RUNNING)

    def running_requests(self) -> int:
        """Requests in running batches that have not ended yet."""
        return sum(self.running_requests_of(r) for r in range(self.n_replicas))

