"""An HTTP proxy in front of the replicas as a single-server FIFO stage
(``service.overheads.proxy_in_ms`` / ``proxy_out_ms``), applied around the clock-free core.

Ray Serve's proxy is one actor whose one asyncio loop parses every HTTP request, routes it,
serves the replica's call back for the body and streams every answer back
(``ray/serve/_private/proxy.py``, ``HTTPProxy``): each request holds that one loop for a
while on the way in and again on the way out, so requests that reach it close together
leave it spaced by its per-request cost. Each direction is taken here as its own FIFO
server with a fixed cost per request (Lindley's recursion ``d_i = max(a_i, d_{i-1}) + c``):
the core sees a request when the inbound stage releases it, and the client sees the answer
when the outbound stage, serving answers in the order their batches ended, releases it.
The real loop serves both directions; with its utilisation at a few per cent the two are
rarely busy at once, which is what taking them apart neglects.
"""

from __future__ import annotations

import numpy as np


def fifo_departures(arrival_s: np.ndarray, cost_s: float) -> np.ndarray:
    """Departure times of a single FIFO server with a fixed cost per job.

    Args:
        arrival_s: Arrival times, non-decreasing (the order served).
        cost_s: Each job's service time (s), >= 0.

    Returns:
        ``d`` with ``d[i] = max(arrival_s[i], d[i-1]) + cost_s`` (non-decreasing), computed
        as ``cost_s * (i + 1) + max_{j <= i} (arrival_s[j] - cost_s * j)``.
    """
    if cost_s < 0:
        raise ValueError(f"cost_s: must be >= 0, got {cost_s!r}")
    a = np.asarray(arrival_s, dtype=float)
    if a.size and np.any(np.diff(a) < 0):
        raise ValueError("arrival_s: must be non-decreasing (the order the stage serves)")
    k = np.arange(a.size, dtype=float) * cost_s
    return np.maximum.accumulate(a - k) + k + cost_s if a.size else a.copy()


def outbound_departures(finish_s: np.ndarray, cost_s: float) -> np.ndarray:
    """When each answer leaves the outbound stage, serving answers in the order their
    batches ended (ties in request order); NaN (unfinished) stays NaN.
    """
    finish = np.asarray(finish_s, dtype=float)
    out = finish.copy()
    done = np.flatnonzero(np.isfinite(finish))
    if cost_s == 0 or done.size == 0:
        return out
    order = done[np.argsort(finish[done], kind="stable")]
    out[order] = fifo_departures(finish[order], cost_s)
    return out
