"""Size-or-timeout dynamic batching (Triton, Ray Serve, TorchServe).

``timer="request"`` (Triton): a request may wait at most ``max_wait_ms`` from its own enqueue;
the batch goes when the oldest queued request's wait is used up, or when it is full.
``timer="first"`` (Ray Serve ``batch_wait_timeout_s``, TorchServe ``max_batch_delay``): the
clock starts when the batcher takes the first request of a new batch, i.e. at the first
decision that sees a non-empty queue after the previous dispatch.

``preferred_batch_sizes`` (Triton): a batch of the largest preferred size is sent as soon as
that many requests wait; when the delay is used up the largest preferred size that fits is
sent, or everything waiting (up to the maximum) when none fits.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.policies.simple import _check_batch_size
from sim.types import WAIT, Decision, QueueView, ReplicaView

TIMERS = ("request", "first")


class DynamicBatching:
    """Dispatch when ``max_batch_size`` requests wait or the wait budget is used up."""

    def __init__(self, max_batch_size: int = 8, max_wait_ms: float = 2.0,
                 timer: str = "request", preferred_batch_sizes: Sequence[int] = (),
                 max_concurrent_batches: int = 1) -> None:
        self.max_batch_size = _check_batch_size("max_batch_size", max_batch_size)
        if max_wait_ms < 0:
            raise ValueError(f"policy.max_wait_ms: must be >= 0, got {max_wait_ms!r}")
        if timer not in TIMERS:
            raise ValueError(f"policy.timer: unknown {timer!r}; allowed: {', '.join(TIMERS)}")
        preferred = sorted({_check_batch_size("preferred_batch_sizes", b)
                            for b in preferred_batch_sizes})
        if preferred and preferred[-1] > self.max_batch_size:
            raise ValueError(f"policy.preferred_batch_sizes: {preferred[-1]} exceeds "
                             f"max_batch_size {self.max_batch_size}")
        self.max_wait_s = max_wait_ms / 1e3
        self.timer = timer
        self.preferred = preferred
        self.max_concurrent_batches = _check_batch_size("max_concurrent_batches",
                                                        max_concurrent_batches)
        self._ready_n = preferred[-1] if preferred else self.max_batch_size
        self._collect_start_s: dict[int, float] = {}

    def __repr__(self) -> str:
        return (f"DynamicBatching(max_batch_size={self.max_batch_size}, "
                f"max_wait_ms={self.max_wait_s * 1e3:g}, timer={self.timer!r}, "
                f"preferred_batch_sizes={self.preferred})")

    def _timeout_size(self, n: int) -> int:
        fitting = [b for b in self.preferred if b <= n]
        return fitting[-1] if fitting else min(n, self.max_batch_size)

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Full (or preferred-size) batch now; otherwise wait until the timer runs out."""
        n = len(queue)
        if n == 0:
            return WAIT
        if n >= self._ready_n:
            self._collect_start_s.pop(replica.index, None)
            return Decision(dispatch=tuple(queue.ids(self._ready_n)))
        if self.timer == "request":
            due_s = queue.oldest_arrival_s() + self.max_wait_s
        else:
            due_s = self._collect_start_s.setdefault(replica.index, now_s) + self.max_wait_s
        if now_s >= due_s:
            self._collect_start_s.pop(replica.index, None)
            return Decision(dispatch=tuple(queue.ids(self._timeout_size(n))))
        return Decision(wake_at_s=due_s)

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """No feedback needed."""
