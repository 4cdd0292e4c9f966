"""Offered load against capacity (the LLM sweep's ρ), trace slices and truncated columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.drivers.llm_simulate import tables
from sim.experiments.llm_load import load_overrides, offered_rps, saturated_core, saturation_rps
from sim.llm import run
from sim.metrics.prefix import prefix_cache_summary
from sim.scenario.llm import load_llm_scenario
from sim.scenario.workloads import WorkloadError, data_path

AZURE = "builtin:azure_llm_2023_conv.csv"


def linear(policy: dict[str, Any], **workload: Any) -> dict[str, Any]:
    return {"seed": 4,
            "service": {"kind": "llm_linear", "base_ms": 10, "per_prefill_token_ms": 0.1,
                        "per_decode_seq_ms": 1.0},
            "workload": {"kind": "poisson", "rate_rps": 5, "duration_s": 60, **workload},
            "policy": {"kind": "vllm", "num_gpu_blocks": 10_000, **policy}}


def test_capacity_of_one_sequence_at_a_time_is_one_over_its_steps() -> None:
    # a prefill step of 10 + 100 x 0.1 ms gives the first token, 4 decode steps of 11 ms the
    # rest: 64 ms per request
    cfg = linear({"max_num_seqs": 1, "max_num_batched_tokens": 128},
                 prompt_tokens=100, output_tokens=5)
    assert saturation_rps(load_llm_scenario(cfg)) == pytest.approx(1000 / 64, rel=1e-9)


def test_below_capacity_the_engine_keeps_up_and_past_it_finishes_the_capacity() -> None:
    cfg = linear({"max_num_seqs": 8, "max_num_batched_tokens": 256},
                 prompt_tokens={"dist": "lognormal", "mean": 200, "cv": 0.5, "max": 600},
                 output_tokens={"dist": "uniform", "low": 10, "high": 50}, duration_s=120)
    scn = load_llm_scenario(cfg)
    capacity = saturation_rps(scn)
    assert saturation_rps(load_llm_scenario(cfg, {"policy.max_num_seqs": 2})) < capacity
    below = run(cfg, load_overrides(scn, 0.5, capacity)).summary
    n = below["offered_rps"] * 120
    assert below["stability"]["verdict"] == "stable"
    # every arrival in the window finishes: throughput is the offered rate up to the edges
    assert below["throughput_rps"] == pytest.approx(below["offered_rps"], rel=3 / np.sqrt(n))
    past = run(cfg, load_overrides(scn, 1.3, capacity), drain_timeout_s=1.0).summary
    assert past["censored"] > 0 and past["stability"]["verdict"] != "stable"
    # completions per second saturate at the capacity: the token mix of ~capacity x 120
    # completions (uniform outputs, cv 0.5 prompts) varies by a few per cent
    done = capacity * 120
    assert past["throughput_rps"] == pytest.approx(capacity, rel=4 * 0.5 / np.sqrt(done))


def test_a_trace_is_loaded_by_compressing_its_time_with_its_pattern_kept() -> None:
    cfg = linear({"max_num_seqs": 8}, kind="trace", path=AZURE, n_requests=200,
                 duration_s=None, rate_rps=None, prompt_tokens_column="ContextTokens",
                 output_tokens_column="GeneratedTokens")
    cfg["workload"] = {k: v for k, v in cfg["workload"].items() if v is not None}
    scn = load_llm_scenario(cfg)
    over = load_overrides(scn, 0.5, 10.0)
    loaded = load_llm_scenario(cfg, over)
    assert offered_rps(loaded) == pytest.approx(5.0, rel=1e-9)
    a, b = run(cfg).requests, run(cfg, over).requests
    assert (b["arrival_s"] / a["arrival_s"]).iloc[1:].to_numpy() == pytest.approx(
        over["workload.time_scale"], rel=1e-9)
    assert b["prompt_tokens"].equals(a["prompt_tokens"])
    with pytest.raises(WorkloadError, match="mmpp"):
        load_overrides(load_llm_scenario({**cfg, "workload": {
            "kind": "mmpp", "rates_rps": [1, 2], "mean_dwell_s": 1, "n_requests": 5,
            "prompt_tokens": 5, "output_tokens": 5}}), 0.5, 1.0)


def test_a_trace_slice_starts_at_start_s_and_keeps_its_rows_tokens_truncated() -> None:
    frame = pd.read_csv(data_path(AZURE))
    t = (pd.to_datetime(frame["TIMESTAMP"], format="mixed") - pd.to_datetime(
        frame["TIMESTAMP"], format="mixed").min()).dt.total_seconds().to_numpy()
    first = int(np.searchsorted(t, 600.0))
    cfg = linear({"max_num_seqs": 8}, kind="trace", path=AZURE, n_requests=50,
                 start_s=600, prompt_tokens_column="ContextTokens", prompt_tokens_max=1024,
                 output_tokens_column="GeneratedTokens", output_tokens_max=256)
    cfg["workload"].pop("rate_rps")
    cfg["workload"].pop("duration_s")
    req = run(cfg).requests
    rows = frame.iloc[first:first + 50]
    assert req["arrival_s"].to_numpy() == pytest.approx(t[first:first + 50] - 600)
    assert req["prompt_tokens"].tolist() == np.minimum(rows["ContextTokens"], 1024).tolist()
    assert req["output_tokens"].tolist() == np.minimum(rows["GeneratedTokens"], 256).tolist()
    assert (rows["ContextTokens"] > 1024).any()  # the cap did something


@pytest.mark.parametrize(("change", "text"), [
    ({"start_s": 1e9}, "workload.start_s: 1e+09 s is past the trace's last row"),
    ({"prompt_tokens": 10, "output_tokens": 10, "prompt_tokens_max": 5},
     "workload.prompt_tokens_max: truncates prompt_tokens_column, which is not given"),
])
def test_bad_trace_slices_are_one_line_naming_the_field(change: dict[str, Any],
                                                        text: str) -> None:
    cfg = linear({}, kind="trace", path=AZURE, n_requests=5,
                 prompt_tokens_column="ContextTokens", output_tokens_column="GeneratedTokens")
    for key in ("rate_rps", "duration_s"):
        cfg["workload"].pop(key)
    if "prompt_tokens" in change:
        for key in ("prompt_tokens_column", "output_tokens_column"):
            cfg["workload"].pop(key)
    cfg["workload"].update(change)
    with pytest.raises(Exception) as info:
        run(cfg)
    assert text in str(info.value) and "\n" not in str(info.value).strip()


def test_the_capacity_of_a_hash_trace_counts_its_prefix_hits_and_no_hits_across_passes(
        ) -> None:
    # the shipped chat trace's first 20 requests cycled to 60: with caching on, each pass
    # hits as the trace does (its own contents per pass), and the capacity grows with it
    over = {"workload.n_requests": 20}
    on = load_llm_scenario("builtin:llm-prefix-cache", over)
    off = load_llm_scenario("builtin:llm-prefix-cache",
                            {**over, "policy.enable_prefix_caching": False})
    one_pass = prefix_cache_summary(saturated_core(on, 20))
    three = prefix_cache_summary(saturated_core(on, 60))
    assert one_pass["hit_rate"] > 0.3
    # passes share no block: three passes hit exactly three times one pass's tokens (the
    # cache holds far more than one pass, so no pass evicts another's hits)
    assert three["hits_tokens"] == 3 * one_pass["hits_tokens"]
    assert three["queries_tokens"] == 3 * one_pass["queries_tokens"]
    # the saturated engine computes only the uncached tokens (none preempted here), so it
    # completes the same requests sooner
    core = saturated_core(on, 60)
    _, steps, _, _ = tables(core)
    assert three["preempted_queries_tokens"] == 0
    computed = int(steps["prefill_tokens"].sum())
    assert computed == int(core.prompt_tokens.sum()) - three["hits_tokens"]
    assert saturation_rps(on, 60) > saturation_rps(off, 60)
