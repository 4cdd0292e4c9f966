"""Core types shared by policies and both drivers (simulator and live executor).

Seconds everywhere. This module imports neither simpy nor torch, so policies can depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

# Request status codes, stored as int8 in the records; names are what the tables show.
QUEUED = 0
OK = 1
REJECTED = 2
TIMED_OUT = 3
DROPPED = 4
FAILED = 5
RUNNING = 6
STATUS_NAMES = {
    QUEUED: "in_flight",
    OK: "ok",
    REJECTED: "rejected",
    TIMED_OUT: "timed_out",
    DROPPED: "dropped",
    FAILED: "failed",
    RUNNING: "in_flight",
}
ERROR_CAUSES = ("rejected", "timed_out", "dropped", "failed")
# the status column's categories, in code order (running requests show as in_flight)
STATUS_CATEGORIES = ["in_flight", "ok", "rejected", "timed_out", "dropped", "failed"]
_LABELS = np.array([STATUS_NAMES[code] for code in range(len(STATUS_NAMES))])


def status_labels(codes: np.ndarray) -> np.ndarray:
    """The names of status codes, as the tables show them (queued and running: in_flight)."""
    labels: np.ndarray = _LABELS[codes]
    return labels


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request.

    Attributes:
        id: Dense request id (arrival order).
        arrival_s: Arrival (enqueue) time in seconds.
        size: Items in the request (what the batch's service time depends on).
        priority: 0 is the highest priority.
        deadline_s: Absolute deadline in seconds, or ``inf`` when there is none.
        klass: Optional label for grouping results.
    """

    id: int
    arrival_s: float
    size: int = 1
    priority: int = 0
    deadline_s: float = math.inf
    klass: str = ""


@dataclass(frozen=True, slots=True, init=False)
class Decision:
    """What a policy wants done now (immutable).

    Attributes:
        dispatch: Request ids to run now as one batch, in order (may be empty).
        drop: ``(request id, reason)`` pairs to reject now.
        wake_at_s: Ask the policy again at this time if nothing else happens first
            (``None``: only on the next event).
    """

    dispatch: tuple[int, ...]
    drop: tuple[tuple[int, str], ...]
    wake_at_s: float | None

    # A hand-written __init__ sets the slots through their descriptors: the generated one of a
    # frozen dataclass goes through object.__setattr__ and costs 0.3 us more per decision,
    # which is most of a policy call on the simulator's hot path.
    def __init__(self, dispatch: tuple[int, ...] = (), drop: tuple[tuple[int, str], ...] = (),
                 wake_at_s: float | None = None) -> None:
        _SET_DISPATCH(self, dispatch)
        _SET_DROP(self, drop)
        _SET_WAKE(self, wake_at_s)


_SET_DISPATCH = Decision.__dict__["dispatch"].__set__
_SET_DROP = Decision.__dict__["drop"].__set__
_SET_WAKE = Decision.__dict__["wake_at_s"].__set__

WAIT = Decision()
"""The decision to do nothing until the next event."""


@runtime_checkable
class QueueView(Protocol):
    """Read-only view of one queue, in service order (FIFO: oldest first)."""

    def __len__(self) -> int: ...

    @property
    def items(self) -> int:
        """Total items of the queued requests."""
        ...

    def ids(self, k: int | None = None) -> list[int]:
        """The first ``k`` (all when None) queued request ids in service order."""
        ...

    def oldest_arrival_s(self) -> float:
        """Earliest arrival time among the queued requests (``inf`` if empty)."""
        ...

    def arrival_s(self, request_id: int) -> float:
        """Arrival time of a queued request."""
        ...

    def contains(self, request_id: int) -> bool:
        """Whether the request is still waiting in this queue."""
        ...

    def size(self, request_id: int) -> int:
        """Items of a queued request."""
        ...

    def deadline_s(self, request_id: int) -> float:
        """Absolute deadline of a queued request (``inf`` if none)."""
        ...

    def requests(self, k: int | None = None) -> list[Request]:
        """The first ``k`` (all when None) queued requests as :class:`Request` objects."""
        ...

    def __iter__(self) -> Iterator[Request]: ...


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a policy may know about the replica it decides for.

    Attributes:
        index: Replica number, 0-based.
        running_batches: Batches running on it now.
        max_concurrent_batches: How many may overlap.
    """

    index: int
    running_batches: int = 0
    max_concurrent_batches: int = 1


@runtime_checkable
class Policy(Protocol):
    """The policy contract (see the README, "How the simulator works").

    A policy never reads a clock, sleeps, imports simpy or torch, or mutates the queue.
    """

    max_batch_size: int
    max_concurrent_batches: int

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Decide what to do now for a free replica."""
        ...

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """Feedback after a batch finished (for adaptive policies)."""
        ...


class ServiceEstimate(Protocol):
    """A latency model a policy may consult: seconds for a batch of ``items`` items."""

    def __call__(self, items: int) -> float:
        """Estimated service time in seconds."""
        ...


_COUNT_CHUNK = 1 << 18  # rows per chunk (as sim.metrics.folds.CHUNK)


def count_codes(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """How many of each code ``0 .. n_codes - 1`` (in chunks: ``np.bincount`` would copy
    a whole column of small codes to 8 bytes each).
    """
    counts = np.zeros(n_codes, dtype=np.int64)
    for a in range(0, codes.size, _COUNT_CHUNK):
        counts += np.bincount(codes[a:a + _COUNT_CHUNK], minlength=n_codes)[:n_codes]
    return counts
