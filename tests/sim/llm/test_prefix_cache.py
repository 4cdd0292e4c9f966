"""Prefix caching: the block pool's reuse, eviction order and reference counts checked by
hand, the engine computing only uncached tokens, and invariants over random traces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.drivers.llm_simulate import simulate, tables
from sim.metrics.prefix import check_pools, prefix_cache_summary
from sim.scenario.step_time import LinearStepModel
from sim.serving.llm.affinity import PrefixAffinity
from sim.serving.llm.core import LlmCore
from sim.serving.llm.kv import Seq
from sim.serving.llm.prefix_cache import KvInvariantError, PrefixCachingBlockPool
from sim.serving.llm.schedulers import SarathiScheduler, VllmScheduler
from sim.serving.llm.step_model import Composition

BS = 4


def seq(i: int, prompt: int, keys: tuple[int, ...], output: int = 2) -> Seq:
    return Seq(i, 0.0, prompt, output, hashes=keys)


def test_second_request_reuses_the_prefix_and_always_computes_its_last_token() -> None:
    pool = PrefixCachingBlockPool(8, BS)
    a = seq(0, 12, (10, 11, 12))  # 3 full blocks
    assert pool.cached_prefix_tokens(a) == 0
    assert pool.allocate(a, 12)
    assert pool.stats.queries == 12 and pool.stats.hits == 0
    b = seq(1, 12, (10, 11, 12))  # same 12 tokens: at most 11 may be reused -> 2 blocks
    assert pool.cached_prefix_tokens(b) == 8
    c = seq(2, 14, (10, 11, 99))  # shares two blocks, then differs
    assert pool.cached_prefix_tokens(c) == 8
    assert pool.allocate(b, 4, 8)
    assert pool.held[1][:2] == pool.held[0][:2]  # shared, not copied
    assert pool.ref[pool.held[0][0]] == 2
    assert pool.stats.hits == 8 and pool.stats.queries == 24
    pool.check()


def test_freed_blocks_stay_cached_and_are_evicted_lru_from_the_free_queue_head() -> None:
    pool = PrefixCachingBlockPool(4, BS)
    a = seq(0, 8, (1, 2))
    assert pool.allocate(a, 8)
    pool.release(a)  # its blocks join the tail, last block first: [.., .., b(2), b(1)]
    pool.check()
    assert pool.free == 4 and pool.cached_prefix_tokens(seq(5, 9, (1, 2))) == 8
    b = seq(1, 8, (7, 8))  # needs 2 new blocks: takes the two never-used ones first
    assert pool.allocate(b, 8)
    assert pool.stats.evictions == 0
    c = seq(2, 4, (9,))  # one more: evicts a's LAST block (key 2) before its first (key 1)
    assert pool.allocate(c, 4)
    assert pool.stats.evictions == 1
    assert pool.cached_prefix_tokens(seq(6, 9, (1, 2))) == 4
    pool.check()


def test_a_shared_block_in_use_is_never_evicted_and_a_failed_allocation_changes_nothing(
        ) -> None:
    pool = PrefixCachingBlockPool(3, BS)
    a = seq(0, 8, (1, 2))
    assert pool.allocate(a, 8)
    b = seq(1, 9, (1, 2))
    assert pool.allocate(b, 1, 8)  # hits both, needs one new block
    assert pool.free == 0
    before = (list(pool.ref), list(pool.key), dict(pool.held), pool.stats.queries)
    assert not pool.allocate(seq(2, 4, (5,)), 4)  # no free block: refused, nothing moved
    assert (list(pool.ref), list(pool.key), dict(pool.held), pool.stats.queries) == before
    pool.release(a)
    assert pool.free == 0  # b still holds a's blocks
    pool.release(b)
    assert pool.free == 3
    pool.check()


def test_the_check_catches_a_block_both_free_and_in_use() -> None:
    pool = PrefixCachingBlockPool(2, BS)
    assert pool.allocate(seq(0, 4, (1,)), 4)
    pool.free_queue[pool.held[0][0]] = None
    with pytest.raises(KvInvariantError, match="free queue"):
        pool.check()
    with pytest.raises(KvInvariantError):
        pool.check_counts()


def core_for(prompts: list[int], keys: list[tuple[int, ...]], arrivals: list[float], *,
             caching: bool, replicas: int = 1, routing: str = "jsq", blocks: int = 64,
             budget: int = 32, sarathi: bool = False, outputs: list[int] | None = None
             ) -> LlmCore:
    def make() -> VllmScheduler:
        if sarathi:
            return SarathiScheduler(num_blocks=blocks, block_size=BS, max_num_seqs=8,
                                    max_num_batched_tokens=budget,
                                    enable_prefix_caching=caching)
        return VllmScheduler(num_blocks=blocks, block_size=BS, max_num_seqs=8,
                             max_num_batched_tokens=budget, enable_prefix_caching=caching)
    out = outputs or [3] * len(prompts)
    return LlmCore(np.asarray(arrivals, dtype=float), np.asarray(prompts), np.asarray(out),
                   [make() for _ in range(replicas)], routing=routing, block_keys=keys,
                   affinity=PrefixAffinity(balance_abs_threshold=2))


MODEL = LinearStepModel(10.0, 0.5, 1.0, 0.0)


def test_the_second_turn_prefills_only_its_new_tokens_and_gets_its_first_token_sooner(
        ) -> None:
    # turn 2 (t = 1 s) extends turn 1's 16 tokens with 8 new ones
    core = core_for([16, 24], [(1, 2, 3, 4), (1, 2, 3, 4, 5, 6)], [0.0, 1.0], caching=True)
    simulate(core, MODEL)
    requests, steps, _, _ = tables(core)
    assert list(steps["prefill_tokens"][steps["prefill_tokens"] > 0]) == [16, 8]
    ttft_ms = (requests["first_token_s"] - requests["arrival_s"]).to_numpy() * 1e3
    assert ttft_ms == pytest.approx([10 + 0.5 * 16, 10 + 0.5 * 8])
    summary = prefix_cache_summary(core)
    assert summary["queries_tokens"] == 40 and summary["hits_tokens"] == 16
    assert summary["prefill_tokens_saved"] == 16
    check_pools(core)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(6, 60), replicas=st.integers(1, 3),
       routing=st.sampled_from(["jsq", "round_robin"]),
       policy=st.sampled_from(["vllm", "sarathi"]))
def test_caching_without_shared_blocks_gives_exactly_the_tables_of_caching_off(
        seed: int, blocks: int, replicas: int, routing: str, policy: str) -> None:
    # requests without block keys never hit (with keys, even a request's own blocks would
    # be hit when it is readmitted after a preemption): the pool must then allocate, preempt
    # and free exactly as the plain block manager does
    rng = np.random.default_rng(seed)
    n = 30
    prompts = [int(x) for x in rng.integers(1, 40, n)]
    arrivals = list(np.sort(rng.uniform(0, 0.5, n)))
    keys: list[tuple[int, ...]] = [() for _ in prompts]
    runs = []
    for caching in (False, True):
        core = core_for(prompts, keys, arrivals, caching=caching, blocks=blocks,
                        replicas=replicas, routing=routing, sarathi=policy == "sarathi")
        simulate(core, MODEL)
        core.close()
        runs.append(tables(core))
    for off, on in zip(*runs, strict=True):
        assert off.equals(on)


def test_affinity_follows_the_prefix_until_the_load_bound_then_joins_the_shortest_queue(
        ) -> None:
    pools = [VllmScheduler(num_blocks=16, block_size=BS, enable_prefix_caching=True)
             for _ in range(3)]
    a = seq(0, 12, (1, 2, 3))
    assert pools[2].kv.allocate(a, 12)
    rule = PrefixAffinity(balance_abs_threshold=2, balance_rel_threshold=1.5,
                          cache_threshold=0.5)
    b = seq(1, 13, (1, 2, 3))
    assert rule.choose(b, range(3), [1, 0, 2], pools) == 2  # balanced enough: the cache
    assert rule.choose(b, range(3), [1, 0, 3], pools) == 1  # 3 - 0 > 2: shortest queue
    assert rule.choose(seq(2, 13, (7, 8, 9)), range(3), [1, 0, 2], pools) == 1  # no match


POLICY = st.sampled_from(["vllm", "sarathi"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(6, 80), replicas=st.integers(1, 3),
       routing=st.sampled_from(["jsq", "round_robin", "prefix_affinity"]), policy=POLICY,
       shared=st.integers(1, 6))
def test_invariants_hold_at_every_step_on_random_shared_traces(
        seed: int, blocks: int, replicas: int, routing: str, policy: str,
        shared: int) -> None:
    rng = np.random.default_rng(seed)
    n = 40
    prefixes = [tuple(int(x) for x in rng.integers(0, 10**6, rng.integers(0, 5)))
                for _ in range(shared)]
    keys, prompts = [], []
    for i in range(n):
        own = tuple(10**7 + 100 * i + k for k in range(int(rng.integers(0, 4))))
        base = prefixes[int(rng.integers(shared))]
        keys.append(base + own)
        prompts.append((len(base) + len(own)) * BS + int(rng.integers(1, BS + 1)))
    arrivals = list(np.sort(rng.uniform(0, 0.3, n)))
    outputs = [int(x) for x in rng.integers(1, 6, n)]
    core = core_for(prompts, keys, arrivals, caching=True, replicas=replicas, routing=routing,
                    blocks=blocks, budget=int(rng.integers(8, 64)),
                    sarathi=policy == "sarathi", outputs=outputs)

    class Checked:
        def step_s(self, comp: Composition) -> float:
            check_pools(core)  # full check before every step
            return MODEL.step_s(comp)

    simulate(core, Checked())  # type: ignore[arg-type]
    counts = core.close()
    check_pools(core)
    assert sum(counts.values()) == n
    assert set(counts) <= {"ok", "rejected"}
    for sched in core.schedulers:
        assert sched.kv.used == 0  # every request ended: no block held
    summary = prefix_cache_summary(core)
    assert 0 <= summary["hits_tokens"] <= summary["queries_tokens"]
    requests = tables(core)[0]
    ok = requests[requests["status"] == "ok"]
    # the only tokens not computed are the cached ones (plus recomputation after preemption)
    cached = np.zeros(n, dtype=np.int64)
    for sched in core.schedulers:
        for i, c in sched.kv.stats.cached_tokens.items():  # type: ignore[union-attr]
            cached[i] = c
    assert (cached < np.asarray(prompts)).all()
    if summary["preempted_queries_tokens"] == 0:
        assert (ok["work_tokens"].to_numpy() == (ok["prompt_tokens"] + ok["output_tokens"] - 1
                                                 - cached[ok["id"]]).to_numpy()).all()


def scenario(**over: Any) -> dict[str, Any]:
    return {"service": {"kind": "llm_linear", "base_ms": 5, "per_prefill_token_ms": 0.1,
                        "per_decode_seq_ms": 0.2},
            "workload": {"kind": "hash_trace", "path": "builtin:synthetic_chat_blksz_16.jsonl",
                         "n_requests": 150},
            "policy": {"kind": "vllm", "num_gpu_blocks": 2000, **over}}


def test_scenario_switch_reports_vllm_counters_and_per_request_cached_tokens() -> None:
    from sim.llm import run

    off = run(scenario())
    on = run(scenario(enable_prefix_caching=True))
    assert "prefix_cache" not in off.summary and "cached_tokens" not in off.requests
    pc = on.summary["prefix_cache"]
    assert pc["hits_tokens"] == int(on.requests["cached_tokens"].sum())
    assert pc["queries_tokens"] == int(on.requests["prompt_tokens"].sum())
    assert 0 < pc["hit_rate"] < 1
    assert on.summary["ttft_ms"]["p50"] < off.summary["ttft_ms"]["p50"]
    assert int(on.steps["prefill_tokens"].sum()) == int(
        off.steps["prefill_tokens"].sum()) - pc["prefill_tokens_saved"]


def test_a_preempted_request_reuses_its_own_cached_prompt_blocks() -> None:
    # 6 blocks of 4 tokens cannot hold both (9 + 8 tokens each): B is preempted at 13 tokens
    works = {}
    for caching in (False, True):
        core = core_for([9, 9], [(1, 2), (3, 4)], [0.0, 0.0], caching=caching, blocks=6,
                        outputs=[8, 8])
        simulate(core, MODEL)
        core.close()
        requests = tables(core)[0]
        assert list(requests["preemptions"]) == [0, 1]
        works[caching] = list(requests["work_tokens"])
    summary = prefix_cache_summary(core)
    assert summary["preempted_queries_tokens"] == 13  # 9 prompt + 4 outputs
    assert summary["preempted_hits_tokens"] == 8  # its two full prompt blocks
    assert summary["hits_tokens"] == 0  # nothing shared between A and B
    assert works[True] == [16, works[False][1] - 8]


def test_prefix_affinity_without_caching_is_refused_with_the_fields_named() -> None:
    from sim.llm import load_llm_scenario
    from sim.scenario.schema import ScenarioError

    with pytest.raises(ScenarioError, match="enable_prefix_caching"):
        load_llm_scenario({**scenario(), "routing": "prefix_affinity"})


def test_a_cached_prefix_prices_the_new_tokens_attention_to_it_and_within_the_chunk() -> None:
    # turn 2 computes 8 new tokens starting at 16 cached ones: 8 tokens, 8 × 16 pairs to the
    # prefix, 8² within the chunk, one prefill chunk
    model = LinearStepModel(10.0, 0.5, 1.0, 0.0, per_prefill_context_ms=0.01,
                            per_prefill_sq_ms=0.005, per_prefill_seq_ms=2.0)
    core = core_for([16, 24], [(1, 2, 3, 4), (1, 2, 3, 4, 5, 6)], [0.0, 1.0], caching=True)
    simulate(core, model)
    requests, steps, _, _ = tables(core)
    prefill = steps[steps["prefill_tokens"] > 0]
    assert list(prefill["prefill_context"]) == [0, 8 * 16]
    ttft_ms = (requests["first_token_s"] - requests["arrival_s"]).to_numpy() * 1e3
    assert ttft_ms == pytest.approx([10 + 0.5 * 16 + 0.005 * 16**2 + 2,
                                     10 + 0.5 * 8 + 0.01 * 8 * 16 + 0.005 * 8**2 + 2])
    # caching off: the whole 24-token prompt, no prefix, 24² within the chunk
    core = core_for([16, 24], [(1, 2, 3, 4), (1, 2, 3, 4, 5, 6)], [0.0, 1.0], caching=False)
    simulate(core, model)
    requests, _, _, _ = tables(core)
    ttft_ms = (requests["first_token_s"] - requests["arrival_s"]).to_numpy() * 1e3
    assert ttft_ms[1] == pytest.approx(10 + 0.5 * 24 + 0.005 * 24**2 + 2)
