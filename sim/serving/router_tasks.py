"""The routing tasks of a router that holds requests: which held request each task routes,
where it is in its back-off, and when it next tries (Ray Serve's retry with back-off).

Read from Ray Serve 2.60's ``_private/request_router/request_router.py`` and
``pow_2_router.py``:

- a router runs at most ``min(50, 2 × running replicas)`` routing tasks
  (``max_num_routing_tasks``); a request that arrives starts one if fewer run than
  ``min(pending requests, that cap)`` (``_maybe_start_routing_tasks``), and so do a change of
  the replica set (``update_replicas``) and a task that ends;
- a task takes the oldest pending request no task routes
  (``_get_next_pending_request_to_route``) and tries: two replicas at random, the less
  loaded if it has room (``choose_replicas``, ``_select_from_candidate_replicas``). A
  replica found goes to the **oldest** pending request, whichever task routes it
  (``FIFOMixin._fulfill_next_pending_request``); that request's own task is cancelled, and
  a new one starts in its place;
- each try of a task for its request is a step of one back-off
  (``_choose_replicas_with_backoff``): the first step after the first try is free, each
  later one sleeps
  ``min(0.025 × 2^k, 0.5)`` s, k = 0, 1, … (``RAY_SERVE_ROUTER_RETRY_*``), whether the try
  failed or found a replica for an older request; nothing wakes a sleeping task early;
- when its own request is placed, the task goes on with the next, its back-off afresh, while
  no more tasks run than ``min(pending requests, cap)`` (``_fulfill_pending_requests``);
  otherwise it ends;
- with no replica running, a task waits for the replica set to change (no back-off).

This module keeps only the tasks' bookkeeping; :class:`sim.serving.admission.Admission`
decides what a try does. No clock, no simpy, no torch.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """A router's retry settings (Ray Serve 2.60's defaults).

    Attributes:
        initial_backoff_s: The first sleep (after the second failure in a row).
        backoff_multiplier: Each further sleep is this much longer ...
        max_backoff_s: ... up to this.
        tasks_per_replica: Routing tasks per running replica ...
        max_tasks: ... and at most this many.
    """

    initial_backoff_s: float = 0.025
    backoff_multiplier: float = 2.0
    max_backoff_s: float = 0.5
    tasks_per_replica: int = 2
    max_tasks: int = 50

    def backoff_s(self, sleeps: int) -> float:
        """The sleep before the attempt after ``sleeps`` earlier sleeps for one request."""
        if self.backoff_multiplier <= 1.0:
            return min(self.initial_backoff_s, self.max_backoff_s)
        # past this many sleeps the cap holds (and the power would overflow)
        if sleeps > math.log(max(self.max_backoff_s / self.initial_backoff_s, 1.0),
                             self.backoff_multiplier) + 1:
            return self.max_backoff_s
        return min(self.initial_backoff_s * self.backoff_multiplier ** sleeps,
                   self.max_backoff_s)

    def n_tasks(self, running_replicas: int) -> int:
        """The most routing tasks with this many replicas running."""
        return min(self.max_tasks, self.tasks_per_replica * running_replicas)


class RoutingTasks:
    """The routing tasks: each routes one held request (or none, between requests), keeps
    its place in that request's back-off, and sleeps until a due time or waits for the
    replica set to change.
    """

    def __init__(self, config: RetryConfig) -> None:
        self.config = config
        self._owned: dict[int, int | None] = {}  # task -> the request it routes
        self._sleeps: dict[int, int] = {}  # task -> sleeps taken for that request
        self._entered: dict[int, bool] = {}  # task -> its free step is used
        self._due: dict[int, float] = {}  # task -> when it tries next (sleeping tasks)
        self._waiting: set[int] = set()  # tasks waiting for a replica to run
        self._task_of: dict[int, int] = {}  # request -> its task
        self._heap: list[tuple[float, int]] = []  # (due, task); stale entries skipped
        self._next_task = 0

    @property
    def count(self) -> int:
        """Tasks running (sleeping, waiting or trying)."""
        return len(self._owned)

    def start(self) -> int:
        """A new task, routing nothing yet."""
        task = self._next_task
        self._next_task += 1
        self._owned[task] = None
        self._sleeps[task] = 0
        self._entered[task] = False
        return task

    def end(self, task: int) -> None:
        """The task stops (cancelled, or nothing left for it)."""
        rid = self._owned.pop(task)
        if rid is not None:
            self._task_of.pop(rid, None)
        del self._sleeps[task], self._entered[task]
        self._due.pop(task, None)
        self._waiting.discard(task)

    def running(self, task: int) -> bool:
        """Whether the task still runs."""
        return task in self._owned

    def owned(self, task: int) -> int | None:
        """The request the task routes (None: between requests)."""
        return self._owned[task]

    def own(self, task: int, rid: int) -> None:
        """The task takes request ``rid``; a new back-off starts."""
        self._owned[task] = rid
        self._task_of[rid] = task
        self._sleeps[task] = 0
        self._entered[task] = False

    def done(self, task: int) -> None:
        """The task's own request went to a replica: it is between requests."""
        rid = self._owned[task]
        if rid is not None:
            self._task_of.pop(rid, None)
        self._owned[task] = None

    def next_step_s(self, task: int) -> float | None:
        """After a try that left the task's own request waiting: None, the next try is at
        once (the back-off's free step), else the sleep before it.
        """
        if not self._entered[task]:
            self._entered[task] = True
            return None
        sleeps = self._sleeps[task]
        self._sleeps[task] = sleeps + 1
        return self.config.backoff_s(sleeps)

    def sleep_until(self, task: int, due_s: float) -> None:
        """The task tries again at ``due_s``."""
        self._due[task] = due_s
        heapq.heappush(self._heap, (due_s, task))

    def wait_for_replicas(self, task: int) -> None:
        """The task waits until the replica set changes."""
        self._waiting.add(task)

    def wake_waiting(self) -> list[int]:
        """The tasks that waited for the replica set (it changed), in start order."""
        woken = sorted(self._waiting)
        self._waiting.clear()
        return woken

    def task_of(self, rid: int) -> int | None:
        """The task routing request ``rid`` (None: none does)."""
        return self._task_of.get(rid)

    def next_due_s(self) -> float:
        """When the next sleeping task wakes (inf: none sleeps)."""
        heap = self._heap
        while heap and self._due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def pop_due(self, until_s: float) -> tuple[float, int] | None:
        """The next sleeping task due at or before ``until_s`` (its due time, the task),
        now awake; None if none is.
        """
        due_s = self.next_due_s()
        if due_s > until_s:
            return None
        _, task = heapq.heappop(self._heap)
        del self._due[task]
        return due_s, task
