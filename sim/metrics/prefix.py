"""Prefix-cache metrics of a finished LLM run, and its end-of-run block checks.

Definitions are vLLM's (``PrefixCacheStats``, the ``vllm:prefix_cache_queries`` and
``vllm:prefix_cache_hits`` counters, in tokens): a request queries its prompt tokens when it
is first admitted and hits the tokens of its cached prefix; a preempted request's re-admission
is counted apart. ``prefill_tokens_saved`` adds both hits: tokens the engines did not compute.
The hit rate over time bins the requests by arrival.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.serving.llm.core import LlmCore
from sim.serving.llm.prefix_cache import PrefixCachingBlockPool


def pools(core: LlmCore) -> list[PrefixCachingBlockPool]:
    """The replicas' prefix-caching block pools (empty: prefix caching is off)."""
    return [p for s in core.schedulers
            if isinstance(p := getattr(s, "kv", None), PrefixCachingBlockPool)]


def check_pools(core: LlmCore) -> None:
    """The full block checks of every pool (:meth:`PrefixCachingBlockPool.check`) and, once
    every request has ended, that no block is held.

    Raises:
        KvInvariantError: a pool is inconsistent.
    """
    for pool in pools(core):
        pool.check()


def cached_tokens(core: LlmCore) -> np.ndarray:
    """Per admitted request: prompt tokens served from the cache at its first admission."""
    out = np.zeros(core.admitted, dtype=np.int64)
    for pool in pools(core):
        for i, n in pool.stats.cached_tokens.items():
            out[i] = n
    return out


def prefix_cache_summary(core: LlmCore, bins: int = 20) -> dict[str, Any]:
    """Queries, hits, hit rate, preemption re-admissions, prefill tokens saved, evictions,
    per replica hit rates and the hit rate over time (``bins`` windows of arrival time).
    """
    ps = pools(core)
    q = sum(p.stats.queries for p in ps)
    h = sum(p.stats.hits for p in ps)
    pq = sum(p.stats.preempted_queries for p in ps)
    ph = sum(p.stats.preempted_hits for p in ps)
    n = core.admitted
    cached = cached_tokens(core)
    queried = np.zeros(n, dtype=np.int64)
    for pool in ps:
        for i in pool.stats.cached_tokens:
            queried[i] = core.prompt_tokens[i]
    arrival = core.arrival_s[:n]
    over_time: list[dict[str, float]] = []
    if n:
        lo, hi = float(arrival[0]), float(arrival[-1])
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
        which = np.clip(np.searchsorted(edges, arrival, side="right") - 1, 0, bins - 1)
        qs = np.bincount(which, weights=queried, minlength=bins)
        hs = np.bincount(which, weights=cached, minlength=bins)
        over_time = [{"start_s": float(edges[k]), "end_s": float(edges[k + 1]),
                      "queries": int(qs[k]),
                      "hit_rate": float(hs[k] / qs[k]) if qs[k] else math.nan}
                     for k in range(bins)]
    return {
        "queries_tokens": q, "hits_tokens": h,
        "hit_rate": h / q if q else math.nan,
        "preempted_queries_tokens": pq, "preempted_hits_tokens": ph,
        "prefill_tokens_saved": h + ph,
        "evictions": sum(p.stats.evictions for p in ps),
        "per_replica_hit_rate": [p.stats.hit_rate for p in ps],
        "hit_rate_over_time": over_time,
    }
