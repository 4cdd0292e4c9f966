"""The summary's statistics as folds over chunks of records: the one definition of each.

A fold takes a run's records a chunk at a time and keeps only what the summary needs:
counts and sums, the per-replica busy reach, the queue's time-weighted histogram and segment
areas, and the latency samples that exact percentiles need (8 bytes per ok request for each
of latency, queue wait and service). :func:`sim.metrics.summary.summarize` feeds a finished run's
tables to them in one go; a ``records: summary`` run (:mod:`sim.metrics.summary_sink`) feeds them
while it runs and drops the rows. Both read the same numbers out of them.

Chunks must come in order: requests in any order (every terminal request once, the
in-flight ones last, with the run's stop time), batches in start order, queue changes in
time order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.serving.types import STATUS_CATEGORIES, count_codes

SAMPLE_KINDS = ("latency", "wait", "service")

SKETCH_BITS = 14
"""Mantissa bits a sketch bucket keeps: buckets are 2^-14 of a binade wide."""
SKETCH_REL_ERROR = 2.0 ** -(SKETCH_BITS + 1)
"""Bound on a sketch percentile's relative error (3.05e-5), above :data:`SKETCH_FLOOR_S`."""
SKETCH_FLOOR_S = 1e-9
"""Positive samples below this (s) share its bucket: their absolute error is below it."""
_SHIFT = 52 - SKETCH_BITS

# status categories (as in the request table's ``status`` column)
IN_FLIGHT, OK_CODE = STATUS_CATEGORIES.index("in_flight"), STATUS_CATEGORIES.index("ok")
N_CATEGORIES = len(STATUS_CATEGORIES)


class Samples:
    """A growing float64 sample buffer, allocated once at its expected ``capacity`` (pages
    that are never written take no memory), doubled if it fills.
    """

    def __init__(self, capacity: int = 0) -> None:
        self._buf = np.empty(max(capacity, 16))
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def extend(self, values: np.ndarray) -> None:
        """Append ``values``."""
        k = values.size
        if self.n + k > self._buf.size:
            grown = np.empty(max(2 * self._buf.size, self.n + k))
            grown[:self.n] = self._buf[:self.n]
            self._buf = grown
        self._buf[self.n:self.n + k] = values
        self.n += k

    def view(self) -> np.ndarray:
        """The samples so far (a writable view of the buffer)."""
        return self._buf[:self.n]


class BinnedSamples:
    """Non-negative samples (s) as counts in log-spaced buckets (``records: sketch``): a
    fixed memory whatever their number, exact count, sum, minimum, maximum and zeros, and
    percentiles within :data:`SKETCH_REL_ERROR` of the exact ones (numpy's linear method on
    every sample) or :data:`SKETCH_FLOOR_S`, whichever is larger.

    A bucket is the set of floats that share their sign, exponent and first
    :data:`SKETCH_BITS` mantissa bits, so it spans at most ``2^-14`` of its lower end; an
    order statistic read as its bucket's midpoint is off by at most half that, and numpy's
    interpolation between two order statistics keeps that relative bound.
    """

    def __init__(self) -> None:
        self.n = 0
        self.zeros = 0
        self.sum_s = 0.0
        self.min_s, self.max_s = math.inf, -math.inf
        self._base = 0  # the bucket key of _counts[0]
        self._counts = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return self.n

    def extend(self, values: np.ndarray) -> None:
        """Count ``values`` (s, none negative or NaN)."""
        if values.size == 0:
            return
        low, high = float(values.min()), float(values.max())
        if not low >= 0.0:  # (a NaN anywhere makes the minimum NaN)
            raise ValueError(f"a sketch holds non-negative samples, got {low!r}")
        self.n += values.size
        self.sum_s += float(values.sum())
        self.min_s, self.max_s = min(self.min_s, low), max(self.max_s, high)
        positive = values[values > 0.0]
        self.zeros += values.size - positive.size
        if positive.size == 0:
            return
        keys = np.maximum(positive, SKETCH_FLOOR_S).view(np.int64) >> _SHIFT
        self._cover(int(keys.min()), int(keys.max()))
        self._counts += np.bincount(keys - self._base, minlength=self._counts.size)

    def _cover(self, lo: int, hi: int) -> None:
        """Grow the bucket array to hold keys ``lo .. hi``."""
        size = self._counts.size
        if size and self._base <= lo and hi < self._base + size:
            return
        base = lo if not size else min(lo, self._base)
        end = hi if not size else max(hi, self._base + size - 1)
        grown = np.zeros(end - base + 1, dtype=np.int64)
        if size:
            grown[self._base - base:self._base - base + size] = self._counts
        self._base, self._counts = base, grown

    def merged(self, other: BinnedSamples) -> BinnedSamples:
        """A new sketch holding both sets of samples."""
        out = BinnedSamples()
        out.n, out.zeros = self.n + other.n, self.zeros + other.zeros
        out.sum_s = self.sum_s + other.sum_s
        out.min_s, out.max_s = min(self.min_s, other.min_s), max(self.max_s, other.max_s)
        for part in (self, other):
            if part._counts.size:
                out._cover(part._base, part._base + part._counts.size - 1)
                at = part._base - out._base
                out._counts[at:at + part._counts.size] += part._counts
        return out

    def mean_s(self) -> float:
        """The samples' mean (NaN: none)."""
        return self.sum_s / self.n if self.n else math.nan

    def percentiles_s(self, percents: list[float]) -> list[float]:
        """The ``percents`` percentiles, as numpy's linear method indexes them."""
        q = np.true_divide(np.asarray(percents, dtype=float), 100)
        virtual = (self.n - 1) * q
        previous = np.floor(virtual)
        cum = np.cumsum(self._counts)
        out = []
        for h, i in zip(virtual.tolist(), previous.tolist(), strict=True):
            a = self._order_statistic(int(i), cum)
            b = self._order_statistic(min(int(i) + 1, self.n - 1), cum)
            t = h - i
            value = a + (b - a) * t if t < 0.5 else b - (b - a) * (1 - t)
            out.append(min(max(value, self.min_s), self.max_s))
        return out

    def _order_statistic(self, rank: int, cum: np.ndarray) -> float:
        """The ``rank``-th smallest sample (from 0), as its bucket's midpoint."""
        if rank < self.zeros:
            return 0.0
        k = self._base + int(np.searchsorted(cum, rank - self.zeros, side="right"))
        lo, hi = np.array([k << _SHIFT, (k + 1) << _SHIFT], dtype=np.int64).view(np.float64)
        return min(max(float(lo + hi) / 2, self.min_s), self.max_s)


class RequestFold:
    """Per-request statistics over the window ``[lo_s, hi_s]``.

    Args:
        lo_s: The window's start (warm-up).
        hi_s: The window's end (horizon).
        slo_s: Latency objective for goodput (None: none).
        has_deadlines: Requests carry their own deadlines (goodput by deadline).
        classes: Keep a fold per request class as well.
        capacity: How many requests are expected (sizes the sample buffers).
        binned: Keep the samples as :class:`BinnedSamples` (a sketch: fixed memory,
            percentiles within a stated bound) instead of exactly.
    """

    def __init__(self, lo_s: float, hi_s: float, slo_s: float | None = None,
                 has_deadlines: bool = False, classes: bool = False,
                 capacity: int = 0, binned: bool = False) -> None:
        self.lo_s, self.hi_s = lo_s, hi_s
        self.slo_s, self.has_deadlines = slo_s, has_deadlines
        self.binned = binned
        self.counts = np.zeros(N_CATEGORIES, dtype=np.int64)  # arrivals in the window
        samples: Any = (lambda _: BinnedSamples()) if binned else Samples
        self.latency_s, self.wait_s, self.service_s = (samples(capacity) for _ in range(3))
        self.censored_latency_s, self.censored_wait_s = samples(0), samples(0)
        self.completions = 0
        self.good = 0
        self.in_system_s = 0.0  # integral of the number in the system over the window
        self.rows = 0  # requests folded
        self.classes: dict[str, RequestFold] | None = {} if classes else None
        # chunks added with keep=True: (arrival, start, finish, ok mask or None)
        self._kept: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []

    @property
    def arrivals(self) -> int:
        """Requests that arrived in the window."""
        return int(self.counts.sum())

    @property
    def censored(self) -> int:
        """Requests that arrived in the window and were unfinished when the run stopped."""
        return int(self.counts[IN_FLIGHT])

    def add(self, arrival_s: np.ndarray, start_s: np.ndarray, finish_s: np.ndarray,
            status: np.ndarray, deadline_s: np.ndarray | None = None,
            klass: np.ndarray | None = None, end_s: float = math.nan,
            keep: bool = False) -> None:
        """Fold a chunk of requests.

        Args:
            arrival_s: Arrival times.
            start_s: Batch start times (NaN: never started).
            finish_s: Terminal times (NaN: in flight).
            status: Status category codes (0 in flight, 1 ok, 2 rejected, 3 timed out,
                4 dropped, 5 failed).
            deadline_s: Per-request deadlines (goodput by deadline), or None.
            klass: Class names per request (with ``classes``), or None.
            end_s: When the run stopped: the finish of the in-flight requests of this chunk
                (only the last chunk may hold any).
            keep: The arrays outlive the fold (a finished run's columns): the samples are
                computed from them when read (:meth:`values`, one kind at a time) instead
                of copied now.
        """
        if arrival_s.size == 0:
            return
        self.rows += arrival_s.size
        inwin = arrival_s >= self.lo_s
        ok_any = status == OK_CODE
        ok = inwin & ok_any
        self.counts += count_codes(status if bool(inwin.all()) else status[inwin],
                                   N_CATEGORIES)
        pending = inwin & (status == IN_FLIGHT)
        all_ok = bool(ok.all())
        if keep:
            if self.binned:
                raise ValueError("a binned fold copies its samples (keep=False)")
            self._kept.append((arrival_s, start_s, finish_s, None if all_ok else ok))
        else:  # one per-request temporary at a time
            for buf, (a, b) in zip(self._buffers(), ((finish_s, arrival_s),
                                                     (start_s, arrival_s),
                                                     (finish_s, start_s)), strict=True):
                values = a - b
                buf.extend(values if all_ok else values[ok])
                del values
        if pending.any():
            if math.isnan(end_s):
                raise ValueError("in-flight requests need the run's stop time (end_s)")
            arrival_pending = arrival_s[pending]
            self.censored_latency_s.extend(end_s - arrival_pending)
            started = start_s[pending]
            self.censored_wait_s.extend(
                    np.where(np.isnan(started), end_s, started) - arrival_pending)
        self._completions(arrival_s, finish_s, ok_any, deadline_s)
        self._in_system(arrival_s, finish_s, end_s)
        if self.classes is not None and klass is not None:
            self._by_class(arrival_s, start_s, finish_s, status, deadline_s, klass, end_s)

    def _buffers(self) -> tuple[Any, Any, Any]:
        return self.latency_s, self.wait_s, self.service_s

    def values(self, kind: str) -> np.ndarray:
        """The ``latency``, ``wait`` or ``service`` samples (s) of the ok requests in the
        window, in the order they were folded; the caller may overwrite them.
        """
        if self.binned:
            raise ValueError("a binned fold keeps no samples, only their sketch")
        index = SAMPLE_KINDS.index(kind)
        parts = []
        for arrival, start, finish, ok in self._kept:
            a, b = ((finish, arrival), (start, arrival), (finish, start))[index]
            values = a - b
            parts.append(values if ok is None else values[ok])
        buf = self._buffers()[index]
        if len(buf) or not parts:
            parts.append(buf.view())
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _completions(self, arrival_s: np.ndarray, finish_s: np.ndarray, ok_any: np.ndarray,
                     deadline_s: np.ndarray | None) -> None:
        """Ok requests (whenever they arrived) that finished inside the window, and how many
        of those met their SLO (their own deadline when requests carry one).
        """
        finish = finish_s[ok_any]
        done_in = (finish >= self.lo_s) & (finish <= self.hi_s)
        self.completions += int(done_in.sum())
        if self.slo_s is None and not self.has_deadlines:
            return
        arrival = arrival_s[ok_any]
        latency = finish - arrival
        if deadline_s is not None:
            budget = deadline_s[ok_any] - arrival
            met = latency <= budget * (1 + 1e-12)
        else:
            met = latency <= (self.slo_s if self.slo_s is not None else math.inf)
        self.good += int(np.sum(done_in & met))

    def _in_system(self, arrival_s: np.ndarray, finish_s: np.ndarray, end_s: float) -> None:
        """Add each request's time in the system (arrival to its terminal time; the stop
        time when in flight) that falls inside the window, in chunks.
        """
        total = 0.0
        for a in range(0, arrival_s.size, CHUNK):
            overlap = np.where(np.isnan(finish_s[a:a + CHUNK]), end_s, finish_s[a:a + CHUNK])
            np.minimum(overlap, self.hi_s, out=overlap)
            overlap -= np.maximum(arrival_s[a:a + CHUNK], self.lo_s)
            np.clip(overlap, 0.0, None, out=overlap)
            total += float(np.sum(overlap))
        self.in_system_s += total

    def _by_class(self, arrival_s: np.ndarray, start_s: np.ndarray, finish_s: np.ndarray,
                  status: np.ndarray, deadline_s: np.ndarray | None, klass: np.ndarray,
                  end_s: float) -> None:
        assert self.classes is not None
        names, codes = np.unique(klass, return_inverse=True)
        for i, name in enumerate(names):
            if name == "":
                continue
            fold = self.classes.get(str(name))
            if fold is None:
                fold = self.classes[str(name)] = RequestFold(self.lo_s, self.hi_s, self.slo_s,
                                                             self.has_deadlines,
                                                             binned=self.binned)
            rows = codes == i
            fold.add(arrival_s[rows], start_s[rows], finish_s[rows], status[rows],
                     None if deadline_s is None else deadline_s[rows], end_s=end_s)


class BatchFold:
    """Per-batch statistics: batches that start in the window, their sizes, and each
    replica's busy time (the union of its batch intervals inside the window; a batch still
    running counts up to ``hi_s``).
    """

    def __init__(self, lo_s: float, hi_s: float, replicas: int) -> None:
        self.lo_s, self.hi_s = lo_s, hi_s
        self.n = 0
        self.size_sum = 0
        self.items_sum = 0
        self.size_hist: dict[int, int] = {}
        self.busy_s = [0.0] * replicas
        self._reach_s = [lo_s] * replicas  # the latest finish of the batches folded so far

    def add(self, start_s: np.ndarray, finish_s: np.ndarray, replica: np.ndarray,
            size: np.ndarray, items: np.ndarray) -> None:
        """Fold a chunk of batches (after every batch that started before them)."""
        if start_s.size == 0:
            return
        win = start_s >= self.lo_s
        n = int(win.sum())
        if n:
            b_size = size[win] if n < size.size else size
            self.n += n
            self.size_sum += int(b_size.sum(dtype=np.int64))
            self.items_sum += int((items[win] if n < items.size else items).sum(dtype=np.int64))
            values, counts = np.unique(b_size, return_counts=True)
            for v, c in zip(values.tolist(), counts.tolist(), strict=True):
                self.size_hist[v] = self.size_hist.get(v, 0) + c
        self.add_busy_by_replica(start_s, finish_s, replica)

    def add_busy_by_replica(self, start_s: np.ndarray, finish_s: np.ndarray,
                            replica: np.ndarray) -> None:
        """Add the busy time of a chunk of intervals (batches, engine steps) on the replicas
        ``replica`` names (after every interval that started before them).
        """
        if len(self.busy_s) == 1 and not bool(np.any(replica)):
            self.add_busy(0, start_s, finish_s)
            return
        for r in range(len(self.busy_s)):
            mine = replica == r
            if mine.any():
                self.add_busy(r, start_s[mine], finish_s[mine])

    def add_busy(self, r: int, start_s: np.ndarray, finish_s: np.ndarray) -> None:
        """Add replica ``r``'s busy time from its batches in this chunk (after those that
        started before them).
        """
        lo, hi = self.lo_s, self.hi_s
        if not bool(np.all(start_s[1:] >= start_s[:-1])):
            order = np.argsort(start_s, kind="stable")
            start_s, finish_s = start_s[order], finish_s[order]
        total, reach = self.busy_s[r], self._reach_s[r]
        for a in range(0, start_s.size, CHUNK):
            start = np.clip(start_s[a:a + CHUNK], lo, hi)
            finish = np.where(np.isnan(finish_s[a:a + CHUNK]), hi, finish_s[a:a + CHUNK])
            np.clip(finish, lo, hi, out=finish)
            covered = np.empty_like(finish)  # per batch: the time covered by those before it
            covered[0] = reach
            np.maximum.accumulate(finish[:-1], out=covered[1:])
            np.maximum(covered[1:], reach, out=covered[1:])
            reach = max(reach, float(finish.max()))
            np.maximum(start, covered, out=covered)
            np.subtract(finish, covered, out=covered)
            np.maximum(covered, 0.0, out=covered)
            total += float(np.sum(covered))
        self.busy_s[r], self._reach_s[r] = total, reach


class StepFold:
    """A step function (the total queue length) over the window ``[lo_s, hi_s]``: its
    time-weighted mean, p95 and max, and its mean over ``segments`` equal parts (the trend).

    It is fed ``(times, values)`` rows in time order: row ``i`` holds ``values[i]`` from
    ``times[i]`` to the next row's time (the last one until ``hi_s``); before the first row
    the value is 0. Pieces that hold for no time (several rows at one instant) do not count.
    """

    def __init__(self, lo_s: float, hi_s: float, segments: int) -> None:
        self.lo_s, self.hi_s = lo_s, hi_s
        self.edges = np.linspace(lo_s, hi_s, segments + 1)
        self.segment_area = np.zeros(segments)
        self.area = 0.0
        self.top = -math.inf
        self.hist: np.ndarray = np.zeros(1)  # seconds at each length
        self._t: float = -math.inf  # the row in force, not yet folded (its end is unknown)
        self._v: float = 0.0
        self.rows = 0

    def add(self, times: np.ndarray, values: np.ndarray) -> None:
        """Fold a chunk of rows (after every earlier row)."""
        n = times.size
        if n == 0:
            return
        self.rows += n
        for a in range(0, n, CHUNK):
            b = min(a + CHUNK, n)
            begin = np.empty(b - a + 1)
            begin[0], begin[1:] = self._t, times[a:b]
            level = np.empty(b - a + 1)
            level[0], level[1:] = self._v, values[a:b]
            # pieces [begin[i], begin[i+1]) at level[i]; the last row stays in force
            self._pieces(begin[:-1], begin[1:], level[:-1])
            self._t, self._v = float(begin[-1]), float(level[-1])

    def close(self) -> None:
        """Fold the row in force, up to ``hi_s`` (call once, after the last chunk)."""
        self._pieces(np.array([self._t]), np.array([max(self._t, self.hi_s)]),
                     np.array([self._v]))
        self._t = math.inf

    def _pieces(self, begin_s: np.ndarray, end_s: np.ndarray, level: np.ndarray) -> None:
        lo, hi = self.lo_s, self.hi_s
        width = np.minimum(end_s, hi) - np.maximum(begin_s, lo)
        held = width > 0
        if not held.any():
            return
        width, level = width[held], level[held]
        begin_s, end_s = begin_s[held], end_s[held]
        self.area += float(np.sum(level * width))
        self.top = max(self.top, float(level.max()))
        counts: np.ndarray = np.bincount(level.astype(np.intp), weights=width)
        if counts.size > self.hist.size:
            counts[:self.hist.size] += self.hist
            self.hist = counts
        else:
            self.hist[:counts.size] += counts
        edges = self.edges
        for k in range(self.segment_area.size):
            a, b = np.searchsorted(end_s, edges[k], side="right"), \
                np.searchsorted(begin_s, edges[k + 1], side="left")
            if a >= b:
                continue
            part = np.minimum(end_s[a:b], edges[k + 1]) - np.maximum(begin_s[a:b], edges[k])
            np.maximum(part, 0.0, out=part)
            area = level[a:b] * part  # summed in order (bincount), as a running sum would
            self.segment_area[k] += float(np.bincount(np.zeros(area.size, dtype=np.intp),
                                                      weights=area, minlength=1)[0])

    def stats(self) -> dict[str, float]:
        """Time-weighted mean, p95 and max over the window (NaN for an empty window)."""
        span = self.hi_s - self.lo_s
        if span <= 0 or self.rows == 0:
            return {"mean": math.nan, "p95": math.nan, "max": math.nan}
        # time-weighted p95 of an integer length: the first length whose share reaches 95%
        share = np.cumsum(self.hist)
        share /= share[-1]
        return {"mean": self.area / span, "p95": float(np.searchsorted(share, 0.95)),
                "max": self.top}

    def segment_means(self) -> np.ndarray:
        """Time-weighted mean over each of the window's equal parts."""
        return self.segment_area / np.diff(self.edges)


class QueueFold:
    """The total queue length over all queues from the queue series ``(time_s, queue,
    length)`` (rows in time order), folded by a :class:`StepFold`.
    """

    def __init__(self, lo_s: float, hi_s: float, segments: int) -> None:
        self.steps = StepFold(lo_s, hi_s, segments)
        self._last: dict[int, int] = {}  # each queue's latest length
        self._total = 0

    def add(self, time_s: np.ndarray, queue: np.ndarray, length: np.ndarray) -> None:
        """Fold a chunk of the queue series."""
        if time_s.size == 0:
            return
        only = int(queue[0])
        if set(self._last) <= {only} and not bool(np.any(queue != only)):
            self.steps.add(time_s, length)  # one queue so far: the total is its length
            self._last[only], self._total = int(length[-1]), int(length[-1])
            return
        delta = np.empty(length.size, dtype=np.int64)
        for q in np.unique(queue).tolist():
            rows = np.flatnonzero(queue == q)
            mine = length[rows].astype(np.int64)
            delta[rows[0]] = mine[0] - self._last.get(q, 0)
            delta[rows[1:]] = np.diff(mine)
            self._last[q] = int(mine[-1])
        total = np.cumsum(delta) + self._total
        self._total = int(total[-1])
        self.steps.add(time_s, total)

    def close(self) -> None:
        """Fold the last value (call once)."""
        self.steps.close()


CHUNK = 1 << 18  # rows per chunk where a statistic is taken in chunks


def stats_ms(values_s: np.ndarray | BinnedSamples, censored: int | None = None, *,
             scratch: bool = False) -> dict[str, Any]:
    """Mean, percentiles (numpy's linear) and max in ms (``scratch``: ``values_s`` may be
    overwritten, which saves two copies of a long run's largest arrays). Of a sketch: mean
    and max exact (up to the order of the sum), percentiles within
    :data:`SKETCH_REL_ERROR` or :data:`SKETCH_FLOOR_S`.
    """
    out: dict[str, Any]
    if len(values_s) == 0:
        out = dict.fromkeys(("mean", *PERCENTILES, "max"), math.nan)
    else:
        if isinstance(values_s, BinnedSamples):
            out = {"mean": values_s.sum_s * 1e3 / values_s.n}
            top = values_s.max_s * 1e3
            q = [v * 1e3 for v in values_s.percentiles_s(list(PERCENTILES.values()))]
        else:
            ms = np.multiply(values_s, 1e3, out=values_s if scratch else None)
            out = {"mean": float(ms.mean())}
            top = float(ms.max())
            q = np.percentile(ms, list(PERCENTILES.values()), overwrite_input=scratch).tolist()
        out.update(zip(PERCENTILES, q, strict=True))
        out["max"] = top
    if censored is not None:
        out["censored"] = censored
    return out


PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}
