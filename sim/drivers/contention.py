"""A server whose front end takes time from its running batch
(``service.overheads.arrival_busy_ms`` / ``answer_busy_ms``), as a wrapper around the
scenario's service-time model.

Ray Serve's replica reads every request (the ASGI call, the body read back from the proxy)
and writes every answer on its asyncio loop, in the process whose other thread runs the
model; the two share the interpreter lock, so a request that arrives while a batch runs
lengthens that batch (``ray/serve/_private/replica.py``; measured on MiniLM:
``benchmarks/rayserve_paths.py``, ``contention_ms``). A batch's time is therefore its
drawn time plus ``arrival_busy_ms`` for each request that arrives while it runs (the
arrivals are known in advance in an open loop, so the end is the fixed point of
``end = start + drawn + cost * arrivals in (start, end]``), plus ``answer_busy_ms`` for
each answer of the replica's previous batch when this one starts at once (the loop sends
those answers while it runs). The batches a slow spell makes longer collect more arrivals
and make the next batch bigger: slow batches come in runs, which independent draws do not
produce.
"""

from __future__ import annotations

import numpy as np

from sim.scenario.service import ServiceModel
from sim.serving.dispatch import Batch


class ContendedService:
    """A service model whose batches the front end's per-request work lengthens.

    Args:
        model: The batch's own time (``sample_s``, or ``sample_batch_s`` where it has one).
        arrival_s: When every request reached the server (the times its queue sees).
        arrival_busy_s: Added to a batch per request arriving while it runs (s, >= 0).
        answer_busy_s: Added to a batch per answer of the replica's previous batch when
            this batch starts as that one ends (s, >= 0).
    """

    def __init__(self, model: ServiceModel, arrival_s: np.ndarray, arrival_busy_s: float,
                 answer_busy_s: float) -> None:
        if arrival_busy_s < 0 or answer_busy_s < 0:
            raise ValueError("arrival_busy_s and answer_busy_s must be >= 0")
        a = np.asarray(arrival_s, dtype=float)
        self.arrival_s = a if not a.size or np.all(np.diff(a) >= 0) else np.sort(a)
        self.model = model
        self.arrival_busy_s = float(arrival_busy_s)
        self.answer_busy_s = float(answer_busy_s)
        self._by_batch = getattr(model, "sample_batch_s", None)
        self._answers: dict[int, int] = {}  # replica -> answers of its last batch

    def __repr__(self) -> str:
        return (f"ContendedService(arrival_busy_ms={self.arrival_busy_s * 1e3:g}, "
                f"answer_busy_ms={self.answer_busy_s * 1e3:g}, model={self.model!r})")

    def sample_batch_s(self, batch: Batch) -> float:
        """The batch's drawn time, lengthened by the arrivals during it and by its
        replica's previous answers when it follows that batch at once.
        """
        own_s = (self.model.sample_s(batch.items, batch.idle_s) if self._by_batch is None
                 else self._by_batch(batch))
        if batch.idle_s == 0:
            own_s += self.answer_busy_s * self._answers.get(batch.replica, 0)
        self._answers[batch.replica] = len(batch.request_ids)
        if not self.arrival_busy_s:
            return own_s
        arrival_s, start_s = self.arrival_s, batch.start_s
        first = int(np.searchsorted(arrival_s, start_s, side="right"))
        n = 0
        while True:  # each arrival lengthens the batch, which may take in more arrivals
            end_s = start_s + own_s + self.arrival_busy_s * n
            seen = int(np.searchsorted(arrival_s, end_s, side="right")) - first
            if seen <= n:
                return end_s - start_s
            n = seen

    def sample_s(self, items: int, idle_s: float = 0.0) -> float:
        """The model's own draw (no batch, so no arrivals to count)."""
        return self.model.sample_s(items, idle_s)

    def median_s(self, items: int) -> float:
        """The model's median (what the policies plan with)."""
        return self.model.median_s(items)

    def mean_s(self, items: int) -> float:
        """The model's mean."""
        return self.model.mean_s(items)
