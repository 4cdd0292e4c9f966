"""Deadline-aware batching in the style of Clockwork and Nexus.

Using a latency model (a :class:`sim.serving.types.ServiceEstimate`), dispatch the largest
batch that still meets the earliest deadline among the requests it would contain; first drop every
request that cannot meet its deadline even when run alone now (reason recorded). Requests
without deadline never get dropped.
"""

from __future__ import annotations

from sim.serving.policies.simple import _check_batch_size
from sim.serving.types import WAIT, Decision, QueueView, ReplicaView, ServiceEstimate

DROP_REASON = "deadline_unmeetable"


class SloBatching:
    """Largest batch that meets the earliest deadline; drop the hopeless."""

    def __init__(self, estimate_s: ServiceEstimate, max_batch_size: int = 32,
                 max_concurrent_batches: int = 1) -> None:
        self.estimate_s = estimate_s
        self.max_batch_size = _check_batch_size("max_batch_size", max_batch_size)
        self.max_concurrent_batches = _check_batch_size("max_concurrent_batches",
                                                        max_concurrent_batches)

    def __repr__(self) -> str:
        return f"SloBatching(max_batch_size={self.max_batch_size})"

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Drop hopeless requests, then dispatch the largest batch meeting its deadlines."""
        if len(queue) == 0:
            return WAIT
        drops: list[tuple[int, str]] = []
        chosen: list[int] = []
        items = 0
        best: tuple[int, ...] = ()
        earliest_s = float("inf")
        for rid in queue.ids():
            deadline_s = queue.deadline_s(rid)
            size = queue.size(rid)
            if now_s + self.estimate_s(size) > deadline_s:
                drops.append((rid, DROP_REASON))
                continue
            if len(chosen) >= self.max_batch_size:
                break
            chosen.append(rid)
            items += size
            earliest_s = min(earliest_s, deadline_s)
            if now_s + self.estimate_s(items) > earliest_s:
                break  # larger batches only take longer against an earlier-or-equal deadline
            best = tuple(chosen)
        return Decision(dispatch=best, drop=tuple(drops))

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """No feedback needed (the latency model is fixed)."""
