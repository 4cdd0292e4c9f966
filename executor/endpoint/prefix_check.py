"""Check the simulator's prefix cache against a real vLLM's: replay a hash-block trace with
prompts that realise its block ids (:mod:`executor.endpoint.hash_prompts`), read the server's
own ``vllm:prefix_cache_hits_total`` and ``vllm:prefix_cache_queries_total`` before and after,
and set them beside the simulator's prediction for the server's block size and KV capacity.

Both count as vLLM 0.32 does (``Scheduler.schedule`` calls
``KVCacheManager.record_prefix_cache_stats`` when a request is admitted, with
``PrefixCacheStats.record``): a request first admitted queries ``request.num_tokens`` (its
prompt) and hits its cached prefix in whole blocks, at most ``num_tokens - 1``; a preempted
request's re-admission goes to separate ``preempted_*`` counters, which the Prometheus counters
do not include. The simulator's :class:`sim.serving.llm.prefix_cache.PrefixCacheStats` keeps
the same split, so its ``queries_tokens`` / ``hits_tokens`` are the counters' deltas.

Only requests the engine admits are counted, so a request the client hangs up on is counted
or not by timing: bench's preflight hangs up once it has the status, and on a busy 2-core
machine vLLM aborted it before admitting it in 14 of 40 tries (read to its end: counted in
60 of 60). The replay has the preflight read its 1-token stream to the end (1 query, no
hit), and reads the counters only when the server is idle and they hold still.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from executor.endpoint import server_info
from executor.endpoint.bench import bench
from executor.endpoint.prefix_probe import linear_terms
from executor.endpoint.server_info import EndpointError
from sim.drivers.llm_simulate import LlmResult
from sim.drivers.llm_simulate import run as sim_run
from sim.scenario.llm import LlmScenario, load_llm_scenario

HITS = "prefix_cache_hits_total"
QUERIES = "prefix_cache_queries_total"
PREFLIGHT_TOKENS = 1
SETTLE_POLL_S = 0.2
# a hang guard: an earlier run's requests drain in seconds; a minute means other traffic
SETTLE_TIMEOUT_S = 60.0


def server_cache(base: str) -> dict[str, Any]:
    """The server's block size, usable KV blocks and prefix-caching switch.

    vLLM's block pool reserves one block (the null block), so the simulator gets
    ``num_gpu_blocks - 1`` usable blocks.

    Raises:
        EndpointError: the server exposes no ``cache_config_info``.
    """
    page = server_info.metrics(base)
    config = server_info.scheduling_config(page)
    if "block_size" not in config or "num_blocks" not in config:
        raise EndpointError(f"{base}/metrics: no vllm:cache_config_info with block_size and "
                            "num_gpu_blocks (is it a vLLM server?)")
    return {"block_size": config["block_size"], "num_blocks": config["num_blocks"] - 1,
            "enable_prefix_caching": bool(config.get("enable_prefix_caching", False))}


def matched_scenario(scenario: Any, cache: dict[str, Any],
                     overrides: dict[str, Any] | None = None) -> LlmScenario:
    """``scenario`` with the server's block size, KV blocks and prefix-caching switch."""
    return load_llm_scenario(scenario, {
        **(overrides or {}), "policy.block_size": cache["block_size"],
        "policy.num_gpu_blocks": cache["num_blocks"],
        "policy.enable_prefix_caching": cache["enable_prefix_caching"]})


def counters(base: str) -> tuple[float, float]:
    """The server's (hits, queries) prefix-cache counters, in tokens.

    Raises:
        EndpointError: the server's ``/metrics`` has no prefix-cache counters.
    """
    page = server_info.metrics(base)
    values = (page or {}).get("values", {})
    if HITS not in values or QUERIES not in values:
        raise EndpointError(f"{base}/metrics: no vllm:{HITS} / vllm:{QUERIES}")
    return float(values[HITS]), float(values[QUERIES])


def _idle(base: str) -> bool:
    page = server_info.metrics(base)
    values = (page or {}).get("values", {})
    busy = float(values.get("num_requests_running", 0.0)) + float(
        values.get("num_requests_waiting", 0.0))
    return busy == 0


def settled_counters(base: str, timeout_s: float = SETTLE_TIMEOUT_S) -> tuple[float, float]:
    """:func:`counters` once the server runs and queues nothing and two reads
    ``SETTLE_POLL_S`` apart agree (an earlier run's requests still in flight would count in
    the next delta).

    Raises:
        EndpointError: not settled within ``timeout_s``, or no prefix-cache counters.
    """
    deadline_s = time.monotonic() + timeout_s
    last = counters(base)
    while True:
        time.sleep(SETTLE_POLL_S)
        now = counters(base)
        if now == last and _idle(base):
            return now
        if time.monotonic() > deadline_s:
            raise EndpointError(f"{base}/metrics: the prefix-cache counters did not settle "
                                f"in {timeout_s:g} s (other traffic on the server?)")
        last = now


def replay(scn: LlmScenario, base: str, content_seed: int) -> tuple[LlmResult, dict[str, Any]]:
    """One bench run of ``scn`` against ``base``; the server's counter deltas beside it."""
    h0, q0 = settled_counters(base)
    result = bench(scn, base, content_seed=content_seed, finish_preflight=True)
    h1, q1 = settled_counters(base)
    # bench's preflight (executor.endpoint.bench.preflight), run to its end, is a 1-token
    # prompt: it queries 1 token and can hit none (the last token is always computed)
    hits, queries = h1 - h0, q1 - q0
    if queries > 0:  # caching off: no lookup, nothing counted, the preflight neither
        queries -= PREFLIGHT_TOKENS
    return result, {"hits_tokens": hits, "queries_tokens": queries,
                    "hit_rate": hits / queries if queries else math.nan}


def predicted(scn: LlmScenario) -> tuple[LlmResult, dict[str, Any]]:
    """The simulator's run of ``scn`` and its prefix-cache counters (zeros when off)."""
    result = sim_run(scn)
    prefix = result.summary.get("prefix_cache") or {}
    q = int(prefix.get("queries_tokens", 0))
    h = int(prefix.get("hits_tokens", 0))
    return result, {"hits_tokens": h, "queries_tokens": q,
                    "hit_rate": h / q if q else math.nan}


def linear_service(profile_path: str | Path) -> dict[str, Any]:
    """An ``llm_linear`` service from a ``calibrate --endpoint`` profile's own fits: the
    decode terms of ``meta.endpoint_fit`` (base, per decode sequence, per KV token) and, where
    the profile has the cached-prefix probe (``meta.cached_prefill``), the prefill terms of its
    fit (per new token, per attention pair to the cached prefix and within the chunk, the
    prefill step's constant: :func:`executor.endpoint.prefix_probe.linear_terms`); else the
    fresh prompts' slope per prefill token, which carries their own attention. Its terms hold
    at any context, where the profile's grid ends at the probes' longest.
    """
    meta = json.loads(Path(profile_path).read_text())["meta"]
    fit = meta["endpoint_fit"]
    service = {"kind": "llm_linear", "base_ms": max(fit["decode_base_ms"], 0.0),
               "per_prefill_token_ms": max(fit["ms_per_prefill_token"], 0.0),
               "per_decode_seq_ms": max(fit["ms_per_decode_seq"], 0.0),
               "per_kv_token_ms": max(fit["ms_per_kv_token"], 0.0),
               "overheads": meta.get("overheads")}
    cached = meta.get("cached_prefill")
    if cached:
        service.update(linear_terms(cached["fit"], fit["decode_base_ms"]))
    return service


__all__ = ["counters", "linear_service", "matched_scenario", "predicted", "replay",
           "server_cache", "settled_counters"]
