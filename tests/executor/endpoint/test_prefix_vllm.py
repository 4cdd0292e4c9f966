"""A real vLLM's prefix cache against the simulator's: a short hash-id replay of the shipped
chat trace gives the server's own hit rate (``vllm:prefix_cache_hits_total /
queries_total``) within 2 percentage points of the simulator's prediction for the server's
block size and KV capacity.
"""

from __future__ import annotations

from typing import Any

import pytest

from executor.endpoint.prefix_check import matched_scenario, predicted, replay, server_cache


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
    assert abs(server["hit_rate"] - sim["hit_rate"]) <= 0.02
