"""Routers: which replica's queue an arriving request joins (per-replica queues).

``shared`` routing needs no router: one queue that free replicas pull from. The others are
pure objects like policies (no clock, no simpy, no torch; randomness from a generator given at
construction), so the live executor routes with the very same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sim.errors import UserError

ROUTINGS = ("shared", "round_robin", "random", "jsq", "p2c", "least_work")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """A replica's load as seen at an arrival.

    ``outstanding_work_s`` is filled in only for routers with ``needs_work_estimate = True``
    (it costs a latency-model call per replica per arrival); it is 0 otherwise.

    Attributes:
        index: Replica number.
        queue_len: Requests waiting in its queue.
        queued_items: Items waiting in its queue.
        running_batches: Batches running on it.
        outstanding_work_s: Estimated seconds of work left (queued + remaining running).
    """

    index: int
    queue_len: int
    queued_items: int
    running_batches: int
    outstanding_work_s: float


class Router(Protocol):
    """Picks a replica for an arriving request."""

    def route(self, now_s: float, request_id: int, loads: Sequence[ReplicaLoad]) -> int:
        """Index of the replica whose queue the request joins."""
        ...


class RoundRobin:
    """Replicas in turn."""

    def __init__(self) -> None:
        self._next = 0

    def __repr__(self) -> str:
        return "RoundRobin()"

    def route(self, now_s: float, request_id: int, loads: Sequence[ReplicaLoad]) -> int:
        """The next replica in turn."""
        choice = self._next % len(loads)
        self._next = choice + 1
        return choice


class RandomRouter:
    """A uniformly random replica."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def __repr__(self) -> str:
        return "RandomRouter()"

    def route(self, now_s: float, request_id: int, loads: Sequence[ReplicaLoad]) -> int:
        """A random replica."""
        return int(self.rng.integers(len(loads)))


def _outstanding(load: ReplicaLoad) -> int:
    return load.queue_len + load.running_batches


class JoinShortestQueue:
    """The replica with the fewest outstanding requests (queued + running batches);
    ties go to the lowest index.
    """

    def __repr__(self) -> str:
        return "JoinShortestQueue()"

    def route(self, now_s: float, request_id: int, loads: Sequence[ReplicaLoad]) -> int:
        """The least loaded replica."""
        return min(loads, key=lambda ld: (_outstanding(ld), ld.index)).index


class PowerOfTwo:
    """Two distinct random replicas; the one with fewer outstanding requests."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def __repr__(self) -> str:
        return "PowerOfTwo()"

    def route(self, now_s: float, request_id: int, loads: Sequence[ReplicaLoad]) -> int:
        """The better of two random choices."""
        if len(loads) == 1:
            return 0
        a, b = (int(x) for x in self.rng.choice(len(loads), size=2, replace=False))
        return a if (_outstanding(loads[a]), a) <= (_outstanding(loads[b]), b) else b


class LeastWork:
    """The replica with the least estimated outstanding work (seconds)."""

    needs_work_estimate = True  # the core computes outstanding_work_s only for routers that ask

    def __repr__(self) -> str:
        return "LeastWork()"

    def route(self, now_s: float, request_id: int, loads: Sequence[ReplicaLoad]) -> int:
        """The replica that should free up first."""
        return min(loads, key=lambda ld: (ld.outstanding_work_s, ld.index)).index


def make_router(name: str, rng: np.random.Generator) -> Router | None:
    """The router for a scenario's ``routing`` value (None for ``shared``)."""
    builders = {
        "shared": lambda: None,
        "round_robin": RoundRobin,
        "random": lambda: RandomRouter(rng),
        "jsq": JoinShortestQueue,
        "p2c": lambda: PowerOfTwo(rng),
        "least_work": LeastWork,
    }
    try:
        builder = builders[name]
    except KeyError:
        raise UserError(f"routing: unknown {name!r}; allowed: {', '.join(ROUTINGS)}") from None
    router: Router | None = builder()
    return router
