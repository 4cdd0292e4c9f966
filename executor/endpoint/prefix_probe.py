"""What a prefill costs on top of a cached prefix, measured from outside a vLLM server.

A request whose first ``k`` prompt tokens hit the prefix cache computes only its ``n`` new
tokens, but each of them attends to all ``k`` cached ones (vLLM 0.32's CPU backend runs one
paged-attention kernel, ``ops.cpu_attention_with_kv_cache``, over the block table for every
query token: a cached-prefix prefill is an ordinary chunk that starts at position ``k``). Its
step therefore costs ``n`` tokens' weights plus ``n·k + n²/2`` query-key pairs, where a fresh
prompt of ``n`` tokens costs the weights plus ``n²/2`` pairs.

:func:`cached_prefill_s` times such prefills on a grid of (new, cached) tokens: for each cell
it first sends ``reps`` fresh prefixes of ``k`` tokens (filling the cache), then, one at a
time, each prefix followed by ``n`` fresh tokens. The engine's time of each hit is the
server's own ``request_prefill_time_seconds`` in a ``/metrics`` window around it alone
where exposed, else its TTFT less the per-request overhead; the fit takes each cell's
median.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from executor.endpoint import server_info
from executor.endpoint.client import Job
from executor.endpoint.probes import Target, send

SERVER_PREFILL = "request_prefill_time_seconds"
HITS = "prefix_cache_hits_total"
# (new, cached) tokens: new spans a chat turn to a long paste; cached a short system prompt to
# a long conversation (all multiples of 128, vLLM's CPU block size, so the hit is exact)
CELLS = ((64, 0), (256, 0), (1024, 0), (2048, 0), (64, 1024), (256, 1024), (64, 2048),
         (256, 2048), (1024, 1024))


def plan_cells(max_model_len: int, max_num_batched_tokens: int | None, caching: bool
               ) -> list[list[int]]:
    """The probe's ``[n, k]`` cells within the server's limits: prompt ``n + k`` within its
    context and the ``n`` new tokens within one step's token budget (one chunk); none where
    the server reports prefix caching off (its prompts would all be computed).
    """
    if not caching:
        return []
    budget = max_num_batched_tokens or max_model_len
    cells = [[n, k] for n, k in CELLS if n + k <= max_model_len - 2 and n <= budget]
    return cells if any(k for _, k in cells) else []


def trimmed(cells: Sequence[Sequence[int]]) -> list[list[int]]:
    """``cells`` less the dearest one (most tokens sent), for a tight budget; none once
    fewer than two fresh lengths or no cached prefix would be left (nothing to fit).
    """
    left = sorted(([int(n), int(k)] for n, k in cells), key=lambda c: c[1] + 2 * c[0])[:-1]
    fresh = {n for n, k in left if k == 0}
    return left if len(fresh) >= 2 and any(k for _, k in left) else []


def estimate_s(cells: Sequence[Sequence[int]], reps: int, per_token_s: float) -> float:
    """Seconds the probe takes: each cell's ``reps`` prefixes and hits at a long prefill's
    speed per token (attention to the cached prefix makes a hit's tokens dearer: 2×).
    """
    return sum(reps * per_token_s * (k + 2 * n) for n, k in cells)


def cached_prefill_meta(got: dict[str, Any]) -> dict[str, Any]:
    """What the profile's ``meta.cached_prefill`` keeps: the probe's samples and its fit
    (:func:`fit_cached_prefill`), from which :func:`linear_terms` builds a linear model.
    """
    return {**got, "fit": fit_cached_prefill(got["samples_s"])}


def linear_terms(cached_fit: dict[str, float], decode_base_ms: float) -> dict[str, float]:
    """``llm_linear`` prefill fields from the probe's fit: the per-token cost without the
    fresh prompts' attention, the attention to the cached prefix
    (``per_prefill_context_ms``, per new × cached token) and within the chunk
    (``per_prefill_sq_ms``, per new token²), and the prefill step's constant beyond the
    decode step's base (``per_prefill_seq_ms``).
    """
    return {"per_prefill_token_ms": max(cached_fit["ms_per_new_token"], 0.0),
            "per_prefill_context_ms": max(cached_fit["ms_per_context_pair"], 0.0),
            "per_prefill_sq_ms": max(cached_fit["ms_per_sq"], 0.0),
            "per_prefill_seq_ms": max(cached_fit["a_ms"] - max(decode_base_ms, 0.0), 0.0)}


def _hits(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    if not before or not after or HITS not in before["values"] or HITS not in after["values"]:
        return None
    return float(after["values"][HITS] - before["values"][HITS])


def cached_prefill_s(target: Target, base: str, cells: Sequence[Sequence[int]],
                     reps: int, request_s: float) -> dict[str, Any]:
    """Engine seconds of a prefill of ``n`` new tokens after ``k`` cached ones, per cell
    (each hit request timed alone).

    Args:
        target: Where the probes go (its id stream makes every prompt fresh).
        base: The server's base URL (for ``/metrics``).
        cells: ``(n, k)`` pairs; ``k = 0`` is a fresh prompt.
        reps: Hit requests per cell.
        request_s: The per-request overhead outside the engine (the calibration's
            ``request_ms``), taken off TTFT where the server reports no prefill time.

    Returns:
        ``{"samples_s": {"n,k": [s, ...]}, "ttft_s": {"n,k": [...]}, "server": {"n,k":
        [...]}, "hits_tokens": {"n,k": tokens}}``: samples are the server's own prefill times
        where it reports them, else the TTFTs less ``request_s``; ``hits_tokens`` is what the
        server's prefix cache hit during the cell's hits (``reps × k`` when every prefix was
        found).

    Raises:
        EndpointError: a probe request failed.
    """
    open_connection(target)
    got: dict[str, Any] = {"samples_s": {}, "ttft_s": {}, "server": {}, "hits_tokens": {}}
    for n, k in cells:
        add_cell(got, cached_cell_s(target, base, int(n), int(k), reps, request_s))
    return got


def open_connection(target: Target) -> None:
    """One untimed request: the cells' requests find the connection open."""
    send(target, [Job(0, 0.0, target.prompt(16), 16, 1)], one_at_a_time=True)


def add_cell(got: dict[str, Any], cell: dict[str, Any]) -> None:
    """Merge one :func:`cached_cell_s` result into ``got`` (:func:`cached_prefill_s`'s
    form).
    """
    for name, values in cell.items():
        got.setdefault(name, {}).update(values)


def cached_cell_s(target: Target, base: str, n: int, k: int, reps: int, request_s: float
                  ) -> dict[str, Any]:
    """One cell of :func:`cached_prefill_s`: ``reps`` fresh prefixes of ``k`` tokens sent
    (filling the cache), then each followed by ``n`` fresh tokens, timed alone; the result
    in :func:`cached_prefill_s`'s form, for this cell's key only.
    """
    prefixes = [target.prompt(k) for _ in range(reps)]
    if k:
        send(target, [Job(i, 0.0, p, k, 1) for i, p in enumerate(prefixes)],
             one_at_a_time=True)
    ttfts: list[float] = []
    server: list[float] = []
    hit_total = 0.0
    for i, p in enumerate(prefixes):
        # one /metrics window per hit: the server's time of each (a median, where a
        # window over all of them gives only their mean, which one stall moves)
        before = server_info.metrics(base)
        out = send(target, [Job(i, 0.0, p + target.prompt(n), k + n, 1)],
                   one_at_a_time=True)[0]
        after = server_info.metrics(base)
        ttfts.append(out.chunk_s[0] - out.sent_s)
        inside = server_info.histogram_mean(before, after, (SERVER_PREFILL,))
        if inside is not None:
            server.append(inside)
        hit_total += _hits(before, after) or 0.0
    key = f"{n},{k}"
    samples = server if len(server) == reps else [max(t - request_s, 1e-6) for t in ttfts]
    return {"samples_s": {key: samples}, "ttft_s": {key: ttfts}, "server": {key: server},
            "hits_tokens": {key: hit_total}}


def fit_cached_prefill(samples_s: dict[str, list[float]]) -> dict[str, float]:
    """Least squares of the cells' medians (ms) on ``1, n, n·k, n²``: ``a_ms``,
    ``ms_per_new_token``, ``ms_per_context_pair`` (a new token's attention to one cached
    token), ``ms_per_sq`` (per new token², its attention within the chunk: ``n²/2`` pairs,
    so half a pair's cost where both are the same kernel; measured dearer on vLLM's CPU build
    at 1,024 tokens), and R². Without fresh cells of three lengths the square cannot be told
    from the per-token cost: then one per-pair cost serves both (``n·k + n²/2``).
    """
    cells = [tuple(int(v) for v in key.split(",")) for key in samples_s]
    ys = np.asarray([float(np.median(v)) * 1e3 for v in samples_s.values()])
    fresh = {n for n, k in cells if k == 0}
    if len(fresh) >= 3:
        x = np.asarray([[1.0, n, n * k, n * n] for n, k in cells])
    else:
        x = np.asarray([[1.0, n, n * k + n * n / 2] for n, k in cells])
    coef, *_ = np.linalg.lstsq(x, ys, rcond=None)
    pred = x @ coef
    sst = float(np.sum((ys - ys.mean()) ** 2)) or 1e-30
    pair = float(coef[2])
    return {"a_ms": float(coef[0]), "ms_per_new_token": float(coef[1]),
            "ms_per_context_pair": pair,
            "ms_per_sq": float(coef[3]) if len(fresh) >= 3 else pair / 2,
            "r2": 1 - float(np.sum((ys - pred) ** 2)) / sst}


__all__ = ["CELLS", "add_cell", "cached_cell_s", "cached_prefill_meta", "cached_prefill_s",
           "estimate_s", "fit_cached_prefill", "linear_terms", "open_connection",
           "plan_cells", "trimmed"]
