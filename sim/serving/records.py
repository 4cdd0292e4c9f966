"""Columnar records of a run: requests, batches and the queue-length step function.

Records are kept in typed ``array.array`` columns (a few bytes per request, no Python object
per request kept alive) and turned into pandas DataFrames at the boundary. Both drivers write
them through :class:`sim.serving.core.ServingCore`, so sim and live tables have the same shape.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np
import pandas as pd

from sim.serving.types import QUEUED, STATUS_CATEGORIES, STATUS_NAMES, count_codes

# Column types: sizes, items, counts and ids in 64 bits (a request's size may be up to
# sim.scenario.MAX_COUNT, and a batch's items sum them); replica and queue numbers in 16.
SIZE = "q"
BATCH_ID = "q"
REPLICA = "h"
CLIENT = "q"
_STATUS_CATEGORY = np.array([0, 1, 2, 3, 4, 5, 0], dtype=np.int8)  # code -> category


def _column(code: str, values: np.ndarray | None, n: int, fill: float) -> array:  # type: ignore[type-arg]
    col: array = array(code)  # type: ignore[type-arg]
    if values is not None:
        col.frombytes(np.ascontiguousarray(values, dtype=np.dtype(code)).view(np.uint8))  # type: ignore[arg-type]
    else:
        col.frombytes(np.full(n, fill, dtype=np.dtype(code)).view(np.uint8))  # type: ignore[arg-type]
    return col


_CONSTANTS: dict[tuple[str, int, int], array] = {}  # type: ignore[type-arg]


def constant(code: str, value: int, n: int) -> array:  # type: ignore[type-arg]
    """``n`` copies of ``value`` as a column of type ``code`` (to compare with or assign to a
    slice); short ones are cached, as the hot path asks for the same few again and again.
    """
    key = (code, value, n)
    block = _CONSTANTS.get(key)
    if block is None:
        block = array(code, (value,)) * n
        if n <= 256:  # batch and arrival-run sizes; long ones are rare and would bloat it
            _CONSTANTS[key] = block
    return block


def view(col: array, n: int) -> np.ndarray:  # type: ignore[type-arg]
    """The first ``n`` values of a record column as a numpy array sharing its memory."""
    return np.frombuffer(col, dtype=np.dtype(col.typecode), count=n) if n else \
        np.empty(0, dtype=np.dtype(col.typecode))


class Discarded:
    """A column that a summary-only run does not keep: writes go nowhere."""

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, value: object) -> None:
        """Keep nothing."""


class Constant:
    """A column whose every value is the same (a summary-only run's unit sizes, zero
    priorities, no deadlines): reads give the value, nothing is stored per request.
    """

    def __init__(self, value: float) -> None:
        self.value = value

    def __getitem__(self, key: int) -> float:
        return self.value


class NoReasons(dict[int, str]):
    """The reasons of a summary-only run: not kept (the summary counts statuses)."""

    def __setitem__(self, key: int, value: str) -> None:
        pass


RECORDS = ("full", "summary", "sketch")
LEAN_RECORDS = ("summary", "sketch")  # modes that keep only what the summary needs


class RequestTable:
    """Per-request columns, indexed by request id (ids are dense, in arrival order).

    Open-loop runs preload the whole arrival schedule; closed-loop runs append as clients send.

    Args:
        arrival_s: Arrival times (open loop), or None for a table that grows.
        size: Items per request (None: one each).
        priority: Priority levels (None: 0).
        deadline_s: Deadlines (None: none).
        klass: Class names (None: no classes).
        records: ``full`` keeps every column; ``summary`` (a run that keeps only what its
            summary needs, :mod:`sim.metrics.summary_sink`) drops the start, finish and batch
            columns, the serving replica where there is one shared queue (``shared``), and
            stores columns of one value as a :class:`Constant`; ``sketch`` keeps the same
            columns as ``summary``.
        shared: The requests wait in one shared queue (nothing reads their replica).
    """

    def __init__(self, arrival_s: np.ndarray | None = None, size: np.ndarray | None = None,
                 priority: np.ndarray | None = None, deadline_s: np.ndarray | None = None,
                 klass: list[str] | None = None, *, records: str = "full",
                 shared: bool = False) -> None:
        n = 0 if arrival_s is None else int(arrival_s.size)
        self.unit_size = size is None or bool(np.all(size == 1))  # every request one item
        lean = records in LEAN_RECORDS
        self.records = records
        self.arrival_s = _column("d", arrival_s, n, 0.0)
        self.size: Any = Constant(1) if lean and n and self.unit_size else \
            _column(SIZE, size, n, 1)
        self.priority: Any = Constant(0) if lean and n and (
            priority is None or not bool(np.any(priority))) else _column("b", priority, n, 0)
        self.deadline_s: Any = Constant(math.inf) if lean and n and deadline_s is None else \
            _column("d", deadline_s, n, math.inf)
        self.start_s: Any = Discarded() if lean else _column("d", None, n, math.nan)
        self.finish_s: Any = Discarded() if lean else _column("d", None, n, math.nan)
        self.batch_id: Any = Discarded() if lean else _column(BATCH_ID, None, n, -1)
        self.replica: Any = Discarded() if lean and shared else _column(REPLICA, None, n, -1)
        self.status = _column("b", None, n, QUEUED)
        self.client: array = array(CLIENT)  # type: ignore[type-arg] # closed loop only
        self.klass = klass
        self.reasons: dict[int, str] = NoReasons() if lean else {}
        self.sink: Any = None  # a summary-only run's sink (told of every request that ends)
        # when a request held at the router (queue.max_ongoing_requests) joined its replica's
        # queue: what a batcher sees as its arrival (only requests that were held)
        self.joined_s: dict[int, float] = {}
        self.held_at_router = False  # such a bound is on: the frame gets a joined_s column
        self.n = n

    def queued_at_s(self, request_id: int) -> float:
        """When a request joined its queue: its arrival, or, held at the router, its release
        (``joined_s``; what a batcher sees as its arrival).
        """
        if self.joined_s:
            joined = self.joined_s.get(request_id)
            if joined is not None:
                return joined
        return float(self.arrival_s[request_id])

    def append(self, arrival_s: float, size: int, priority: int, deadline_s: float,
               client: int) -> int:
        """Add one request (closed loop: tables that start empty) and return its id."""
        self.arrival_s.append(arrival_s)
        self.size.append(size)
        if size != 1:
            self.unit_size = False
        self.priority.append(priority)
        self.deadline_s.append(deadline_s)
        self.start_s.append(math.nan)
        self.finish_s.append(math.nan)
        self.batch_id.append(-1)
        self.replica.append(-1)
        self.status.append(QUEUED)
        self.client.append(client)
        self.n += 1
        return self.n - 1

    def status_counts(self, upto: int | None = None) -> dict[str, int]:
        """Requests per status name over the first ``upto`` ids (all when None)."""
        codes = view(self.status, self.n if upto is None else upto)
        counts = count_codes(codes, 7)
        out: dict[str, int] = dict.fromkeys(STATUS_NAMES.values(), 0)
        for code, name in STATUS_NAMES.items():
            out[name] += int(counts[code])
        return out

    def to_frame(self, upto: int | None = None) -> pd.DataFrame:
        """The request table (see design: id, arrival_s, start_s, finish_s, ...).

        Numeric columns share memory with the records (no copy): call it once the run is
        over, as the records cannot grow while a frame looks at them.
        """
        n = self.n if upto is None else upto
        # categorical columns: one byte per request instead of a Python string each
        status = pd.Categorical.from_codes(_STATUS_CATEGORY[view(self.status, n)],
                                           pd.Index(STATUS_CATEGORIES))
        reason_names = sorted(set(self.reasons.values()))
        reason_codes: np.ndarray = np.zeros(
            n, dtype=np.int8 if len(reason_names) < 127 else np.int16)
        lookup = {name: i + 1 for i, name in enumerate(reason_names)}
        for rid, text in self.reasons.items():
            if rid < n:
                reason_codes[rid] = lookup[text]
        columns: dict[str, Any] = {
            "id": np.arange(n, dtype=np.int64),
            "arrival_s": view(self.arrival_s, n),
            "start_s": view(self.start_s, n),
            "finish_s": view(self.finish_s, n),
            "batch_id": view(self.batch_id, n),
            "replica": view(self.replica, n),
            "status": status,
            "reason": pd.Categorical.from_codes(reason_codes, pd.Index(["", *reason_names])),
            "size": view(self.size, n),
            "priority": view(self.priority, n),
            "deadline_s": view(self.deadline_s, n),
        }
        if self.held_at_router:  # when each request joined its replica's queue
            joined = np.array(view(self.arrival_s, n), dtype=np.float64)
            for rid, at_s in self.joined_s.items():
                if rid < n:
                    joined[rid] = at_s
            columns["joined_s"] = joined
        if self.klass is not None:
            columns["klass"] = self.klass[:n]
        if len(self.client):
            columns["client"] = view(self.client, n)
        return pd.DataFrame(columns, copy=False)


class BatchTable:
    """Per-batch columns: batch_id, replica, start_s, finish_s, size, items, failed.

    A summary-only run folds and drops its oldest finished rows (:meth:`drop_first`): the
    table then holds the batches from id ``base`` on.
    """

    def __init__(self) -> None:
        self.replica = array(REPLICA)
        self.start_s = array("d")
        self.finish_s = array("d")
        self.size = array(SIZE)
        self.items = array(SIZE)
        self.failed = array("b")
        self.base = 0  # id of the first row kept

    @property
    def next_id(self) -> int:
        """The id the next batch will get."""
        return self.base + len(self.start_s)

    def open(self, replica: int, start_s: float, size: int, items: int) -> int:
        """Record a batch start; returns its id (finish filled in by :meth:`close`)."""
        self.replica.append(replica)
        self.start_s.append(start_s)
        self.finish_s.append(math.nan)
        self.size.append(size)
        self.items.append(items)
        self.failed.append(0)
        return self.base + len(self.start_s) - 1

    def close(self, batch_id: int, finish_s: float, failed: bool) -> None:
        """Record a batch's end."""
        self.finish_s[batch_id - self.base] = finish_s
        self.failed[batch_id - self.base] = 1 if failed else 0

    def mark_failed(self, batch_id: int) -> None:
        """Mark a batch failed before it ends (its requests failed while it still runs)."""
        self.failed[batch_id - self.base] = 1

    def drop_first(self, n: int) -> None:
        """Forget the first ``n`` rows (folded already). The columns are replaced, not
        resized: a numpy view of the old ones may still be alive (a frame that a profiler
        holds), and an array with a view cannot be resized.
        """
        self.replica, self.start_s, self.finish_s = (self.replica[n:], self.start_s[n:],
                                                     self.finish_s[n:])
        self.size, self.items, self.failed = self.size[n:], self.items[n:], self.failed[n:]
        self.base += n

    def to_frame(self) -> pd.DataFrame:
        """The batch table (numeric columns share memory with the records, as
        :meth:`RequestTable.to_frame`).
        """
        n = len(self.start_s)
        return pd.DataFrame({
            "batch_id": np.arange(n, dtype=np.int64),
            "replica": view(self.replica, n),
            "start_s": view(self.start_s, n),
            "finish_s": view(self.finish_s, n),
            "size": view(self.size, n),
            "items": view(self.items, n),
            "failed": view(self.failed, n).view(np.bool_),
        }, copy=False)


class QueueSeries:
    """Queue length as a step function: one row per change, ``(time_s, queue, length)``.

    ``queue`` is 0 for a shared queue, else the replica index that owns the queue.
    """

    def __init__(self) -> None:
        self.time_s = array("d")
        self.queue = array(REPLICA)
        self.length = array(SIZE)

    def record(self, time_s: float, queue: int, length: int) -> None:
        """Append one change."""
        self.time_s.append(time_s)
        self.queue.append(queue)
        self.length.append(length)

    def record_run(self, times_s: array, queue: int, first_length: int) -> None:  # type: ignore[type-arg]
        """Append consecutive arrivals: lengths ``first_length, first_length + 1, ...``."""
        n = len(times_s)
        self.time_s.extend(times_s)
        self.queue.extend(constant(REPLICA, queue, n))
        self.length.extend(range(first_length, first_length + n))

    def clear(self) -> None:
        """Forget every row (folded already); new columns, as in
        :meth:`BatchTable.drop_first`.
        """
        self.time_s, self.queue, self.length = array("d"), array(REPLICA), array(SIZE)

    def to_frame(self) -> pd.DataFrame:
        """The queue table (sharing memory with the records)."""
        n = len(self.time_s)
        return pd.DataFrame({
            "time_s": view(self.time_s, n),
            "queue": view(self.queue, n),
            "length": view(self.length, n),
        }, copy=False)
