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
* stability: see :mod:`sim.stability`;
* cost per million ok requests from a price per replica-hour, over the replica-seconds held in
  the window (replicas × window for a fixed fleet; the integral of the replica count, cold
  starts and draining included, for an autoscaled one).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sim.fleet import fleet_summary
from sim.stability import queue_trend, time_weighted_total, verdict
from sim.types import ERROR_CAUSES
from sim.window import Window

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def _stats_ms(values_s: np.ndarray, censored: int | None = None, *,
              scratch: bool = False) -> dict[str, Any]:
    """Mean, percentiles and max in ms (``scratch``: ``values_s`` may be overwritten, which
    saves two copies of a long run's largest arrays).
    """
    out: dict[str, Any]
    if values_s.size == 0:
        out = dict.fromkeys(("mean", *PERCENTILES, "max"), math.nan)
    else:
        ms = np.multiply(values_s, 1e3, out=values_s if scratch else None)
        out = {"mean": float(ms.mean())}
        top = float(ms.max())
        q = np.percentile(ms, list(PERCENTILES.values()), overwrite_input=scratch)
        out.update({k: float(v) for k, v in zip(PERCENTILES, q, strict=True)})
        out["max"] = top
    if censored is not None:
        out["censored"] = censored
    return out


def busy_s(batches: pd.DataFrame, replica: int, lo_s: float, hi_s: float) -> float:
    """Seconds replica ``replica`` was busy inside [lo, hi] (union of its batch intervals;
    batches still running count up to ``hi_s``).
    """
    mine = batches["replica"].to_numpy() == replica
    return _busy_s(batches["start_s"].to_numpy()[mine],
                   batches["finish_s"].to_numpy(dtype=float, na_value=np.nan)[mine], lo_s, hi_s)


def _busy_s(start_s: np.ndarray, finish_s: np.ndarray, lo_s: float, hi_s: float) -> float:
    """:func:`busy_s` over one replica's batch starts and finishes (NaN: still running),
    taken in chunks of batches in start order.
    """
    if start_s.size == 0:
        return 0.0
    if not bool(np.all(start_s[1:] >= start_s[:-1])):
        order = np.argsort(start_s, kind="stable")
        start_s, finish_s = start_s[order], finish_s[order]
    total, reach = 0.0, lo_s  # the latest finish of the batches before the chunk
    for a in range(0, start_s.size, _CHUNK):
        start = np.clip(start_s[a:a + _CHUNK], lo_s, hi_s)
        finish = np.where(np.isnan(finish_s[a:a + _CHUNK]), hi_s, finish_s[a:a + _CHUNK])
        np.clip(finish, lo_s, hi_s, out=finish)
        covered = np.empty_like(finish)  # per batch: the time covered by those before it
        covered[0] = reach
        np.maximum.accumulate(finish[:-1], out=covered[1:])
        np.maximum(covered[1:], reach, out=covered[1:])
        reach = max(reach, float(finish.max()))
        np.maximum(start, covered, out=covered)
        np.subtract(finish, covered, out=covered)
        np.maximum(covered, 0.0, out=covered)
        total += float(np.sum(covered))
    return total


def status_is(requests: pd.DataFrame, name: str) -> np.ndarray:
    """Boolean mask of the requests whose status is ``name`` (categorical codes compared
    once, no string per request).
    """
    col = requests["status"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        categories = list(col.cat.categories)
        if name not in categories:
            return np.zeros(len(col), dtype=bool)
        mask: np.ndarray = col.cat.codes.to_numpy() == categories.index(name)
        return mask
    named: np.ndarray = col.astype(str).to_numpy() == name
    return named


def _status_counts(requests: pd.DataFrame, mask: np.ndarray) -> dict[str, int]:
    """Requests per status name among ``mask``."""
    col = requests["status"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy()[mask]
        counts = np.bincount(codes[codes >= 0], minlength=len(col.cat.categories))
        return {str(c): int(n) for c, n in zip(col.cat.categories, counts, strict=True)}
    names, counts = np.unique(col.astype(str).to_numpy()[mask], return_counts=True)
    return {str(c): int(n) for c, n in zip(names, counts, strict=True)}


def queue_length_stats(queue: pd.DataFrame, lo_s: float, hi_s: float,
                       steps: tuple[np.ndarray, np.ndarray] | None = None
                       ) -> dict[str, float]:
    """Time-weighted mean, p95 and max of the total queue length over [lo, hi] (``steps``:
    its :func:`sim.stability.time_weighted_total`, when the caller has it already).
    """
    if queue.empty or hi_s <= lo_s:
        return {"mean": math.nan, "p95": math.nan, "max": math.nan}
    times, total = time_weighted_total(queue) if steps is None else steps
    n_before = int(np.searchsorted(times, lo_s, side="right"))  # times <= lo_s
    start_len = float(total[n_before - 1]) if n_before else 0.0
    stop = max(n_before, int(np.searchsorted(times, hi_s, side="left")))  # lo < t < hi
    # value i holds from times[i] to times[i + 1] (start_len from lo_s, the last until hi_s);
    # taken in chunks so that the temporaries stay small on long runs
    first_s = (times[n_before] if stop > n_before else hi_s) - lo_s  # how long start_len held
    area_sum, top = start_len * first_s, start_len
    hist = np.zeros(int(start_len) + 1)  # seconds at each length
    hist[int(start_len)] = first_s
    for a in range(n_before, stop, _CHUNK):
        b = min(a + _CHUNK, stop)
        values = total[a:b]
        weights = np.empty(b - a)
        np.subtract(times[a + 1:b], times[a:b - 1], out=weights[:-1])
        weights[-1] = (times[b] if b < stop else hi_s) - times[b - 1]
        area_sum += float(np.sum(values * weights))
        held = values[weights > 0]  # a value replaced at its own instant never held
        if held.size:
            top = max(top, float(held.max()))
        counts: np.ndarray = np.bincount(values.astype(np.intp), weights=weights)
        if counts.size > hist.size:
            counts[:hist.size] += hist
            hist = counts
        else:
            hist[:counts.size] += counts
    # time-weighted p95 of an integer length: the first length whose share of time reaches 95%
    share = np.cumsum(hist)
    share /= share[-1]
    p95 = float(np.searchsorted(share, 0.95))
    return {"mean": area_sum / (hi_s - lo_s), "p95": p95, "max": top}


_CHUNK = 1 << 18  # rows per chunk where a statistic is taken in chunks


def _floats(col: pd.Series) -> np.ndarray:
    """A float column as numpy (no copy when it already is float64; NA as NaN)."""
    if col.dtype == np.float64:
        return col.to_numpy()
    return col.to_numpy(dtype=float, na_value=np.nan)


def in_system_mean(requests: pd.DataFrame, lo_s: float, hi_s: float, end_s: float) -> float:
    """Time-mean number of requests in the system (queued or running) over [lo, hi].

    A request is in the system from its arrival to its terminal time (finish, rejection,
    expiry, drop); one still unfinished counts until ``end_s``.
    """
    if hi_s <= lo_s or requests.empty:
        return math.nan
    arrival = requests["arrival_s"].to_numpy()
    leave = _floats(requests["finish_s"])
    total = 0.0
    for a in range(0, arrival.size, _CHUNK):
        overlap = np.where(np.isnan(leave[a:a + _CHUNK]), end_s, leave[a:a + _CHUNK])
        np.minimum(overlap, hi_s, out=overlap)
        overlap -= np.maximum(arrival[a:a + _CHUNK], lo_s)
        np.clip(overlap, 0.0, None, out=overlap)
        total += float(np.sum(overlap))
    return total / (hi_s - lo_s)


def _stop_s(window: Window) -> float:
    """When the run stopped (the horizon when it drained everything)."""
    return window.end_s if math.isfinite(window.end_s) else window.horizon_s


def latency_with_censored_s(ok_latency_s: np.ndarray, pending_arrival_s: np.ndarray,
                            stop_s: float) -> np.ndarray:
    """Latencies (s) of the ok requests, then of the pending (censored) ones with the stop
    time as their finish (lower bounds); ``ok_latency_s`` itself when none is pending.
    """
    if pending_arrival_s.size == 0:
        return ok_latency_s
    return np.concatenate((ok_latency_s, stop_s - pending_arrival_s))


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
    """The run summary (keys as in the README's metrics table); ``fleet`` (the replica
    series and fleet events of an autoscaled run) adds the autoscaling metrics, and makes
    utilisation and cost count the replica-seconds the fleet really held.
    """
    lo, hi, span = window.warmup_s, window.horizon_s, window.length_s
    arrival = requests["arrival_s"].to_numpy()
    start_s, finish_s = _floats(requests["start_s"]), _floats(requests["finish_s"])
    inwin = arrival >= lo
    ok = inwin & status_is(requests, "ok")
    arrivals = int(inwin.sum())
    by_status = _status_counts(requests, inwin)
    counts = {cause: by_status.get(cause, 0) for cause in ERROR_CAUSES}
    errors = sum(counts.values())
    per_s = (1.0 / span) if span > 0 else math.nan
    completions, good = completions_in_window(requests, window)
    # censored: arrived in the window, still queued or running when the run stopped
    pending = inwin & status_is(requests, "in_flight")
    censored = int(pending.sum())
    end_s = _stop_s(window)
    arrival_pending = arrival[pending]
    # one per-request array at a time (the temporaries of a long run are its largest part)
    all_ok = bool(ok.all())
    latency = finish_s - arrival
    if not all_ok:
        latency = latency[ok]
    mean_latency_s = float(latency.mean()) if latency.size else math.nan
    ok_latency = latency.copy() if fleet is not None else None  # (stats overwrite latency)
    latency_ms = _stats_ms(latency_with_censored_s(latency, arrival_pending, end_s), censored,
                           scratch=True)
    del latency
    started = start_s[pending]
    wait_pending = np.where(np.isnan(started), end_s, started) - arrival_pending
    wait_ok = start_s - arrival
    if not all_ok:
        wait_ok = wait_ok[ok]
    queue_ms = _stats_ms(np.concatenate((wait_ok, wait_pending)) if censored else wait_ok,
                         censored, scratch=True)
    del wait_ok
    service = finish_s - start_s
    service_ms = _stats_ms(service if all_ok else service[ok], scratch=True)
    del service
    b_start = batches["start_s"].to_numpy()
    b_finish = _floats(batches["finish_s"])
    b_replica = batches["replica"].to_numpy()
    bwin = b_start >= lo
    n_batches = int(bwin.sum())
    b_size = batches["size"].to_numpy()[bwin]
    mean_batch = float(b_size.mean()) if n_batches else math.nan
    if window.replicas == 1 and not bool(np.any(b_replica)):
        busy = np.array([_busy_s(b_start, b_finish, lo, hi)])
    else:
        busy = np.array([_busy_s(b_start[b_replica == r], b_finish[b_replica == r], lo, hi)
                         for r in range(window.replicas)])
    util = busy / span if span > 0 else np.full(window.replicas, math.nan)
    sizes, size_counts = np.unique(b_size, return_counts=True)
    throughput = completions * per_s
    offered = arrivals * per_s
    if fleet is not None:
        assert ok_latency is not None
        scaling = fleet_summary(requests, fleet[0], fleet[1], lo, hi, ok_latency, ok)
        held_s = float(scaling["replica_seconds"])  # type: ignore[arg-type]
        utilization = float(busy.sum() / held_s) if held_s > 0 else math.nan
    else:
        held_s = window.replicas * span
        scaling = {"replica_seconds": held_s, "cold_starts": 0, "cold_start_waits": 0}
        utilization = float(util.mean()) if util.size else math.nan
    cost = math.nan
    if window.price_per_replica_hour > 0 and completions > 0:
        cost = window.price_per_replica_hour * held_s / 3600.0 / completions * 1e6
    in_system = in_system_mean(requests, lo, hi, end_s)
    queue_steps = time_weighted_total(queue) if not queue.empty else None
    little = throughput * mean_latency_s
    stability = verdict(offered_rps=offered, capacity=window.capacity_rps,
                        utilization=utilization,
                        trend=queue_trend(queue, lo, hi, steps=queue_steps),
                        window_s=span, closed_loop=window.closed_loop, bounded=window.bounded)
    return {
        "driver": driver,
        "requests": arrivals,
        "ok": int(ok.sum()),
        **counts,
        "in_flight": by_status.get("in_flight", 0),
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
        "mean_batch_items": (float(batches["items"].to_numpy()[bwin].mean()) if n_batches
                             else math.nan),
        "batch_size_hist": {str(k): int(v) for k, v in zip(sizes, size_counts, strict=True)},
        "batch_utilization": mean_batch / window.max_batch_size if n_batches else math.nan,
        "utilization": utilization,
        "utilization_per_replica": [float(u) for u in util],
        "queue_len": queue_length_stats(queue, lo, hi, queue_steps),
        "in_system_mean": in_system,
        "littles_law": {"in_system_mean": in_system, "throughput_x_latency": little,
                        "rel_gap": (in_system - little) / little if little else math.nan},
        "stability": stability,
        "cost_per_million_usd": cost,
        **scaling,
        **({"classes": class_summaries(requests, window)} if "klass" in requests else {}),
    }


def completions_in_window(requests: pd.DataFrame, window: Window) -> tuple[int, int | None]:
    """Ok requests (whenever they arrived) that finished inside the window, and how many of
    those met their SLO (their own deadline when requests carry one; None without any SLO).
    """
    lo, hi = window.warmup_s, window.horizon_s
    all_ok = status_is(requests, "ok")
    finish = _floats(requests["finish_s"])[all_ok]
    done_in = (finish >= lo) & (finish <= hi)
    if window.slo_s is None and not window.has_deadlines:
        return int(done_in.sum()), None
    arrival = requests["arrival_s"].to_numpy()[all_ok]
    latency = finish - arrival
    if "deadline_s" in requests:
        budget = requests["deadline_s"].to_numpy()[all_ok] - arrival
        met = latency <= budget * (1 + 1e-12)
    else:
        met = latency <= (window.slo_s if window.slo_s is not None else math.inf)
    return int(done_in.sum()), int(np.sum(done_in & met))


def class_summaries(requests: pd.DataFrame, window: Window) -> dict[str, dict[str, Any]]:
    """Per request class: arrivals, ok, completions, throughput, goodput, error rate and
    latency (as in the summary, over that class's requests).
    """
    lo, span = window.warmup_s, window.length_s
    per_s = (1.0 / span) if span > 0 else math.nan
    end_s = _stop_s(window)
    out: dict[str, dict[str, Any]] = {}
    for name, group in requests.groupby("klass", sort=True):
        if name == "":
            continue
        inwin = group[group["arrival_s"].to_numpy() >= lo]
        counts = _status_counts(inwin, np.ones(len(inwin), dtype=bool))
        ok = inwin[status_is(inwin, "ok")]
        pending = inwin[status_is(inwin, "in_flight")]
        completions, good = completions_in_window(group, window)
        errors = sum(counts.get(c, 0) for c in ERROR_CAUSES)
        latency = latency_with_censored_s((ok["finish_s"] - ok["arrival_s"]).to_numpy(),
                                          pending["arrival_s"].to_numpy(), end_s)
        out[str(name)] = {
            "requests": len(inwin), "ok": len(ok), "completions": completions,
            "throughput_rps": completions * per_s,
            "goodput_rps": None if good is None else good * per_s,
            "error_rate": errors / len(inwin) if len(inwin) else math.nan,
            "error_rate_by_cause": {c: (counts.get(c, 0) / len(inwin) if len(inwin)
                                        else math.nan) for c in ERROR_CAUSES},
            "latency_ms": _stats_ms(latency, len(pending)),
        }
    return out
