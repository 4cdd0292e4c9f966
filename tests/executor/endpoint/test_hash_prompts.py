"""Token-id prompts that realise a hash-block trace's ids (executor/endpoint/hash_prompts.py)."""

from __future__ import annotations

import numpy as np

from executor.endpoint.bench import trace_prompts
from executor.endpoint.hash_prompts import hash_prompts
from sim.drivers.llm_simulate import llm_schedule
from sim.scenario.hash_trace import read_hash_trace, trace_keys
from sim.scenario.llm import load_llm_scenario


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_equal_ids_give_equal_blocks_and_the_rest_is_private() -> None:
    ids = [(1, 2, 3), (1, 2, 4, 5), (9,), (1, 2, 3)]
    lengths = np.array([40, 64, 30, 48])
    prompts = hash_prompts(ids, lengths, 16, (10, 250), seed=0)
    assert [len(p) for p in prompts] == [40, 64, 30, 48]
    assert all(10 <= v < 250 for p in prompts for v in p)
    assert _common(prompts[0], prompts[1]) == 32  # ids 1, 2 shared, then 3 vs 4
    assert prompts[3][:40] == prompts[0]  # the same ids; 40 tokens cut block 3 short
    assert _common(prompts[3][40:], [0] * 8) == 0 and len(prompts[3]) == 48
    assert prompts[2][16:] != prompts[0][16:30]  # past its ids: the request's own tokens
    again = hash_prompts(ids, lengths, 16, (10, 250), seed=0)
    other = hash_prompts(ids, lengths, 16, (10, 250), seed=1)
    assert again == prompts
    assert _common(other[0], prompts[0]) < 16  # a new seed: new content for every id


def test_bench_prompts_share_exactly_what_the_simulators_keys_share() -> None:
    scn = load_llm_scenario("builtin:llm-prefix-cache", {"workload.n_requests": 60,
                                                         "policy.block_size": 128})
    schedule, prompt, _ = llm_schedule(scn)
    prompts = trace_prompts(scn, schedule.rows, prompt, (10, 250), None)
    assert prompts is not None and [len(p) for p in prompts] == prompt.tolist()
    trace = read_hash_trace("builtin:synthetic_chat_blksz_16.jsonl", "auto", None)
    keys = [trace_keys(trace, 128)[i] for i in schedule.rows]
    shared = 0
    for i in range(len(prompts)):
        for j in range(i):
            blocks = min(len(prompts[i]), len(prompts[j])) // 128
            same = [prompts[i][k * 128:(k + 1) * 128] == prompts[j][k * 128:(k + 1) * 128]
                    for k in range(blocks)]
            # a server block is shared exactly when the simulator's key is
            common_keys = _common(list(keys[i]), list(keys[j]))
            assert same[:common_keys] == [True] * common_keys
            if common_keys < blocks:
                assert not same[common_keys]
            shared += common_keys
    assert shared > 50
    random = trace_prompts(load_llm_scenario("builtin:llm-demo"), None, prompt, (10, 250),
                           None)
    assert random is None
