"""Request queues (fifo, strict priority, EDF) and the read-only view policies see.

A queue stores request ids; request attributes live in the columnar :class:`RequestTable`.
Removal is lazy: the core changes a request's status first, the queue then forgets ids whose
status is no longer QUEUED when it next walks past them. ``length`` and ``items`` are kept
exact at all times.

Invariant: ``length`` equals the number of ids in the queue whose status is QUEUED.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from sim.errors import UserError
from sim.serving.records import RequestTable
from sim.serving.types import QUEUED, Request

DISCIPLINES = ("fifo", "priority", "edf")
NOT_HEAD, HEAD, HEAD_RUN = 0, 1, 2  # what RequestQueue.take_head found


class RequestQueue:
    """Base queue: exact counters plus a discipline-specific order of ids."""

    def __init__(self, table: RequestTable, index: int) -> None:
        self.table = table
        self.index = index
        self.length = 0
        self.items = 0
        self.routed = False  # per-replica queues: a request's replica column names its queue
        self.view = QueueViewImpl(self)

    def holds(self, request_id: int) -> bool:
        """Whether the request is waiting in this queue."""
        table = self.table
        return table.status[request_id] == QUEUED and (
            not self.routed or table.replica[request_id] == self.index)

    def push(self, request_id: int) -> None:
        """Enqueue a request (status must already be QUEUED)."""
        self._push(request_id)
        self.length += 1
        table = self.table
        self.items += 1 if table.unit_size else table.size[request_id]

    def extend(self, request_ids: range, items: int) -> None:
        """Enqueue a run of consecutive requests carrying ``items`` items in total."""
        for rid in request_ids:
            self._push(rid)
        self.length += len(request_ids)
        self.items += items

    def forget(self, request_id: int) -> None:
        """Account for a request that left (its status is already changed)."""
        self.length -= 1
        table = self.table
        self.items -= 1 if table.unit_size else table.size[request_id]

    def _push(self, request_id: int) -> None:
        raise NotImplementedError

    def take_head(self, request_ids: tuple[int, ...]) -> int:
        """Take a dispatched run off the head in one step where the discipline allows it
        (:meth:`FifoQueue.take_head`); :data:`NOT_HEAD`: the caller checks each id.
        """
        return NOT_HEAD

    def take_all(self) -> list[int]:
        """Remove every queued id and return them in service order (a replica that is
        removed hands its queue back; the requests stay QUEUED for their next queue).
        """
        ids = self.ids()
        self._clear()
        self.length = 0
        self.items = 0
        return ids

    def _clear(self) -> None:
        raise NotImplementedError

    def iter_ids(self) -> Iterator[int]:
        """Queued ids in service order."""
        raise NotImplementedError

    def ids(self, k: int | None = None) -> list[int]:
        """First ``k`` queued ids in service order."""
        limit = self.length if k is None else min(k, self.length)
        out: list[int] = []
        if limit <= 0:
            return out
        for rid in self.iter_ids():
            out.append(rid)
            if len(out) >= limit:
                break
        return out

    def oldest_arrival_s(self) -> float:
        """Earliest arrival among queued requests (a request held at the router: when it
        joined this queue).
        """
        table = self.table
        if table.joined_s:
            return min((table.queued_at_s(r) for r in self.iter_ids()), default=math.inf)
        arrival = table.arrival_s
        return min((arrival[r] for r in self.iter_ids()), default=math.inf)


class FifoQueue(RequestQueue):
    """First come, first served.

    Ids are kept in a list read from a head index: a batch taken from the head moves the
    index (:meth:`take_head`), ids that left from inside are skipped when the head reaches
    them, and the list is compacted once more than half of it lies behind the head.
    """

    def __init__(self, table: RequestTable, index: int) -> None:
        super().__init__(table, index)
        self._ids: list[int] = []
        self._head = 0

    def _push(self, request_id: int) -> None:
        self._ids.append(request_id)

    def _clear(self) -> None:
        self._ids = []
        self._head = 0

    def extend(self, request_ids: range, items: int) -> None:
        """Enqueue a run of consecutive requests (one list call)."""
        self._ids.extend(request_ids)
        self.length += len(request_ids)
        self.items += items

    def _skip(self) -> int:
        """Move the head past ids that already left; compact; return the head index."""
        ids, head, status = self._ids, self._head, self.table.status
        end = len(ids)
        while head < end and status[ids[head]] != QUEUED:
            head += 1
        if head > 1024 and 2 * head > end:
            del ids[:head]
            head = 0
        self._head = head
        return head

    def iter_ids(self) -> Iterator[int]:
        """Queued ids, oldest first."""
        head, status = self._skip(), self.table.status
        return (r for r in self._ids[head:] if status[r] == QUEUED)

    def ids(self, k: int | None = None) -> list[int]:
        """First ``k`` queued ids, oldest first (one slice when nothing left from inside)."""
        head, ids = self._head, self._ids
        if head >= len(ids) or self.table.status[ids[head]] != QUEUED:
            head = self._skip()
        limit = self.length if k is None else min(k, self.length)
        if len(self._ids) - head == self.length:  # no ids that left lie behind the head
            return self._ids[head:head + limit]
        return super().ids(k)

    def take_head(self, request_ids: tuple[int, ...]) -> int:
        """If ``request_ids`` are the first ids in the queue and nothing left from among
        them, move the head past them (their status must then be changed by the caller) and
        return :data:`HEAD_RUN` when they are consecutive ids, :data:`HEAD` otherwise;
        else change nothing and return :data:`NOT_HEAD`.
        """
        head, ids, n = self._head, self._ids, len(request_ids)
        stored = len(ids) - head
        if stored != self.length or n > stored or n == 0:
            return NOT_HEAD
        first = ids[head]
        if n == 1:
            if first != request_ids[0]:
                return NOT_HEAD
            self._advance(head + 1)
            return HEAD_RUN
        # a shared queue holds ids in increasing order: consecutive when first and last say so
        if not self.routed and ids[-1] - first == stored - 1:
            if request_ids != tuple(range(first, first + n)):
                return NOT_HEAD
            self._advance(head + n)
            return HEAD_RUN
        if tuple(ids[head:head + n]) != request_ids:
            return NOT_HEAD
        self._advance(head + n)
        return HEAD

    def _advance(self, head: int) -> None:
        """Move the head; drop the ids behind it once they are more than half the list."""
        if head > 1024 and 2 * head > len(self._ids):
            del self._ids[:head]
            head = 0
        self._head = head

    def oldest_arrival_s(self) -> float:
        """Arrival of the head (FIFO order is arrival order; a request held at the router
        joins in its arrival order too, see :mod:`sim.serving.admission`).
        """
        head = self._skip()
        if not self.length:
            return math.inf
        rid = self._ids[head]
        table = self.table
        return table.queued_at_s(rid) if table.joined_s else \
            table.arrival_s[rid]


class PriorityQueue(RequestQueue):
    """Strict priority levels (0 first), FIFO within a level."""

    def __init__(self, table: RequestTable, index: int) -> None:
        super().__init__(table, index)
        self._levels: dict[int, deque[int]] = {}

    def _push(self, request_id: int) -> None:
        level = self.table.priority[request_id]
        bucket = self._levels.get(level)
        if bucket is None:
            bucket = self._levels[level] = deque()
            self._levels = dict(sorted(self._levels.items()))
        bucket.append(request_id)

    def _clear(self) -> None:
        self._levels = {}

    def iter_ids(self) -> Iterator[int]:
        """Queued ids, highest priority first, FIFO within a level."""
        status = self.table.status
        for bucket in list(self._levels.values()):
            while bucket and status[bucket[0]] != QUEUED:
                bucket.popleft()
        return (r for bucket in self._levels.values() for r in bucket if status[r] == QUEUED)


class EdfQueue(RequestQueue):
    """Earliest deadline first (ties by arrival order); requests without deadline go last."""

    def __init__(self, table: RequestTable, index: int) -> None:
        super().__init__(table, index)
        self._heap: list[tuple[float, int]] = []

    def _push(self, request_id: int) -> None:
        heapq.heappush(self._heap, (self.table.deadline_s[request_id], request_id))

    def _clear(self) -> None:
        self._heap = []

    def iter_ids(self) -> Iterator[int]:
        """Queued ids by deadline."""
        status, heap = self.table.status, self._heap
        while heap and status[heap[0][1]] != QUEUED:
            heapq.heappop(heap)
        live = [entry for entry in heap if status[entry[1]] == QUEUED]
        if len(live) != len(heap):
            heapq.heapify(live)
            self._heap = live
        return (rid for _, rid in sorted(live))

    def ids(self, k: int | None = None) -> list[int]:
        """First ``k`` ids by deadline."""
        if k is None or k >= self.length:
            return list(self.iter_ids())
        self.iter_ids()  # purge
        return [rid for _, rid in heapq.nsmallest(k, self._heap)]


QUEUE_CLASSES: dict[str, type[RequestQueue]] = {
    "fifo": FifoQueue,
    "priority": PriorityQueue,
    "edf": EdfQueue,
}


def make_queue(discipline: str, table: RequestTable, index: int) -> RequestQueue:
    """Build a queue of the named discipline."""
    try:
        cls = QUEUE_CLASSES[discipline]
    except KeyError:
        raise UserError(f"queue.discipline: unknown {discipline!r}; allowed: "
                         f"{', '.join(DISCIPLINES)}") from None
    return cls(table, index)


class _Ids(Protocol):
    def __call__(self, k: int | None = None) -> list[int]: ...


class QueueViewImpl:
    """Read-only :class:`sim.serving.types.QueueView` over one queue."""

    __slots__ = ("_q", "ids", "oldest_arrival_s")

    def __init__(self, queue: RequestQueue) -> None:
        self._q = queue
        # the queue's own methods, bound (one call less on the simulator's hot path)
        self.ids: _Ids = queue.ids
        """First ``k`` ids in service order (all when None)."""
        self.oldest_arrival_s: Callable[[], float] = queue.oldest_arrival_s
        """Earliest arrival among the queued requests."""

    def __len__(self) -> int:
        return self._q.length

    @property
    def items(self) -> int:
        """Total items queued."""
        return self._q.items

    def contains(self, request_id: int) -> bool:
        """Whether the request is waiting in this queue."""
        return 0 <= request_id < self._q.table.n and self._q.holds(request_id)

    def arrival_s(self, request_id: int) -> float:
        """Arrival time of a request at this queue (a request held at the router: when it
        joined the queue, which is when a replica's batcher first sees it).
        """
        return self._q.table.queued_at_s(request_id)

    def size(self, request_id: int) -> int:
        """Items of a request."""
        return int(self._q.table.size[request_id])

    def deadline_s(self, request_id: int) -> float:
        """Absolute deadline of a request."""
        return float(self._q.table.deadline_s[request_id])

    def requests(self, k: int | None = None) -> list[Request]:
        """First ``k`` queued requests as objects."""
        t = self._q.table
        return [Request(id=r, arrival_s=t.queued_at_s(r) if t.joined_s else t.arrival_s[r],
                        size=t.size[r], priority=t.priority[r],
                        deadline_s=t.deadline_s[r],
                        klass=t.klass[r] if t.klass is not None else "")
                for r in self._q.ids(k)]

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests())
