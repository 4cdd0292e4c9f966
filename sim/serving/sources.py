"""Where requests come from: the open-loop schedule or closed-loop clients.

Both hand out request ids in arrival order (:meth:`peek_s` then :meth:`pop`) and hear when a
request ended (:meth:`on_done`: a closed-loop client thinks, then sends again).
:func:`end_request` is the one place a request reaches a terminal outcome other than a batch
finishing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from sim.serving.records import RequestTable


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

    def __init__(self, table: RequestTable, clients: int, think: Callable[[], float], size: int,
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
            if n_requests is not None and self._sent >= n_requests:
                break  # no later draw could send: clients past n_requests cost nothing
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


def end_request(table: RequestTable, source: Source, rid: int, status: int, time_s: float,
                reason: str) -> None:
    """Give request ``rid`` a terminal ``status`` at ``time_s`` (with ``reason``) and tell
    its source (a closed-loop client sends again after thinking).
    """
    table.status[rid] = status
    table.finish_s[rid] = time_s
    if reason:
        table.reasons[rid] = reason
    if table.sink is not None:
        table.sink.ended((rid,), math.nan, time_s, status)
    source.on_done(rid, time_s)
