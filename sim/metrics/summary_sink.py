"""A run that keeps only what its summary needs (``records: summary``).

The core still keeps what the simulation itself reads per request (arrival time and status;
sizes, priorities, deadlines and the routed replica only where they vary or are read), but
no start, finish or batch column. Every request that ends is buffered here with its start and
finish; batches and queue-length changes stay in their tables. When a buffer reaches
:data:`FLUSH_ROWS` rows it is folded into the summary's statistics (:mod:`sim.metrics.folds`, the
same folds that summarise a full run's tables) and dropped. What stays per request is the
exact latency, queue-wait and service samples of the ok requests (8 bytes each), which exact
percentiles need; with ``records: sketch`` not even those, only their
:class:`sim.metrics.folds.BinnedSamples` (a fixed size whatever the run's length).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sim.metrics.folds import BatchFold, QueueFold, RequestFold
from sim.metrics.stability import TREND_SEGMENTS
from sim.serving.records import _STATUS_CATEGORY, Constant, constant, view
from sim.serving.types import QUEUED, RUNNING

if TYPE_CHECKING:
    from sim.serving.core import ServingCore

FLUSH_ROWS = 1 << 16  # rows buffered before a fold


class SummarySink:
    """Folds a running core's records as they end.

    Args:
        core: The serving core (its request table must have ``records="summary"``).
        lo_s: The window's start (warm-up).
        hi_s: The window's end (horizon; known before the run).
        slo_s: Latency objective for goodput (None: none).
        has_deadlines: Requests carry their own deadlines.
        binned: Keep the latency samples as a sketch (``records: sketch``,
            :class:`sim.metrics.folds.BinnedSamples`) instead of exactly.
    """

    def __init__(self, core: ServingCore, lo_s: float, hi_s: float, slo_s: float | None,
                 has_deadlines: bool, binned: bool = False) -> None:
        self.core = core
        table = core.table
        self.requests = RequestFold(lo_s, hi_s, slo_s, has_deadlines,
                                    classes=table.klass is not None,
                                    capacity=0 if binned else table.n, binned=binned)
        self.batches = BatchFold(lo_s, hi_s, core.n_replicas)
        self.queue = QueueFold(lo_s, hi_s, TREND_SEGMENTS)
        self._new_buffers()
        table.sink = self

    def _new_buffers(self) -> None:
        self._rid = array("q")
        self._start_s = array("d")
        self._finish_s = array("d")
        self._status = array("b")

    # -- what the core reports ---------------------------------------------------------------
    def ended_run(self, first: int, n: int, start_s: float, finish_s: float,
                  status: int) -> None:
        """Requests ``first .. first + n - 1`` ended with ``status`` at ``finish_s``."""
        self._rid.extend(range(first, first + n))
        self._start_s.extend(array("d", (start_s,)) * n)
        self._finish_s.extend(array("d", (finish_s,)) * n)
        self._status.extend(constant("b", status, n))

    def ended(self, ids: Sequence[int], start_s: float, finish_s: float, status: int) -> None:
        """Requests ``ids`` ended with ``status`` at ``finish_s`` (``start_s``: their batch's
        start; NaN for a request that never started).
        """
        n = len(ids)
        self._rid.extend(ids)
        if n == 1:
            self._start_s.append(start_s)
            self._finish_s.append(finish_s)
            self._status.append(status)
        else:
            self._start_s.extend(array("d", (start_s,)) * n)
            self._finish_s.extend(array("d", (finish_s,)) * n)
            self._status.extend(constant("b", status, n))

    def maybe_flush(self) -> None:
        """Fold whatever buffer is full."""
        core = self.core
        if len(self._rid) >= FLUSH_ROWS:
            self._flush_requests()
        if len(core.batches.start_s) >= FLUSH_ROWS:
            self._flush_batches(closing=False)
        if len(core.queue_series.time_s) >= FLUSH_ROWS:
            self._flush_queue()

    # -- folding -----------------------------------------------------------------------------
    def _flush_requests(self) -> None:
        if not len(self._rid):
            return
        rid = view(self._rid, len(self._rid))
        self._fold_requests(rid, view(self._start_s, rid.size), view(self._finish_s, rid.size),
                            _STATUS_CATEGORY[view(self._status, rid.size)], math.nan)
        self._new_buffers()  # (not resized: a view of the old ones may still be alive)

    def _fold_requests(self, rid: np.ndarray, start_s: np.ndarray, finish_s: np.ndarray,
                       status: np.ndarray, end_s: float) -> None:
        table = self.core.table
        arrival = view(table.arrival_s, table.n)[rid]
        deadline = None
        if not isinstance(table.deadline_s, Constant):  # deadlines that vary
            deadline = view(table.deadline_s, table.n)[rid]
        klass = None
        if table.klass is not None:
            names = table.klass
            klass = np.array([names[r] for r in rid.tolist()], dtype=object)
        self.requests.add(arrival, start_s, finish_s, status, deadline, klass, end_s=end_s)

    def _flush_batches(self, closing: bool) -> None:
        batches = self.core.batches
        n = len(batches.start_s)
        if n == 0:
            return
        finish = view(batches.finish_s, n)
        unfinished = np.flatnonzero(np.isnan(finish))
        k = n if closing or unfinished.size == 0 else int(unfinished[0])
        if k:
            self.batches.add(view(batches.start_s, k), finish[:k], view(batches.replica, k),
                             view(batches.size, k), view(batches.items, k))
        del finish
        if k and not closing:
            batches.drop_first(k)

    def _flush_queue(self) -> None:
        series = self.core.queue_series
        n = len(series.time_s)
        if n:
            self.queue.add(view(series.time_s, n), view(series.queue, n),
                           view(series.length, n))
            series.clear()

    def close(self, end_s: float) -> None:
        """Fold what is left: the buffers, then the requests still in flight (censored at
        ``end_s``, when the run stopped), the batches still running and the queue's last
        value. Call once, after the run.
        """
        self._flush_requests()
        core = self.core
        admitted = core.source.admitted
        status = view(core.table.status, admitted)
        pending = np.flatnonzero((status == QUEUED) | (status == RUNNING))
        del status
        if pending.size:
            start = np.full(pending.size, math.nan)
            where = {int(r): i for i, r in enumerate(pending.tolist())}
            for running in core.running_batches:
                for batch in running.values():
                    for rid in batch.request_ids:
                        if rid in where:
                            start[where[rid]] = batch.start_s
            self._fold_requests(pending, start, np.full(pending.size, math.nan),
                                np.zeros(pending.size, dtype=np.int8), end_s)
        self._flush_batches(closing=True)
        self._flush_queue()
        self.queue.close()
