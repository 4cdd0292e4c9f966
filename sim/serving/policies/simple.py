"""Non-adaptive batching policies: no batching, greedy, fixed size.

Pure objects following the policy contract (README, "How the simulator works"): no clock, no simpy,
no torch; the queue is only read.
"""

from __future__ import annotations

from sim.serving.types import WAIT, Decision, QueueView, ReplicaView


def _check_batch_size(name: str, value: float) -> int:
    if int(value) != value or value < 1:
        raise ValueError(f"policy.{name}: must be an integer >= 1, got {value!r}")
    return int(value)


class NoBatching:
    """One request per batch, in queue order (the baseline)."""

    max_batch_size = 1

    def __init__(self, max_concurrent_batches: int = 1) -> None:
        self.max_concurrent_batches = _check_batch_size("max_concurrent_batches",
                                                        max_concurrent_batches)

    def __repr__(self) -> str:
        return "NoBatching()"

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Dispatch the head request, if any."""
        head = queue.ids(1)
        return Decision(dispatch=tuple(head)) if head else WAIT

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """No feedback needed."""


class Greedy:
    """Work-conserving: when a replica is free, take up to ``max_batch_size`` of what waits."""

    def __init__(self, max_batch_size: int = 8, max_concurrent_batches: int = 1) -> None:
        self.max_batch_size = _check_batch_size("max_batch_size", max_batch_size)
        self.max_concurrent_batches = _check_batch_size("max_concurrent_batches",
                                                        max_concurrent_batches)

    def __repr__(self) -> str:
        return f"Greedy(max_batch_size={self.max_batch_size})"

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Dispatch everything waiting, up to the maximum."""
        ids = queue.ids(self.max_batch_size)
        return Decision(dispatch=tuple(ids)) if ids else WAIT

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """No feedback needed."""


class FixedBatch:
    """Wait for exactly ``batch_size`` requests; optionally flush a partial batch after
    ``timeout_ms`` counted from the oldest queued request's arrival.
    """

    def __init__(self, batch_size: int = 8, timeout_ms: float | None = None,
                 max_concurrent_batches: int = 1) -> None:
        self.max_batch_size = _check_batch_size("batch_size", batch_size)
        if timeout_ms is not None and timeout_ms < 0:
            raise ValueError(f"policy.timeout_ms: must be >= 0 or null, got {timeout_ms!r}")
        self.timeout_s = None if timeout_ms is None else timeout_ms / 1e3
        self.max_concurrent_batches = _check_batch_size("max_concurrent_batches",
                                                        max_concurrent_batches)

    def __repr__(self) -> str:
        ms = None if self.timeout_s is None else self.timeout_s * 1e3
        return f"FixedBatch(batch_size={self.max_batch_size}, timeout_ms={ms})"

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Full batch now; partial batch once the oldest request waited ``timeout_ms``."""
        n = len(queue)
        if n == 0:
            return WAIT
        if n >= self.max_batch_size:
            return Decision(dispatch=tuple(queue.ids(self.max_batch_size)))
        if self.timeout_s is None:
            return WAIT
        due_s = queue.oldest_arrival_s() + self.timeout_s
        if now_s >= due_s:
            return Decision(dispatch=tuple(queue.ids(n)))
        return Decision(wake_at_s=due_s)

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """No feedback needed."""
