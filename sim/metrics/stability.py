"""Is a run stable? Capacity of the service model, the queue's trend, and the verdict.

A run whose queue grows without bound has no steady-state latency: its percentiles only say
how long the run lasted. Every summary therefore carries a verdict:

* ``unstable``: the offered load exceeds the capacity while nothing bounds the queue (no
  ``max_len``, no ``timeout_ms``, no dropping policy), or the queue grew significantly over
  the window (least-squares slope of the queue length more than :data:`T_CRIT` standard
  errors above zero, and the growth over the window larger than the queue's mean) while the
  offered load is not known to be below :data:`SATURATED_RHO` of the capacity. Below that a
  queue cannot grow without bound: a rise within a short window is a transient (a burst), and
  the verdict stays ``stable`` with the rise named in its reason;
* ``saturated``: not growing, but at the limit: the offered load is at least
  :data:`SATURATED_RHO` of the capacity, or the device is busy at least that share of the
  time, or a bounded queue sheds the excess; a closed loop is at most ``saturated`` (its
  clients bound the queue);
* ``stable`` otherwise.

Whatever the load says, a run whose throughput measures nothing is ``unstable``
(:func:`unmeasurable`): nothing finished while requests stayed queued, nothing finished
inside the window, or no request was served at all (every one rejected, expired or failed),
also for a bounded queue or a closed loop.

Capacity is ``replicas × concurrent batches × max over the policy's batch sizes b of
b / mean service time(b × mean request size)``: the most a fleet can finish per second if
every batch is as efficient as the policy allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.metrics.folds import StepFold

T_CRIT = 3.0
SATURATED_RHO = 0.95
LOW_LOAD_RHO = 0.75  # below this share of capacity a busy device is "busy at low load"
FULL_BATCHES = 0.9  # ... unless its batches are this full (mean / max batch size)
TREND_SEGMENTS = 10


def capacity_rps(mean_s: Callable[[int], float], batch_sizes: Sequence[int], replicas: int,
                 concurrent_batches: int = 1, mean_size: float = 1.0) -> float:
    """Requests per second the fleet can finish at best.

    Args:
        mean_s: Mean service time (s) of a batch of ``items`` items.
        batch_sizes: Batch sizes (requests) the policy can form.
        replicas: Number of replicas.
        concurrent_batches: Batches one replica may run at once (the simulator overlaps them
            without contention).
        mean_size: Mean items per request.

    Returns:
        The capacity in requests per second (nan when no batch size can be evaluated, e.g.
        every size lies outside a profile's measured range).
    """
    best = math.nan
    for b in batch_sizes:
        try:
            t = mean_s(max(1, round(b * mean_size)))
        except (ValueError, KeyError):
            continue
        if t > 0 and not (b / t <= best):
            best = b / t
    return best * replicas * concurrent_batches


@dataclass(frozen=True)
class Trend:
    """Least-squares slope of the queue length over the window.

    Attributes:
        slope_per_s: Requests added to the queue per second.
        se_per_s: Standard error of the slope (segment means as observations).
        mean: Time-weighted mean queue length.
    """

    slope_per_s: float
    se_per_s: float
    mean: float


def trend_of(steps: StepFold) -> Trend:
    """The queue's trend: OLS of its time-weighted means over the fold's segments.

    Segment means rather than the raw steps: neighbouring queue lengths are strongly
    correlated, so a regression on every step would call noise a trend.
    """
    lo_s, hi_s = steps.lo_s, steps.hi_s
    if steps.rows == 0 or hi_s <= lo_s:
        return Trend(math.nan, math.nan, math.nan)
    means = steps.segment_means()
    segments = means.size
    mid = (np.arange(segments) + 0.5) * (hi_s - lo_s) / segments
    x = mid - mid.mean()
    sxx = float(np.sum(x * x))
    if not (sxx > 0 and math.isfinite(sxx)):  # a window too short for float resolution
        return Trend(math.nan, math.nan, float(means.mean()))
    slope = float(np.sum(x * (means - means.mean())) / sxx)
    resid = means - means.mean() - slope * x
    se = math.sqrt(float(np.sum(resid * resid)) / (segments - 2) / sxx)
    return Trend(slope, se, float(means.mean()))


def verdict(*, offered_rps: float, capacity: float, utilization: float, trend: Trend,
            window_s: float, closed_loop: bool, bounded: bool) -> dict[str, Any]:
    """The stability verdict of a run (the summary's ``stability`` section).

    Args:
        offered_rps: Arrivals per second in the window.
        capacity: :func:`capacity_rps` of the scenario.
        utilization: Mean device utilisation over the window.
        trend: :func:`queue_trend` over the window.
        window_s: Window length (s).
        closed_loop: The clients bound the number in the system.
        bounded: A queue bound, a request timeout or a dropping policy sheds the excess.
    """
    rho = offered_rps / capacity if capacity and math.isfinite(capacity) else math.nan
    slope, se = trend.slope_per_s, trend.se_per_s
    growth = slope * window_s if math.isfinite(slope) else math.nan
    significant = (math.isfinite(slope) and slope > 0
                   and (se == 0 or slope > T_CRIT * se)
                   and growth > max(1.0, trend.mean))
    transient = significant and math.isfinite(rho) and rho < SATURATED_RHO
    if transient:  # positive recurrent below capacity: the rise is a burst, not a trend
        significant = False
    if closed_loop:
        state, reason = "stable", "closed loop: the clients bound the queue"
        if utilization >= SATURATED_RHO:
            state, reason = "saturated", (f"closed loop at the device's limit (utilisation "
                                          f"{utilization:.0%})")
    elif rho > 1 and not bounded:
        state = "unstable"
        reason = (f"offered {offered_rps:.4g} req/s exceeds the capacity of {capacity:.4g} "
                  f"req/s; the queue grows without bound")
    elif significant and not bounded:
        state = "unstable"
        reason = (f"the queue grew by {growth:.0f} requests over the window "
                  f"({slope:.3g} ± {se:.2g} per s)")
    elif rho > 1:
        state = "saturated"
        reason = (f"offered {offered_rps:.4g} req/s exceeds the capacity of {capacity:.4g} "
                  f"req/s; the bounded queue sheds the excess")
    elif rho >= SATURATED_RHO or utilization >= SATURATED_RHO or significant:
        state = "saturated"
        reason = (f"at the limit: offered/capacity {rho:.2f}, utilisation {utilization:.0%}"
                  + (f", queue grew by {growth:.0f}" if significant else ""))
    else:
        state, reason = "stable", f"offered/capacity {rho:.2f}"
        if transient:
            reason += (f"; the queue rose by {growth:.0f} requests within the window, a "
                       "transient at this load (a longer run averages it out)")
    return {"verdict": state, "offered_rps": offered_rps, "capacity_rps": capacity,
            "rho_offered": rho, "queue_trend_per_s": slope, "queue_trend_se_per_s": se,
            "reason": reason}


def unmeasurable(stability: dict[str, Any], *, arrivals: int, ok: int, completions: int,
                 in_flight: int, window_s: float,
                 ended: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The verdict of a run whose throughput says nothing, whatever the load said.

    * nothing finished at all while requests stayed queued (a fixed batch larger than the
      run, a wait that never expires): the run is stuck, not stable with throughput 0;
    * requests finished, but none inside the window (a window shorter than one service
      time): throughput is not measured, and is not the capacity;
    * no request was served: every one ended otherwise (``ended``: the count of each such
      end, e.g. all rejected as too large for the KV cache): nothing is measured, and an
      error rate of 1 is not a stable service.
    """
    if arrivals == 0 or completions > 0:
        return stability
    if ok == 0 and in_flight == 0:
        causes = ", ".join(f"{n} {cause.replace('_', ' ')}"
                           for cause, n in (ended or {}).items() if n)
        return {**stability, "verdict": "unstable",
                "reason": (f"no request was served: all {arrivals} ended unserved"
                           + (f" ({causes})" if causes else "")
                           + "; latency and throughput are not measured")}
    if ok == 0 and in_flight > 0:
        return {**stability, "verdict": "unstable",
                "reason": (f"no request finished: {in_flight} of {arrivals} were still "
                           "waiting when the run ended (the policy never dispatched them, "
                           "e.g. a batch size larger than the run or a wait that never "
                           "expires)")}
    if ok > 0:
        return {**stability, "verdict": "unstable",
                "reason": (f"the measurement window ({window_s:.3g} s) ended before any "
                           "request finished, so throughput is not measured; lengthen the "
                           "run (workload.duration_s or n_requests) or lower the rate")}
    return stability




def busy_at_low_load(summary: dict[str, Any]) -> bool:
    """Whether a ``saturated`` verdict comes only from a busy device at low offered load
    (below :data:`LOW_LOAD_RHO` of the capacity).

    The verdict (kept as it is: the summary's fields are a contract) calls a run saturated
    when the device is busy at least :data:`SATURATED_RHO` of the time. With small batches at
    low load (greedy batching at 40% of capacity, say) the device is busy but far from its
    limit: larger batches would serve the excess. That is not saturation, and the words
    shown to people say so.
    """
    stability = summary.get("stability") or {}
    rho = stability.get("rho_offered")
    reason = str(stability.get("reason", ""))
    fill = summary.get("batch_utilization")
    if isinstance(fill, int | float) and fill >= FULL_BATCHES:
        return False  # full batches on a busy device: that is the limit (the capacity
        # estimate is off, e.g. a live device slower than its profile)
    return (stability.get("verdict") == "saturated" and isinstance(rho, float)
            and math.isfinite(rho) and rho < LOW_LOAD_RHO
            and reason.startswith("at the limit") and "queue grew" not in reason)


def stability_note(summary: dict[str, Any]) -> tuple[str, str] | None:
    """What to tell a person about the run's stability: ``("warning", text)`` when it is
    unstable or saturated, ``("note", text)`` when the device is busy at low load, None when
    it is stable.
    """
    stability = summary.get("stability") or {}
    if stability.get("verdict") in (None, "stable"):
        return None
    if busy_at_low_load(summary):
        rho = float(stability["rho_offered"])
        util = float(summary.get("utilization") or math.nan)
        mean_batch = summary.get("mean_batch_size")
        batches = (f" with batches of {float(mean_batch):.2f} requests on average"
                   if isinstance(mean_batch, int | float) else "")
        return ("note", f"busy device at low load, not saturated: offered load is "
                        f"{rho:.0%} of capacity, yet the device is busy {util:.0%} of the "
                        f"time{batches}; fuller batches leave room for about {1 / rho:.1f}× "
                        "this load")
    text = f"{stability['verdict']}: {stability['reason']}"
    if stability["verdict"] == "unstable" and (summary.get("completions") or 0) > 0:
        text += ("; latency percentiles describe this run's length, not a steady state, and "
                 "throughput is the capacity")
    censored = int(summary.get("censored") or 0)
    if censored:
        text += f"; {censored} requests unfinished when the run stopped (censored)"
    return "warning", text


def stability_warning(summary: dict[str, Any]) -> str | None:
    """One line about the run's stability when it is not stable (None when it is): the
    warning, or the note that a busy device at low load is not saturated.
    """
    note = stability_note(summary)
    return None if note is None else note[1]
