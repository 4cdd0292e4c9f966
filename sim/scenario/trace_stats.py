"""What a hash-block trace offers a prefix cache, before any simulation (as AIPerf's
``analyze-trace`` reports): request count and rate, length percentiles, and the token hit
rate of an infinite cache and of an LRU cache of a given number of blocks.

The hit rates are timing-free: requests are taken in arrival order, each one's blocks are
stored the moment it arrives and nothing is pinned by running requests. A request hits the
longest prefix of its full blocks already stored, at most ``prompt - 1`` tokens (the last
prompt token is always computed, as in vLLM), so these are upper bounds of what an engine of
that cache size can reach on the trace.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np

from sim.scenario.hash_trace import HashTrace, trace_keys

PERCENTILES = (50, 90, 99)


def _lengths(values: np.ndarray) -> dict[str, float]:
    out = {"mean": float(values.mean()), "max": float(values.max())}
    out.update({f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES})
    return out


def hit_rate(trace: HashTrace, cache_blocks: int | None = None) -> float:
    """Token hit rate (hit prompt tokens / prompt tokens) of an infinite cache (``None``) or an
    LRU cache of ``cache_blocks`` blocks of the trace's block size.
    """
    if cache_blocks is not None and cache_blocks < 0:
        raise ValueError(f"--cache-blocks: must be >= 0, got {cache_blocks}")
    bs = trace.block_size
    store: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for keys, prompt in zip(trace_keys(trace, bs), trace.prompt_tokens, strict=True):
        limit = (int(prompt) - 1) // bs
        n = 0
        for k in keys[:limit]:
            if k not in store:
                break
            n += 1
        hits += n * bs
        for k in reversed(keys):  # the prefix ends most recent: evicted last
            store[k] = None
            store.move_to_end(k)
        if cache_blocks is not None:
            while len(store) > cache_blocks:
                store.popitem(last=False)
    total = int(trace.prompt_tokens.sum())
    return hits / total if total else math.nan


def trace_stats(trace: HashTrace, cache_blocks: list[int] | None = None) -> dict[str, Any]:
    """The trace's summary: requests, span and rate, prompt/output length percentiles, the
    infinite-cache hit rate and the LRU hit rate per size in ``cache_blocks``.
    """
    n = len(trace)
    span_s = float(trace.arrival_s[-1] - trace.arrival_s[0]) if n > 1 else 0.0
    unique_blocks = len({k for keys in trace_keys(trace, trace.block_size) for k in keys})
    return {
        "format": trace.fmt, "block_size": trace.block_size, "requests": n,
        "span_s": span_s, "rate_rps": (n - 1) / span_s if span_s > 0 else math.nan,
        "prompt_tokens": _lengths(trace.prompt_tokens),
        "output_tokens": _lengths(trace.output_tokens),
        "unique_full_blocks": unique_blocks,
        "hit_rate_infinite": hit_rate(trace),
        "hit_rate_lru": {str(b): hit_rate(trace, b) for b in (cache_blocks or [])},
    }


def format_stats(stats: dict[str, Any]) -> list[str]:
    """The summary as printable lines (lengths in tokens, hit rates in percent)."""
    def dist(d: dict[str, float]) -> str:
        return (f"mean {d['mean']:.0f}, p50 {d['p50']:.0f}, p90 {d['p90']:.0f}, "
                f"p99 {d['p99']:.0f}, max {d['max']:.0f}")

    lines = [f"format {stats['format']}, {stats['block_size']} tokens per block",
             f"requests {stats['requests']} over {stats['span_s']:.1f} s "
             f"({stats['rate_rps']:.3g} req/s)",
             f"prompt tokens: {dist(stats['prompt_tokens'])}",
             f"output tokens: {dist(stats['output_tokens'])}",
             f"distinct full blocks: {stats['unique_full_blocks']}",
             f"token hit rate, infinite cache: {100 * stats['hit_rate_infinite']:.1f}%"]
    lines += [f"token hit rate, LRU cache of {size} blocks: {100 * rate:.1f}%"
              for size, rate in stats["hit_rate_lru"].items()]
    return lines
