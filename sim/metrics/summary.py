"""Summary metrics from the record tables (the same code for simulated and live runs).

The measurement window is ``[warmup_s, horizon_s]``: ``horizon_s`` is the workload's
``duration_s`` when it has one, else the last arrival (a stopped live run: the stop time).
A run may go on after the horizon to drain its queue; ``end_s`` is when it stopped.

* throughput = ok requests that *finish* inside the window / window length: what a load
  tester reports; under overload it is the capacity, never the offered load;
* offered = arrivals in the window / window length;
* goodput = those completions whose latency met ``slo_s`` / window length (None without an
  SLO: it is not the throughput);
* latency = finish − arrival, queue wait = start − arrival, service = finish − start: mean,
  p50, p90, p95, p99, p99.9, max (numpy's default linear percentiles) over the requests that
  *arrive* in the window and end ok. Requests still unfinished when the run stopped are
  *censored*: latency and queue wait count them with ``end_s`` as their finish (a lower
  bound), and each of those stats says how many (``censored``);
* error rate (total and per cause) = non-ok terminal outcomes / arrivals in the window;
* batch size (requests and items) over the batches that *start* in the window, batch
  utilisation = mean batch / max batch size;
* device utilisation = busy time / (window × replicas), busy time counted per replica as the
  union of its batch intervals;
* queue length: time-weighted mean, p95 and max of the total over all queues;
* requests in system: time-weighted mean over the window, with Little's law as a check
  (``littles_law``: in-system mean against throughput × mean latency);
* stability: see :mod:`sim.metrics.stability`;
* cost per million ok requests from a price per replica-hour, over the replica-seconds held in
  the window (replicas × window for a fixed fleet; the integral of the replica count, cold
  starts and draining included, for an autoscaled one).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sim.metrics.folds import (
    PERCENTILES,
    BatchFold,
    QueueFold,
    RequestFold,
    stats_ms,
)
from sim.metrics.stability import TREND_SEGMENTS, Trend, trend_of, unmeasurable, verdict
from sim.metrics.window import Window
from sim.serving.fleet import fleet_summary
from sim.serving.types import ERROR_CAUSES, STATUS_CATEGORIES

__all__ = [
    "PERCENTILES",
    "busy_s",
    "fold_batches",
    "fold_queue",
    "fold_requests",
    "in_system_mean",
    "ok_latency_s",
    "ok_requests",
    "queue_length_stats",
    "queue_trend",
    "status_codes",
    "status_is",
    "summarize",
    "summary_from_folds",
]

_stats_ms = stats_ms  # (the LLM summary's name for it)


def _floats(col: pd.Series) -> np.ndarray:
    """A float column as numpy (no copy when it already is float64; NA as NaN)."""
    if col.dtype == np.float64:
        return col.to_numpy()
    return col.to_numpy(dtype=float, na_value=np.nan)


_CATEGORIES = STATUS_CATEGORIES


def status_codes(requests: pd.DataFrame) -> np.ndarray:
    """The status column as category codes (0 in flight, 1 ok, 2 rejected, 3 timed out,
    4 dropped, 5 failed): the categorical codes themselves when they are in that order.
    """
    col = requests["status"]
    if isinstance(col.dtype, pd.CategoricalDtype) and list(col.cat.categories) == _CATEGORIES:
        codes: np.ndarray = col.cat.codes.to_numpy()
        return codes
    names = col.astype(str).to_numpy()
    out = np.full(names.size, -1, dtype=np.int8)
    for code, name in enumerate(_CATEGORIES):
        out[names == name] = code
    if bool(np.any(out < 0)):
        bad = sorted(set(names[out < 0].tolist()))
        raise ValueError(f"status: unknown values {bad}; allowed: {_CATEGORIES}")
    return out


def status_is(requests: pd.DataFrame, name: str) -> np.ndarray:
    """Boolean mask of the requests whose status is ``name``."""
    mask: np.ndarray = status_codes(requests) == _CATEGORIES.index(name)
    return mask


def _stop_s(window: Window) -> float:
    """When the run stopped (the horizon when it drained everything)."""
    return window.end_s if math.isfinite(window.end_s) else window.horizon_s


def fold_requests(requests: pd.DataFrame, window: Window) -> RequestFold:
    """The request statistics of a finished run's table (one chunk)."""
    fold = RequestFold(window.warmup_s, window.horizon_s, window.slo_s, window.has_deadlines,
                       classes="klass" in requests)
    fold.add(requests["arrival_s"].to_numpy(), _floats(requests["start_s"]),
             _floats(requests["finish_s"]), status_codes(requests),
             requests["deadline_s"].to_numpy() if "deadline_s" in requests else None,
             requests["klass"].to_numpy() if "klass" in requests else None,
             end_s=_stop_s(window), keep=True)
    return fold


def fold_batches(batches: pd.DataFrame, lo_s: float, hi_s: float,
                 replicas: int) -> BatchFold:
    """The batch statistics of a batch table (any row order)."""
    fold = BatchFold(lo_s, hi_s, replicas)
    start = batches["start_s"].to_numpy()
    if start.size and not bool(np.all(start[1:] >= start[:-1])):
        batches = batches.iloc[np.argsort(start, kind="stable")]
    fold.add(batches["start_s"].to_numpy(), _floats(batches["finish_s"]),
             batches["replica"].to_numpy(), batches["size"].to_numpy(),
             batches["items"].to_numpy())
    return fold


def fold_queue(queue: pd.DataFrame, lo_s: float, hi_s: float,
               segments: int = TREND_SEGMENTS) -> QueueFold:
    """The queue-length statistics of a queue series (sorted by time first if need be)."""
    fold = QueueFold(lo_s, hi_s, segments)
    times = queue["time_s"].to_numpy()
    if times.size and not bool(np.all(times[1:] >= times[:-1])):
        queue = queue.sort_values("time_s", kind="stable")
    fold.add(queue["time_s"].to_numpy(), queue["queue"].to_numpy(),
             queue["length"].to_numpy())
    fold.close()
    return fold


def queue_trend(queue: pd.DataFrame, lo_s: float, hi_s: float,
                segments: int = TREND_SEGMENTS) -> Trend:
    """The queue's trend over [lo, hi] from a queue series (:func:`trend_of` its fold)."""
    if queue.empty or hi_s <= lo_s:
        return Trend(math.nan, math.nan, math.nan)
    return trend_of(fold_queue(queue, lo_s, hi_s, segments).steps)


def busy_s(batches: pd.DataFrame, replica: int, lo_s: float, hi_s: float) -> float:
    """Seconds replica ``replica`` was busy inside [lo, hi] (union of its batch intervals;
    batches still running count up to ``hi_s``).
    """
    mine = batches["replica"].to_numpy() == replica
    fold = BatchFold(lo_s, hi_s, 1)
    fold.add_busy(0, batches["start_s"].to_numpy()[mine], _floats(batches["finish_s"])[mine])
    return fold.busy_s[0]


def queue_length_stats(queue: pd.DataFrame, lo_s: float, hi_s: float) -> dict[str, float]:
    """Time-weighted mean, p95 and max of the total queue length over [lo, hi]."""
    if queue.empty or hi_s <= lo_s:
        return {"mean": math.nan, "p95": math.nan, "max": math.nan}
    return fold_queue(queue, lo_s, hi_s).steps.stats()


def in_system_mean(requests: pd.DataFrame, lo_s: float, hi_s: float, end_s: float) -> float:
    """Time-mean number of requests in the system (queued or running) over [lo, hi].

    A request is in the system from its arrival to its terminal time (finish, rejection,
    expiry, drop); one still unfinished counts until ``end_s``.
    """
    if hi_s <= lo_s or requests.empty:
        return math.nan
    fold = RequestFold(lo_s, hi_s)
    fold._in_system(requests["arrival_s"].to_numpy(), _floats(requests["finish_s"]), end_s)
    return fold.in_system_s / (hi_s - lo_s)


def ok_requests(requests: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """The ok requests that arrived in the measurement window (after ``warmup_s``): the rows
    behind every latency statistic (summary, batch means, reports, dashboard figures).
    """
    rows: pd.DataFrame = requests[(requests["arrival_s"].to_numpy() >= warmup_s)
                                  & status_is(requests, "ok")]
    return rows


def ok_latency_s(requests: pd.DataFrame, warmup_s: float) -> np.ndarray:
    """Latency (s) of :func:`ok_requests`, in request order."""
    ok = ok_requests(requests, warmup_s)
    return (ok["finish_s"] - ok["arrival_s"]).to_numpy()


def summarize(requests: pd.DataFrame, batches: pd.DataFrame, queue: pd.DataFrame,
              window: Window, driver: str,
              fleet: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> dict[str, Any]:
    """The run summary of a finished run's tables (keys as in the README's metrics table);
    ``fleet`` (the replica series and fleet events of an autoscaled run) adds the
    autoscaling metrics, and makes utilisation and cost count the replica-seconds the fleet
    really held.
    """
    lo, hi = window.warmup_s, window.horizon_s
    requests_fold = fold_requests(requests, window)
    scaling = None
    if fleet is not None:
        ok = (requests["arrival_s"].to_numpy() >= lo) & status_is(requests, "ok")
        scaling = fleet_summary(requests, fleet[0], fleet[1], lo, hi,
                                requests_fold.values("latency"), ok)
    return summary_from_folds(requests_fold, fold_batches(batches, lo, hi, window.replicas),
                              fold_queue(queue, lo, hi), window, driver, scaling)


def _latency_stats(fold: RequestFold) -> tuple[dict[str, Any], float]:
    """Latency stats (censored requests last, with the stop time as their finish) and the
    mean latency (s) of the ok requests alone; the fold's samples are used up.
    """
    if fold.binned:
        sketch = fold.latency_s
        return (stats_ms(sketch.merged(fold.censored_latency_s), fold.censored),
                sketch.mean_s())
    latency = fold.values("latency")
    mean_latency_s = float(latency.mean()) if latency.size else math.nan
    if len(fold.censored_latency_s):
        latency = np.concatenate((latency, fold.censored_latency_s.view()))
    return stats_ms(latency, fold.censored, scratch=True), mean_latency_s


def _wait_stats(fold: RequestFold) -> dict[str, Any]:
    if fold.binned:
        return stats_ms(fold.wait_s.merged(fold.censored_wait_s), fold.censored)
    wait = fold.values("wait")
    if len(fold.censored_wait_s):
        wait = np.concatenate((wait, fold.censored_wait_s.view()))
    return stats_ms(wait, fold.censored, scratch=True)


def summary_from_folds(requests: RequestFold, batches: BatchFold, queue: QueueFold,
                       window: Window, driver: str,
                       scaling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run summary from its folded statistics (the folds' samples are used up);
    ``scaling``: the autoscaling metrics of an autoscaled run.
    """
    span = window.length_s
    arrivals = requests.arrivals
    counts_all = dict(zip(_CATEGORIES, requests.counts.tolist(), strict=True))
    counts = {cause: counts_all.get(cause, 0) for cause in ERROR_CAUSES}
    errors = sum(counts.values())
    per_s = window.per_s
    completions = requests.completions
    good = requests.good if (window.slo_s is not None or window.has_deadlines) else None
    censored = requests.censored
    ok_n = int(requests.counts[1])
    latency_ms, mean_latency_s = _latency_stats(requests)
    queue_ms = _wait_stats(requests)
    service_ms = stats_ms(requests.service_s if requests.binned else
                          requests.values("service"), scratch=True)
    n_batches = batches.n
    mean_batch = batches.size_sum / n_batches if n_batches else math.nan
    throughput = completions * per_s
    offered = arrivals * per_s
    util, utilization, scaling = utilization_of(batches, window, scaling)
    held_s = float(scaling["replica_seconds"])
    cost = cost_per_million_usd(window.price_per_replica_hour, held_s, completions)
    in_system = requests.in_system_s / span if span > 0 and requests.rows else math.nan
    little = throughput * mean_latency_s
    steps = queue.steps
    stability = verdict(offered_rps=offered, capacity=window.capacity_rps,
                        utilization=utilization, trend=trend_of(steps),
                        window_s=span, closed_loop=window.closed_loop, bounded=window.bounded)
    stability = unmeasurable(stability, arrivals=arrivals, ok=ok_n, completions=completions,
                             in_flight=counts_all["in_flight"], window_s=span, ended=counts)
    return {
        "driver": driver,
        "requests": arrivals,
        "ok": ok_n,
        **counts,
        "in_flight": counts_all["in_flight"],
        "censored": censored,
        "completions": completions,
        "window_s": span,
        "offered_rps": offered,
        "throughput_rps": throughput,
        "goodput_rps": None if good is None else good * per_s,
        "error_rate": errors / arrivals if arrivals else math.nan,
        "error_rate_by_cause": {c: (n / arrivals if arrivals else math.nan)
                                for c, n in counts.items()},
        "latency_ms": latency_ms,
        "queue_ms": queue_ms,
        "service_ms": service_ms,
        "batches": n_batches,
        "mean_batch_size": mean_batch,
        "mean_batch_items": batches.items_sum / n_batches if n_batches else math.nan,
        "batch_size_hist": {str(k): v for k, v in sorted(batches.size_hist.items())},
        "batch_utilization": mean_batch / window.max_batch_size if n_batches else math.nan,
        "utilization": utilization,
        "utilization_per_replica": [float(u) for u in util],
        "queue_len": steps.stats() if span > 0 else
        {"mean": math.nan, "p95": math.nan, "max": math.nan},
        "in_system_mean": in_system,
        "littles_law": {"in_system_mean": in_system, "throughput_x_latency": little,
                        "rel_gap": (in_system - little) / little if little else math.nan},
        "stability": stability,
        "cost_per_million_usd": math.nan if cost is None else cost,
        **scaling,
        **({"classes": _class_summaries(requests, window)}
           if requests.classes is not None else {}),
    }


def utilization_of(batches: BatchFold, window: Window, scaling: dict[str, Any] | None,
                   ) -> tuple[np.ndarray, float, dict[str, Any]]:
    """Device utilisation (the one definition, for requests and LLM engines alike): each
    replica's busy time (:class:`BatchFold`) over the window, their mean for a fixed fleet;
    for an autoscaled one (``scaling``: its metrics) the busy time over the replica-seconds
    held.

    Returns:
        The per-replica utilisation, the utilisation, and the scaling metrics (a fixed fleet's:
        ``window.replicas`` × window replica-seconds, no cold starts).
    """
    span = window.length_s
    busy = np.array(batches.busy_s)
    util = busy / span if span > 0 else np.full(busy.size, math.nan)
    if scaling is not None:
        held_s = float(scaling["replica_seconds"])
        return util, float(busy.sum() / held_s) if held_s > 0 else math.nan, scaling
    fixed = {"replica_seconds": window.replicas * span, "cold_starts": 0,
             "cold_start_waits": 0}
    return util, float(util.mean()) if util.size else math.nan, fixed


def cost_per_million_usd(price_per_replica_hour: float, held_s: float,
                         completions: int) -> float | None:
    """Cost per million completions: the replica-seconds held, at a price per replica-hour
    (None without a price or without completions).
    """
    if price_per_replica_hour <= 0 or completions <= 0:
        return None
    return price_per_replica_hour * held_s / 3600.0 / completions * 1e6


def _class_summaries(fold: RequestFold, window: Window) -> dict[str, dict[str, Any]]:
    """Per request class: arrivals, ok, completions, throughput, goodput, error rate and
    latency (as in the summary, over that class's requests).
    """
    per_s = window.per_s
    out: dict[str, dict[str, Any]] = {}
    assert fold.classes is not None
    for name in sorted(fold.classes):
        klass = fold.classes[name]
        n = klass.arrivals
        counts = dict(zip(_CATEGORIES, klass.counts.tolist(), strict=True))
        good = klass.good if (window.slo_s is not None or window.has_deadlines) else None
        out[name] = {
            "requests": n, "ok": counts["ok"], "completions": klass.completions,
            "throughput_rps": klass.completions * per_s,
            "goodput_rps": None if good is None else good * per_s,
            "error_rate": sum(counts[c] for c in ERROR_CAUSES) / n if n else math.nan,
            "error_rate_by_cause": {c: (counts[c] / n if n else math.nan)
                                    for c in ERROR_CAUSES},
            "latency_ms": _latency_stats(klass)[0],
        }
    return out
