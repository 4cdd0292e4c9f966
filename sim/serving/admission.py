"""Admission: arrivals join queues (routed at their own time), bounds reject, timeouts expire.

Arrivals are admitted lazily: before anything reads the queues, the core calls
:meth:`Admission.admit_until` and every arrival and expiry up to that time is applied in time
order with its own timestamp. A router sees the loads of the arrival's own time: the core
admits up to a batch's finish time *before* recording the finish, so a request that arrived
while every replica was busy is routed with that replica still busy, as it was then.

A bound on what a replica holds (``max_ongoing``, Ray Serve's ``max_ongoing_requests``: its
queue plus its running requests): an arrival whose candidate replicas are all full waits at
the router, in one FIFO (status QUEUED, replica -1), and so does every later arrival while
any waits. Whenever a replica may have room (a batch ended, a replica became ready, a
request left its queue: it timed out, or its policy dropped it), :meth:`Admission.release`
routes the waiting requests in order, each among the replicas with room, until none has; a
released request's time at its replica's queue is recorded in ``table.joined_s`` (what a
batcher sees as its arrival). That is the limit of a router that retries without delay.

With ``retry`` (:class:`sim.serving.router_tasks.RetryConfig`) the router retries as Ray
Serve's does instead: routing tasks, two per ready replica, each own one held request (the
oldest nobody routes) and try to place it (the router picks among all ready replicas; the
pick must have room); after a second failure in a row a task sleeps, 25 ms doubling to
0.5 s, and nothing wakes it early; having placed its request, it goes on with the next
(:mod:`sim.serving.router_tasks`). Requests then reach a replica in clumps, when a task
wakes to room that built up while it slept, and a replica's batcher sees those clumps.

Invariant: every queue's ``length`` equals its requests with status QUEUED; the rest of the
QUEUED requests wait at the router (:attr:`Admission.n_held`).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence

from sim.serving.queues import RequestQueue
from sim.serving.records import QueueSeries, RequestTable
from sim.serving.router_tasks import RetryConfig, RoutingTasks
from sim.serving.routing import ReplicaLoad, Router
from sim.serving.sources import ScheduleSource, Source, end_request
from sim.serving.types import QUEUED, REJECTED, TIMED_OUT

REASON_QUEUE_FULL = "queue_full"
REASON_TIMEOUT = "queue_timeout"
_NONE: frozenset[int] = frozenset()
_SHARED: frozenset[int] = frozenset({0})


class Admission:
    """Arrivals into queues: routing, the length bound and per-request timeouts.

    Args:
        table: Request records.
        source: Where arrivals come from.
        queues: The queues (one shared, or one per replica).
        router: Per-replica queues fed by this router; ``None`` = the one shared queue.
        queue_series: Where queue-length changes are recorded.
        loads: Per-replica loads at a time (what the router sees).
        max_len: Reject an arrival when its queue already holds this many (None: unbounded).
        timeout_s: Expire a request still waiting this long after arrival (None: never).
        candidates: The replicas a router may choose now (an autoscaled fleet's); None: all.
        max_ongoing: At most this many requests at a replica (queued + running); the rest
            wait at the router (None: no bound). Needs a router. ``max_len`` then bounds the
            requests waiting at the router (Ray's ``max_queued_requests``).
        running_of: Requests running on a replica (needed with ``max_ongoing``).
        retry: With ``max_ongoing``: retry held requests as Ray Serve's routing tasks do
            (None: release them the moment a replica has room).
        ready: The replicas running now (routing tasks route only to them); None: all.
    """

    def __init__(self, table: RequestTable, source: Source, queues: Sequence[RequestQueue],
                 router: Router | None, queue_series: QueueSeries,
                 loads: Callable[[float, Sequence[int] | None], list[ReplicaLoad]], *,
                 max_len: int | None = None, timeout_s: float | None = None,
                 candidates: Callable[[], list[int]] | None = None,
                 max_ongoing: int | None = None,
                 running_of: Callable[[int], int] | None = None,
                 retry: RetryConfig | None = None,
                 ready: Callable[[], list[int]] | None = None) -> None:
        if max_ongoing is not None and (router is None or running_of is None):
            raise ValueError("max_ongoing needs per-replica queues (a router) and running_of")
        if retry is not None and max_ongoing is None:
            raise ValueError("retry needs max_ongoing (the router holds requests only then)")
        self.table = table
        self.source = source
        self.queues = list(queues)
        self.router = router
        self.queue_series = queue_series
        self.loads = loads
        self.max_len = max_len
        self.timeout_s = timeout_s
        self.candidates = candidates
        self._expiry: deque[tuple[float, int]] = deque()
        self.max_ongoing = max_ongoing
        table.held_at_router = max_ongoing is not None
        self.running_of = running_of
        self._held: deque[int] = deque()  # waiting at the router, in arrival order
        # (with ``retry``: those no routing task owns yet)
        self.n_held = 0  # waiting at the router and still QUEUED (an expired one leaves
        # ``_held`` lazily); with ``retry`` the tasks' own requests included
        self.tasks = None if retry is None else RoutingTasks(retry)
        self.ready = ready
        # with ``retry``: every request waiting at the router, oldest first (the order
        # replicas found are given out in; left lazily), and those no task routes yet
        self._pending: deque[int] = deque()
        self._routable: set[int] = set()
        # open loop, one shared queue, no admission limits: runs of arrivals go in at once
        self._bulk = (router is None and max_len is None and timeout_s is None
                      and max_ongoing is None and isinstance(source, ScheduleSource))
        self.admit: Callable[[float], frozenset[int] | set[int]] = \
            self._admit_bulk if self._bulk else self._admit_each
        """:meth:`admit_until` without a call in between (the core's hot path)."""

    def admit_until(self, now_s: float) -> frozenset[int] | set[int]:
        """Apply every arrival and expiry up to ``now_s`` in time order.

        Returns:
            The queues that received requests.
        """
        return self.admit(now_s)

    def _admit_each(self, now_s: float) -> frozenset[int] | set[int]:
        touched: set[int] = set()
        source, timeout_s, tasks = self.source, self.timeout_s, self.tasks
        while True:
            arrival_s = source.peek_s()
            if tasks is not None:  # a routing task due before the next arrival tries first
                retry_s = tasks.next_due_s()
                if retry_s <= now_s and retry_s < arrival_s:
                    if timeout_s is not None and self._expiry:
                        self._expire_until(retry_s, touched)
                    due = tasks.pop_due(retry_s)
                    if due is not None:
                        self._run_task(due[1], due[0], touched)
                    continue
            if timeout_s is not None and self._expiry:
                self._expire_until(min(arrival_s, now_s), touched)
            if arrival_s > now_s:
                return touched
            self._admit(source.pop(), arrival_s, touched)

    def _admit_bulk(self, now_s: float) -> frozenset[int]:
        source = self.source
        assert isinstance(source, ScheduleSource)
        first = source.next_id
        arrival = self.table.arrival_s
        if first >= source.n or arrival[first] > now_s:
            return _NONE
        queue = self.queues[0]
        if first + 1 >= source.n or arrival[first + 1] > now_s:  # the common case: one arrival
            source.next_id = first + 1
            queue.push(first)
            self.queue_series.record(arrival[first], 0, queue.length)
            return _SHARED
        near = min(source.n, first + 64)  # arrivals since the last event are near the head
        last = bisect.bisect_right(arrival, now_s, first, near)
        if last == near:
            last = bisect.bisect_right(arrival, now_s, near, source.n)
        source.next_id = last
        before = queue.length
        queue.extend(range(first, last), last - first if self.table.unit_size
                     else sum(self.table.size[first:last]))
        self.queue_series.record_run(arrival[first:last], 0, before + 1)
        return _SHARED

    def _admit(self, rid: int, arrival_s: float, touched: set[int]) -> None:
        table = self.table
        if self.tasks is not None:  # held first; a routing task places it if it can
            self._hold(rid, arrival_s)
            self._start_tasks(arrival_s, touched)
            return
        if self.max_ongoing is not None:
            q_room = None if self.n_held else self._route_with_room(arrival_s, rid)
            if q_room is None:
                self._hold(rid, arrival_s)
                return
            q = q_room
        else:
            q = 0 if self.router is None else self.route(arrival_s, rid)
            if self.max_len is not None and self.queues[q].length >= self.max_len:
                if self.router is not None:
                    table.replica[rid] = q
                end_request(table, self.source, rid, REJECTED, arrival_s, REASON_QUEUE_FULL)
                return
        self.place(rid, q, arrival_s, touched)
        if self.timeout_s is not None:
            self._expiry.append((arrival_s + self.timeout_s, rid))

    # -- the bound on a replica's ongoing requests (queue.max_ongoing_requests) ----------------
    def _hold(self, rid: int, arrival_s: float) -> None:
        """Keep an arrival at the router (or reject it: the router's wait is full)."""
        if self.max_len is not None and self.n_held >= self.max_len:
            end_request(self.table, self.source, rid, REJECTED, arrival_s, REASON_QUEUE_FULL)
            return
        self._held.append(rid)
        self.n_held += 1
        if self.tasks is not None:
            self._pending.append(rid)
            self._routable.add(rid)
        if self.timeout_s is not None:
            self._expiry.append((arrival_s + self.timeout_s, rid))

    def place(self, rid: int, q: int, now_s: float, touched: set[int]) -> None:
        """Put a request into queue ``q`` now (with a router, it is replica ``q``'s), adding
        ``q`` to ``touched``; an arrival, a release from the router's wait, or a removed
        replica's request routed again (its timeout still runs from its arrival).
        """
        if self.router is not None:
            self.table.replica[rid] = q
        queue = self.queues[q]
        queue.push(rid)
        self.queue_series.record(now_s, q, queue.length)
        touched.add(q)

    def _route_with_room(self, now_s: float, rid: int) -> int | None:
        """The replica the router picks among those holding fewer than ``max_ongoing``
        requests (None: every candidate is full).
        """
        limit, running_of = self.max_ongoing, self.running_of
        assert self.router is not None
        assert running_of is not None
        assert limit is not None
        slots = self.candidates() if self.candidates is not None else None
        room: list[ReplicaLoad] = []
        room_of: list[int] = []  # the replica of each load in ``room``
        for load in self.loads(now_s, slots):
            replica = load.index if slots is None else slots[load.index]
            if load.queue_len + running_of(replica) < limit:
                if load.index != len(room):  # a router reads an index as a position in
                    # its list (jsq and least_work return the load's index): renumber
                    load = ReplicaLoad(len(room), load.queue_len, load.queued_items,
                                       load.running_batches, load.outstanding_work_s)
                room.append(load)
                room_of.append(replica)
        if not room:
            return None
        return room_of[self.router.route(now_s, rid, room)]

    def release(self, now_s: float) -> set[int]:
        """Route the requests waiting at the router, oldest first, while a replica has room.

        Returns:
            The queues that received requests.
        """
        touched: set[int] = set()
        if not self.n_held:
            return touched
        if self.tasks is not None:  # sleeping tasks are not woken; a change of the ready
            self._replicas_changed(now_s, touched)  # replicas starts tasks or wakes waiters
            return touched
        held, status = self._held, self.table.status
        while held:
            rid = held[0]
            if status[rid] != QUEUED:  # expired while it waited
                held.popleft()
                continue
            q = self._route_with_room(now_s, rid)
            if q is None:
                break
            held.popleft()
            self.n_held -= 1
            self.place(rid, q, now_s, touched)
            self.table.joined_s[rid] = now_s
        return touched

    def requeue(self, now_s: float, rid: int, touched: set[int]) -> int | None:
        """Route a request again (its replica left): to a replica with room, or back to the
        router's wait in arrival order (None). Without ``max_ongoing``: :meth:`route`. With
        ``retry`` it goes back to the wait, and routing tasks started for it place what they
        can now (into ``touched``).
        """
        if self.max_ongoing is None:
            return self.route(now_s, rid)
        q = None if self.n_held or self.tasks is not None else self._route_with_room(now_s,
                                                                                      rid)
        if q is None:
            self.table.replica[rid] = -1
            self._insert_by_arrival(self._held, rid)
            self.n_held += 1
            if self.tasks is not None:
                self._insert_by_arrival(self._pending, rid)
                self._routable.add(rid)
                self._start_tasks(now_s, touched)
        return q

    # -- routing tasks that retry with back-off (``retry``, Ray Serve's router) ----------------
    def next_retry_s(self) -> float:
        """When a routing task next tries (inf: none will): a sleeping task wakes, or the
        oldest request waiting at the router times out, which ends its task (if it has one)
        and starts a task that tries at once, so it may place a request then; the core
        must be called at that time, as at a task's due time.
        """
        if self.tasks is None:
            return math.inf
        due_s = self.tasks.next_due_s()
        if self.timeout_s is not None and self.n_held:  # the oldest held expires first
            expiry_s = float(self.table.arrival_s[self._oldest_pending()]) + self.timeout_s
            if expiry_s < due_s:
                return expiry_s
        return due_s

    def _n_ready(self) -> int:
        return len(self.queues) if self.ready is None else len(self.ready())

    def _start_tasks(self, now_s: float, touched: set[int]) -> None:
        """Start routing tasks while fewer run than the held requests and the cap, each
        trying at once (a request arrived, came back, left, or the replicas changed).
        """
        tasks = self.tasks
        assert tasks is not None
        cap = tasks.config.n_tasks(self._n_ready())
        while tasks.count < min(self.n_held, cap) and self._held:
            self._run_task(tasks.start(), now_s, touched)

    def _replicas_changed(self, now_s: float, touched: set[int]) -> None:
        """The ready replicas may have changed: tasks that waited for one try now, and more
        tasks may run.
        """
        tasks = self.tasks
        assert tasks is not None
        for task in tasks.wake_waiting():
            if tasks.running(task):  # it may have ended meanwhile
                self._run_task(task, now_s, touched)
        self._start_tasks(now_s, touched)

    def _next_unowned(self) -> int | None:
        """The oldest held request no task routes."""
        held, routable = self._held, self._routable
        while held:
            rid = held.popleft()
            if rid in routable:
                routable.discard(rid)
                return rid
        return None

    def _oldest_pending(self) -> int:
        """The oldest request waiting at the router (expired ones leave here)."""
        pending, status = self._pending, self.table.status
        while status[pending[0]] != QUEUED:
            pending.popleft()
        return pending[0]

    def _run_task(self, task: int, now_s: float, touched: set[int]) -> None:
        """Routing task ``task`` tries now, and goes on until it sleeps, waits for a
        replica, or ends (:mod:`sim.serving.router_tasks`): a replica it finds takes the
        oldest waiting request; its own placed, it takes the next with a fresh back-off.
        """
        tasks = self.tasks
        assert tasks is not None
        cancelled = False
        while True:
            rid = tasks.owned(task)
            if rid is None:
                if tasks.count > min(self.n_held, tasks.config.n_tasks(self._n_ready())):
                    tasks.end(task)
                    break
                rid = self._next_unowned()
                if rid is None:
                    tasks.end(task)
                    break
                tasks.own(task, rid)
            slots = self.ready() if self.ready is not None else None
            if slots is not None and not slots:
                tasks.wait_for_replicas(task)
                break
            oldest = self._oldest_pending()
            q = self._try_place(now_s, oldest, slots)
            if q is not None:
                self._pending.popleft()
                self._routable.discard(oldest)
                owner = tasks.task_of(oldest)
                if owner is not None and owner != task:  # its task is cancelled
                    tasks.end(owner)
                    cancelled = True
                self.n_held -= 1
                self.place(oldest, q, now_s, touched)
                self.table.joined_s[oldest] = now_s
                if oldest == rid:
                    tasks.done(task)
                    continue
            step_s = tasks.next_step_s(task)
            if step_s is not None:
                tasks.sleep_until(task, now_s + step_s)
                break
        if cancelled:  # new tasks take the cancelled ones' places
            self._start_tasks(now_s, touched)

    def _try_place(self, now_s: float, rid: int, slots: list[int] | None) -> int | None:
        """One attempt: the router picks among the running replicas; the pick if it has
        room, else None (with ``p2c`` the less loaded of two random replicas, as Ray's
        ``choose_replicas``: both are full then).
        """
        assert self.router is not None
        assert self.running_of is not None
        assert self.max_ongoing is not None
        loads = self.loads(now_s, slots)
        choice = self.router.route(now_s, rid, loads)
        replica = choice if slots is None else slots[choice]
        load = loads[choice]
        if load.queue_len + self.running_of(replica) < self.max_ongoing:
            return replica
        return None

    def _insert_by_arrival(self, wait: deque[int], rid: int) -> None:
        """Put ``rid`` back into a wait kept in arrival order (scanned from the back)."""
        arrival = self.table.arrival_s
        at = len(wait)
        while at and arrival[wait[at - 1]] > arrival[rid]:
            at -= 1
        wait.insert(at, rid)

    def route(self, now_s: float, rid: int) -> int:
        """The replica (queue) the router picks for a request now."""
        assert self.router is not None
        slots = self.candidates() if self.candidates is not None else None
        choice = self.router.route(now_s, rid, self.loads(now_s, slots))
        return choice if slots is None else slots[choice]

    def _expire_until(self, until_s: float, touched: set[int]) -> None:
        """Expire the requests whose timeout is up to ``until_s``; a request that leaves a
        replica's queue makes room there, so the router's wait moves at once (else it would
        wait for that replica's next batch to end, or forever if it has none running).
        """
        expiry, status = self._expiry, self.table.status
        while expiry and expiry[0][0] <= until_s:
            at_s, rid = expiry.popleft()
            if status[rid] != QUEUED:
                continue
            q = 0 if self.router is None else self.table.replica[rid]
            if q < 0:  # waiting at the router (it leaves the wait lazily, see release)
                end_request(self.table, self.source, rid, TIMED_OUT, at_s, REASON_TIMEOUT)
                self.n_held -= 1
                if self.tasks is not None:  # its routing task is cancelled; another starts
                    self._routable.discard(rid)
                    task = self.tasks.task_of(rid)
                    if task is not None:
                        self.tasks.end(task)
                    self._start_tasks(at_s, touched)
                continue
            queue = self.queues[q]
            end_request(self.table, self.source, rid, TIMED_OUT, at_s, REASON_TIMEOUT)
            queue.forget(rid)
            self.queue_series.record(at_s, q, queue.length)
            if self.n_held:
                touched |= self.release(at_s)
