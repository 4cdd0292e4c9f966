"""Adaptive batching: Clipper's AIMD batch-size controller.

Clipper (Crankshaw et al., NSDI 2017) grows the batch-size cap additively while the observed
batch latency stays under the latency objective and shrinks it multiplicatively (by 10%) when
a batch takes longer. The cap is the only state; it changes only in :meth:`on_batch_done`.
"""

from __future__ import annotations

import math

from sim.serving.policies.simple import _check_batch_size
from sim.serving.types import WAIT, Decision, QueueView, ReplicaView


class AimdBatching:
    """Greedy dispatch up to an adaptive cap, tuned by additive increase / multiplicative
    decrease against ``slo_ms`` (the batch service-time objective).
    """

    def __init__(self, slo_ms: float = 50.0, max_batch_size: int = 64, initial_batch_size: int = 1,
                 additive_step: int = 1, backoff: float = 0.9,
                 max_concurrent_batches: int = 1) -> None:
        if not slo_ms > 0:
            raise ValueError(f"policy.slo_ms: must be > 0, got {slo_ms!r}")
        if not 0 < backoff < 1:
            raise ValueError(f"policy.backoff: must lie in (0, 1), got {backoff!r}")
        self.slo_s = slo_ms / 1e3
        self.max_batch_size = _check_batch_size("max_batch_size", max_batch_size)
        self.step = _check_batch_size("additive_step", additive_step)
        self.backoff = backoff
        self.cap = min(_check_batch_size("initial_batch_size", initial_batch_size),
                       self.max_batch_size)
        self.max_concurrent_batches = _check_batch_size("max_concurrent_batches",
                                                        max_concurrent_batches)

    def __repr__(self) -> str:
        return (f"AimdBatching(slo_ms={self.slo_s * 1e3:g}, max_batch_size={self.max_batch_size},"
                f" cap={self.cap})")

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        """Dispatch up to the current cap of what is waiting."""
        if len(queue) == 0:
            return WAIT
        return Decision(dispatch=tuple(queue.ids(self.cap)))

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """Back off on a slow batch; grow after a full batch that met the objective."""
        if service_s > self.slo_s:
            self.cap = max(1, math.floor(self.cap * self.backoff))
        elif batch_size >= self.cap:
            self.cap = min(self.max_batch_size, self.cap + self.step)
