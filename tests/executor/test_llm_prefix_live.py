"""Live KV reuse: the live engine follows the simulator's prefix-cache decisions and copies
cached blocks into its slots (:mod:`executor.llm_driver`, ``LlamaDecoder.load_blocks``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sim.llm  # noqa: E402
from calibration.llm_decoder import DecoderConfig, LlamaDecoder, StepEntry  # noqa: E402
from executor.live_llm import live_llm  # noqa: E402

TINY = {"shape": "small", "hidden": 64, "layers": 1, "heads": 2, "kv_heads": 1,
        "intermediate": 128, "vocab": 256, "max_slots": 16, "max_len": 512}
# the shipped chat trace's first seconds, compressed
TRACE: dict[str, Any] = {"workload.duration_s": 12, "workload.time_scale": 0.5}
DRAIN_S = 600.0  # a loaded machine may slow the run a lot: every request must finish


def test_blocks_saved_and_loaded_give_the_logits_of_a_whole_prefill() -> None:
    torch.set_num_threads(1)
    dec = LlamaDecoder(DecoderConfig(hidden=64, layers=2, heads=4, kv_heads=2,
                                     intermediate=128, vocab=100, max_slots=3, max_len=67))
    dec.attach_block_store(10, 8)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (40,), generator=gen)
    other = torch.randint(0, 100, (40,), generator=gen)
    whole = dec.step([StepEntry(0, 0, 40)], token_ids=ids, return_logits=True)
    dec.save_blocks(0, [(0, 5), (1, 2), (2, 7), (3, 1)])  # any store ids, in any order
    dec.step([StepEntry(1, 0, 40)], token_ids=other)
    dec.save_blocks(1, [(0, 9), (1, 8)])
    for slot, blocks, start in ((1, [5, 2, 7, 1], 32), (2, [5, 2], 16)):
        dec.load_blocks(slot, blocks)
        rest = dec.step([StepEntry(slot, start, 40 - start)], token_ids=ids[start:],
                        return_logits=True)
        assert float((whole - rest).abs().max()) < 1e-5
    dec.load_blocks(2, [9, 8])  # another prompt's prefix: the logits change
    wrong = dec.step([StepEntry(2, 16, 24)], token_ids=ids[16:], return_logits=True)
    assert float((whole - wrong).abs().max()) > 1e-3


def _same_decisions(simulated: Any, replayed: Any) -> None:
    s, r = simulated.summary["prefix_cache"], replayed.summary["prefix_cache"]
    for key in ("queries_tokens", "hits_tokens", "evictions", "prefill_tokens_saved"):
        assert r[key] == s[key], key
    a = simulated.requests.set_index("id")
    b = replayed.requests.set_index("id")
    assert (a["cached_tokens"] == b["cached_tokens"]).all()
    # the steps computed exactly the tokens that were not cached
    assert replayed.steps["prefill_tokens"].sum() == simulated.steps["prefill_tokens"].sum()


def test_live_takes_the_simulators_cache_decisions_on_the_shipped_trace() -> None:
    simulated = sim.llm.run("builtin:llm-prefix-cache", TRACE)
    replayed = live_llm("builtin:llm-prefix-cache", TRACE, replay=True,
                        drain_timeout_s=DRAIN_S)
    assert simulated.summary["prefix_cache"]["hit_rate"] > 0.3  # the trace shares a lot
    _same_decisions(simulated, replayed)


def test_live_takes_the_simulators_evictions(tmp_path: Any) -> None:
    """A cache too small for the shared prefixes: least recently used blocks are evicted.
    Requests 0.25 s apart that take ~30 ms each, so a slow machine cannot reorder them.
    """
    order = [0, 0, 1, 0, 2, 2, 1, 3, 0, 3, 3, 1, 2, 0, 1, 1]
    rows = ["timestamp,input_length,output_length,hash_ids"]
    for k, sp in enumerate(order):
        ids = [100 * sp + j for j in range(8)] + [1000 + 10 * k + j for j in range(4)]
        rows.append(f"{0.25 * k},{16 * 12},8,{' '.join(map(str, ids))}")
    path = tmp_path / "spaced.csv"
    path.write_text("\n".join(rows) + "\n")
    cfg = {"seed": 0,
           "service": {"kind": "llm_linear", "base_ms": 2, "per_prefill_token_ms": 0.05,
                       "per_decode_seq_ms": 0.1},
           "workload": {"kind": "hash_trace", "path": str(path), "format": "csv",
                        "block_size": 16},
           "policy": {"kind": "vllm", "num_gpu_blocks": 30, "block_size": 16,
                      "max_num_seqs": 8, "max_num_batched_tokens": 512,
                      "enable_prefix_caching": True}, "warmup_s": 0}
    simulated = sim.llm.run(cfg)
    replayed = live_llm(cfg, replay=True, drain_timeout_s=DRAIN_S)
    pc = simulated.summary["prefix_cache"]
    assert pc["evictions"] > 0 and pc["hits_tokens"] > 0
    _same_decisions(simulated, replayed)


def test_live_compares_with_the_simulator_with_caching_on() -> None:
    """TTFT live (stand-in decoder) against simulated with caching on, at a light load: the
    simulator replaying this run's own step periods, as the replay test of
    tests/executor/test_llm_live.py compares them (within three standard errors of the p50
    difference, beyond what a replay cannot replay: arrivals picked up late, the gap after a
    first token's step); and caching shortens TTFT in the simulator. Had the live engine
    prefilled the cached tokens, its steps would hold more prefill tokens than the
    simulator's (``_same_decisions``), and each step sleeps at least the step model's time for
    what it holds.
    """
    from tests.executor.test_llm_live import _assert_ttft_within_replay

    cfg: dict[str, Any] = {
        "seed": 0,
        "service": {"kind": "llm_linear", "base_ms": 1, "per_prefill_token_ms": 0.01,
                    "per_decode_seq_ms": 0.05},
        "workload": {"kind": "hash_trace", "path": "builtin:synthetic_chat_blksz_16.jsonl",
                     "n_requests": 30, "time_scale": 0.2},
        "policy": {"kind": "vllm", "num_gpu_blocks": 4096, "block_size": 16,
                   "max_num_seqs": 16, "max_num_batched_tokens": 2048,
                   "enable_prefix_caching": True}, "warmup_s": 0}
    simulated = sim.llm.run(cfg)
    off = sim.llm.run(cfg, {"policy.enable_prefix_caching": False})
    replayed = live_llm(cfg, replay=True, drain_timeout_s=DRAIN_S)
    _same_decisions(simulated, replayed)

    def ttft_s(result: Any) -> float:
        req = result.requests
        return float((req["first_token_s"] - req["arrival_s"]).median())

    assert ttft_s(simulated) < 0.8 * ttft_s(off)
    svc = cfg["service"]
    asked_s = (svc["base_ms"] + svc["per_prefill_token_ms"] * replayed.steps["prefill_tokens"]
               + svc["per_decode_seq_ms"] * replayed.steps["decode_seqs"]) / 1e3
    assert (replayed.steps["duration_s"] >= asked_s - 1e-9).all()  # a sleep never ends early
    _assert_ttft_within_replay(cfg, replayed)


def test_a_live_run_on_the_real_decoder_copies_exactly_the_hit_blocks() -> None:
    cfg = {"seed": 1,
           "service": {"kind": "llm_linear", "base_ms": 1, "per_prefill_token_ms": 0.01,
                       "per_decode_seq_ms": 0.05},
           "workload": {"kind": "hash_trace", "path": "builtin:synthetic_chat_blksz_16.jsonl",
                        "n_requests": 12, "time_scale": 0.05},
           "policy": {"kind": "vllm", "num_gpu_blocks": 600, "block_size": 16,
                      "max_num_seqs": 8, "max_num_batched_tokens": 512,
                      "enable_prefix_caching": True},
           "model": {"params": {**TINY, "max_len": 4096}, "device": "cpu", "threads": 1}}
    result = live_llm(cfg, drain_timeout_s=DRAIN_S)
    req = result.requests
    assert (req["status"] == "ok").all() and not result.meta["step_errors"]
    pc = result.summary["prefix_cache"]
    copies = result.meta["kv_copies"][0]
    assert pc["hits_tokens"] > 0
    assert copies["loaded_tokens"] == pc["prefill_tokens_saved"] == int(
        req["cached_tokens"].sum()) + pc["preempted_hits_tokens"]
    # every full prompt block not hit is saved once, when computed (again after a preemption)
    expected = int(np.sum(req["prompt_tokens"] // 16 * 16 - req["cached_tokens"]))
    if (req["preemptions"] == 0).all():
        assert copies["saved_tokens"] == expected
    else:
        assert copies["saved_tokens"] > expected
    assert copies["copy_s"] > 0
