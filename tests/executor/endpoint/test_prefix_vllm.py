"""A real vLLM's prefix cache against the simulator's: a short hash-id replay of the shipped
chat trace gives the server's own hit count (``vllm:prefix_cache_hits_total``) equal to the
simulator's prediction for the server's block size and KV capacity, up to the requests whose
lookup the run's own timing left open (a request sent before an earlier one's prompt was
known to be cached).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from executor.endpoint.prefix_check import matched_scenario, predicted, replay, server_cache
from sim.scenario.hash_workload import hash_workload


def _cached_prefix_blocks(keys: tuple[int, ...], limit: int, cached: set[int]) -> int:
    """Blocks of the longest prefix of ``keys[:limit]`` found in ``cached`` (each key names
    its whole prefix, as vLLM's chained block hash does).
    """
    n = 0
    for k in keys[:limit]:
        if k not in cached:
            break
        n += 1
    return n


def hit_bounds_tokens(keys: list[tuple[int, ...]], prompt_tokens: np.ndarray,
                      sent_s: np.ndarray, first_token_s: np.ndarray,
                      block_size: int) -> tuple[int, int]:
    """The least and most prefix-cache hits (tokens) the server can count for this run's
    order of events, with nothing evicted.

    vLLM looks a request up once, when it admits it, and caches a block as soon as it is
    scheduled for the tokens that fill it. So request i certainly finds the prompt blocks
    of every request whose first token we had read before we sent i (its whole prompt was
    computed by then), and at most those of the requests we had sent before we read i's
    first token (only they can have been admitted before i): the lookup is the longest
    cached prefix, capped below the last prompt token (``num_tokens - 1``).
    """
    lo = hi = 0
    n = len(keys)
    for i in range(n):
        limit = (int(prompt_tokens[i]) - 1) // block_size
        others = [j for j in range(n) if j != i]
        sure = {k for j in others if first_token_s[j] < sent_s[i] for k in keys[j]}
        maybe = {k for j in others if sent_s[j] < first_token_s[i] for k in keys[j]}
        lo += _cached_prefix_blocks(keys[i], limit, sure) * block_size
        hi += _cached_prefix_blocks(keys[i], limit, maybe) * block_size
    return lo, hi


@pytest.mark.slow
def test_a_hash_id_replay_hits_the_servers_cache_as_the_simulator_predicts(
        vllm_server: Any) -> None:
    cache = server_cache(vllm_server.url)
    assert cache["enable_prefix_caching"]  # vLLM's default, and the fixture's
    scn = matched_scenario({
        "name": "prefix-vllm-test", "seed": 0,
        "service": {"kind": "llm_linear", "base_ms": 5, "per_prefill_token_ms": 0.05,
                    "per_decode_seq_ms": 0.2},
        "workload": {"kind": "hash_trace", "path": "builtin:synthetic_chat_blksz_16.jsonl",
                     "n_requests": 14, "time_scale": 0.3},
        "policy": {"kind": "vllm"}, "warmup_s": 0}, cache)
    _, sim = predicted(scn)
    # a content seed no other test uses: this run's blocks are new to the server
    result, server = replay(scn, vllm_server.url, content_seed=4242)
    assert result.summary["ok"] == 14
    # exact: every request is admitted once and queries its prompt; replay runs bench's
    # preflight to its end, so the server counts it whatever the timing, and subtracts it
    assert sim["queries_tokens"] == server["queries_tokens"]
    assert sim["hit_rate"] > 0.3  # the slice shares system prompts and earlier turns
    # nothing of this run is evicted, on either side: a block this run frees joins the free
    # queue's tail behind every free block, at least num_blocks less what the run holds,
    # and the run allocates at most its total after that; so 2 x its total < num_blocks
    _, prompt, output, keys = hash_workload(scn)
    bs = int(cache["block_size"])
    run_blocks = int(np.sum(-(-(prompt + output) // bs))) + 1  # + the preflight's block
    assert 2 * run_blocks < cache["num_blocks"], (run_blocks, cache)
    # the hits: a count of whole blocks fixed by which prompts were cached at each lookup,
    # which the run's own stamps bound (hit_bounds_tokens); where no request raced one it
    # shares blocks with, lo == hi and the server's count must equal the simulator's
    # exactly. A simulator that cached blocks only when a request finished, let the last
    # prompt token hit, or used the trace's 16-token blocks would be off by at least a
    # block (128 tokens) on this slice; so would a replay whose prompts did not realise
    # the trace's shared prefixes
    req = result.requests.sort_values("id")
    assert req["id"].tolist() == list(range(len(keys)))
    lo, hi = hit_bounds_tokens(keys, prompt, req["arrival_s"].to_numpy(),
                               req["first_token_s"].to_numpy(), bs)
    assert lo <= server["hits_tokens"] <= hi, (server, lo, hi)
    assert abs(server["hits_tokens"] - sim["hits_tokens"]) <= hi - lo, (server, sim, lo, hi)
