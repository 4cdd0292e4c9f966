"""The invariants every run must keep, checked at its end (and by the tests).

* admitted = ok + rejected + timed_out + dropped + failed + queued + running;
* every queue's ``length`` equals its requests with status QUEUED (the rest of them wait at
  the router);
* no batch holds more than its policy's ``max_batch_size`` requests (checked at dispatch, see
  :mod:`sim.serving.dispatch`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.errors import InvariantError
from sim.serving.queues import RequestQueue
from sim.serving.records import RequestTable

__all__ = ["InvariantError", "check_invariants"]


def check_invariants(table: RequestTable, admitted: int, queues: Sequence[RequestQueue],
                     running: int, held: int = 0) -> dict[str, int]:
    """Check request conservation; return the status counts.

    Args:
        table: Request records.
        admitted: Requests handed out by the source so far.
        queues: Every queue.
        running: Requests in running batches that have not ended.
        held: Requests waiting at the router (a bound on a replica's ongoing requests).

    Raises:
        InvariantError: a request was lost or counted twice.
    """
    counts = table.status_counts(admitted)
    queued = sum(q.length for q in queues) + held
    if counts["in_flight"] != queued + running:
        raise InvariantError(f"in-flight requests {counts['in_flight']} != queued {queued} "
                             f"(held at the router {held}) + running {running}")
    if sum(counts.values()) != admitted:
        raise InvariantError(f"status counts {counts} do not add up to {admitted} arrivals")
    for q in queues:
        live = sum(1 for _ in q.iter_ids())
        if live != q.length:
            raise InvariantError(f"queue {q.index} holds {live} requests but counts "
                                 f"{q.length}")
    return counts
