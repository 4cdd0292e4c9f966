"""Size-or-timeout dynamic batching (Triton, Ray Serve, TorchServe).

``timer="request"`` (Triton): a request may wait at most ``max_wait_ms`` from its own enqueue;
the batch goes when the oldest queued request's wait is used up, or when it is full.
``timer="first"`` (Ray Serve ``batch_wait_timeout_s``, TorchServe ``max_batch_delay``): the
clock starts when the batcher takes the first request of a new batch, i.e. at the first
decision that sees a non-empty queue after the previous dispatch. The clock is tied to the
request at the head of the queue when it started: once that request has left the queue
(dispatched by any replica, expired, dropped), the next look starts a new clock. A policy is
never consulted on an empty queue, so a clock kept by replica alone would outlive the requests
it was timing.

``timer="arrival"`` (Ray Serve's ``@serve.batch`` as it runs, read from
``ray/serve/batching.py``): the batcher closes the next batch while the replica is still busy
(``_process_batches`` awaits ``wait_for_batch`` again as soon as it has handed a batch to a
task that waits on the ``max_concurrent_batches`` semaphore), so a batch's clock starts at its
first request's arrival, or at the previous batch's close if that request came earlier, and
the batch holds what arrived before the clock ran out (up to the maximum), however long the
replica stays busy afterwards. ``first`` instead starts the clock when a free replica first
looks, and takes everything waiting then: under load its batches are larger.

``preferred_batch_sizes`` (Triton's model configuration): as soon as a batch of *any*
preferred size can be formed, the largest preferred size that can be formed is sent at once;
when the delay is used up (fewer requests wait than the smallest preferred size) everything
waiting is sent, up to the maximum. Without preferred sizes a batch goes as soon as
``max_batch_size`` requests wait.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.serving.policies.simple import _check_batch_size
from sim.serving.types import WAIT, Decision, QueueView, ReplicaView

TIMERS = ("request", "first", "arrival")


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
        if timer == "arrival" and preferred:
            raise ValueError("policy.preferred_batch_sizes: not available with timer "
                             "'arrival' (Ray Serve's batcher has none)")
        self.max_wait_s = max_wait_ms / 1e3
        self.timer = timer
        self.preferred = preferred
        self.max_concurrent_batches = _check_batch_size("max_concurrent_batches",
                                                        max_concurrent_batches)
        self._ready_n = preferred[0] if preferred else self.max_batch_size
        self._clock: dict[int, tuple[float, int]] = {}  # replica -> (start, head request)
        self._closed_s: dict[int, float] = {}  # replica -> when its last batch closed

    def __repr__(self) -> str:
        return (f"DynamicBatching(max_batch_size={self.max_batch_size}, "
                f"max_wait_ms={self.max_wait_s * 1e3:g}, timer={self.timer!r}, "
                f"preferred_batch_sizes={self.preferred})")

    def _ready_size(self, n: int) -> int:
        """The batch to send at once when ``n`` >= ``_ready_n`` requests wait."""
        if not self.preferred:
            return self.max_batch_size
        return [b for b in self.preferred if b <= n][-1]

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Full (or preferred-size) batch now; otherwise wait until the timer runs out."""
        n = len(queue)
        if n == 0:
            return WAIT
        if self.timer == "arrival":
            return self._by_arrival(now_s, queue, replica.index)
        if n >= self._ready_n:
            self._clock.pop(replica.index, None)
            return Decision(dispatch=tuple(queue.ids(self._ready_size(n))))
        if self.timer == "request":
            due_s = queue.oldest_arrival_s() + self.max_wait_s
        else:
            clock = self._clock.get(replica.index)
            if clock is None or not queue.contains(clock[1]):
                clock = self._clock[replica.index] = (now_s, queue.ids(1)[0])
            due_s = clock[0] + self.max_wait_s
        if now_s >= due_s:
            self._clock.pop(replica.index, None)
            return Decision(dispatch=tuple(queue.ids(min(n, self.max_batch_size))))
        return Decision(wake_at_s=due_s)

    def _by_arrival(self, now_s: float, queue: QueueView, replica: int) -> Decision:
        """``timer="arrival"``: the head's batch closes ``max_wait`` after its clock started
        (its arrival, or the previous close) or when the maximum had arrived.
        """
        ids = queue.ids(self.max_batch_size)
        start_s = max(queue.arrival_s(ids[0]), self._closed_s.get(replica, -1e300))
        close_s = start_s + self.max_wait_s
        inside = [r for r in ids if queue.arrival_s(r) <= close_s]
        if len(inside) == self.max_batch_size:  # full: closed when its last one arrived
            close_s = max(start_s, queue.arrival_s(inside[-1]))
        elif now_s < close_s:
            return Decision(wake_at_s=close_s)
        self._closed_s[replica] = close_s
        return Decision(dispatch=tuple(inside))

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """No feedback needed."""
