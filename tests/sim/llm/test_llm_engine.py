"""The LLM simulator: hand-computed steps, schedulers' rules, invariants, metrics, bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.llm import run

BASE_MS, PP_MS, PD_MS = 10.0, 0.1, 1.0


def scenario(arrivals: list[float] | None = None, *, prompt: Any = 100, output: Any = 5,
             policy: dict[str, Any] | None = None, kv_ms: float = 0.0,
             **extra: Any) -> dict[str, Any]:
    workload: dict[str, Any] = {"kind": "constant", "rate_rps": 1.0, "n_requests": 1,
                                "prompt_tokens": prompt, "output_tokens": output}
    cfg: dict[str, Any] = {
        "seed": 1,
        "service": {"kind": "llm_linear", "base_ms": BASE_MS, "per_prefill_token_ms": PP_MS,
                    "per_decode_seq_ms": PD_MS, "per_kv_token_ms": kv_ms},
        "workload": workload,
        "policy": policy or {"kind": "vllm", "num_gpu_blocks": 1000},
        **extra,
    }
    if arrivals is not None:  # simultaneous arrivals: a huge constant rate
        cfg["workload"] = {**workload, "rate_rps": 1e9, "n_requests": len(arrivals)}
    return cfg


def test_one_request_ttft_is_the_prefill_step_and_e2e_adds_the_decode_steps() -> None:
    result = run(scenario(kv_ms=0.01))
    req = result.requests.iloc[0]
    ttft_ms = BASE_MS + PP_MS * 100
    decode_ms = [BASE_MS + PD_MS + 0.01 * (100 + k) for k in range(4)]  # context grows
    assert (req["first_token_s"] - req["arrival_s"]) * 1e3 == pytest.approx(ttft_ms)
    assert (req["finish_s"] - req["arrival_s"]) * 1e3 == pytest.approx(ttft_ms + sum(decode_ms))
    s = result.summary
    assert s["ttft_ms"]["p50"] == pytest.approx(ttft_ms)
    assert s["tpot_ms"]["p50"] == pytest.approx(sum(decode_ms) / 4)
    assert sorted(result.summary["itl_ms"][k] for k in ("max",)) == [pytest.approx(
        max(decode_ms))]
    assert np.diff(result.tokens["time_s"]) * 1e3 == pytest.approx(decode_ms)
    assert list(result.steps["prefill_tokens"]) == [100, 0, 0, 0, 0]
    assert list(result.steps["kv_tokens"]) == [0, 100, 101, 102, 103]


def test_two_requests_with_chunked_prefill_step_by_step() -> None:
    # budget 64: A (100 prompt, 3 out) and B (30 prompt, 2 out) arrive together
    cfg = scenario([0, 0], prompt={"dist": "constant", "value": 1}, output=1,
                   policy={"kind": "vllm", "num_gpu_blocks": 1000, "max_num_seqs": 8,
                           "max_num_batched_tokens": 64})
    from sim.drivers.llm_simulate import build_scheduler, build_step_model, simulate, tables
    from sim.scenario.llm import load_llm_scenario
    from sim.serving.llm.core import LlmCore

    scn = load_llm_scenario(cfg)
    core = LlmCore(np.array([0.0, 0.0]), np.array([100, 30]), np.array([3, 2]),
                   build_scheduler(scn))
    simulate(core, build_step_model(scn))
    _, steps, tokens, _ = tables(core)
    # step 1: A's first 64 prompt tokens (nothing left for B); step 2: A's last 36 and B's
    # first 28; step 3: A decodes, B's last 2 prompt tokens; step 4: both decode
    assert list(steps["prefill_tokens"]) == [64, 64, 2, 0]
    assert list(steps["decode_seqs"]) == [0, 0, 1, 2]
    assert list(steps["num_seqs"]) == [1, 2, 2, 2]
    # the chunks' attention to their cached prefix: tokens x start
    assert list(steps["prefill_context"]) == [0, 36 * 64, 2 * 28, 0]
    step_ms = [BASE_MS + PP_MS * 64, BASE_MS + PP_MS * 64, BASE_MS + PP_MS * 2 + PD_MS,
               BASE_MS + 2 * PD_MS]
    ends = np.cumsum(step_ms) / 1e3
    a = tokens[tokens["id"] == 0]["time_s"].to_numpy()
    b = tokens[tokens["id"] == 1]["time_s"].to_numpy()
    assert a == pytest.approx(ends[[1, 2, 3]])  # A's first token when its prompt is done
    assert b == pytest.approx(ends[[2, 3]])


def test_static_batching_with_equal_outputs_matches_the_request_level_batch_timing() -> None:
    prompt, output, batch, wait_ms = 50, 8, 4, 20.0
    llm = run({"seed": 3, "service": {"kind": "llm_linear", "base_ms": BASE_MS,
                                      "per_prefill_token_ms": PP_MS, "per_decode_seq_ms": PD_MS},
               "workload": {"kind": "poisson", "rate_rps": 30, "n_requests": 300,
                            "prompt_tokens": prompt, "output_tokens": output},
               "policy": {"kind": "static", "max_batch_size": batch, "max_wait_ms": wait_ms}})
    # a batch of b: one prefill step and (output - 1) decode steps of b rows
    reqlevel = sim.run({"seed": 3, "service": {
        "kind": "linear", "base_ms": output * BASE_MS,
        "per_item_ms": PP_MS * prompt + (output - 1) * PD_MS, "deterministic": True},
        "workload": {"kind": "poisson", "rate_rps": 30, "n_requests": 300},
        "policy": {"kind": "dynamic", "max_batch_size": batch, "max_wait_ms": wait_ms,
                   "timer": "request"}})
    a = llm.requests.sort_values("id")
    b = reqlevel.requests.sort_values("id")
    assert np.array_equal(a["arrival_s"], b["arrival_s"])
    assert a["finish_s"].to_numpy() == pytest.approx(b["finish_s"].to_numpy(), abs=1e-9)


def test_preemption_happens_when_blocks_are_scarce_and_loses_nothing() -> None:
    cfg = scenario(policy={"kind": "vllm", "num_gpu_blocks": 40, "block_size": 16,
                           "max_num_batched_tokens": 512},
                   prompt={"dist": "uniform", "low": 50, "high": 200},
                   output={"dist": "uniform", "low": 50, "high": 300})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 20,
                       "n_requests": 200}
    result = run(cfg)
    s = result.summary
    assert s["preemptions"] > 10 and s["recomputed_tokens"] > 0
    assert s["ok"] == 200 and s["rejected"] == 0
    per_request = result.tokens.groupby("id").size()
    assert (per_request.to_numpy() == result.requests["output_tokens"].to_numpy()).all()
    assert result.steps["kv_blocks_used"].max() <= 40
    assert s["stability"]["verdict"] in ("saturated", "unstable")


def test_a_request_larger_than_the_kv_cache_is_rejected_with_the_reason() -> None:
    cfg = scenario(policy={"kind": "vllm", "num_gpu_blocks": 4, "block_size": 16},
                   prompt=100, output=10)
    result = run(cfg)
    assert list(result.requests["status"]) == ["rejected"]
    assert list(result.requests["reason"]) == ["kv_cache_too_small"]


def test_v0_prefill_first_never_mixes_prefill_and_decode() -> None:
    cfg = scenario(policy={"kind": "vllm", "num_gpu_blocks": 2000, "prefill_first": True,
                           "max_num_batched_tokens": 4096},
                   prompt={"dist": "uniform", "low": 20, "high": 400},
                   output={"dist": "uniform", "low": 1, "high": 60})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 30,
                       "n_requests": 300}
    steps = run(cfg).steps
    mixed = (steps["prefill_tokens"] > 0) & (steps["decode_seqs"] > 0)
    assert not mixed.any() and (steps["prefill_tokens"] > 0).any()
    v1 = run({**cfg, "policy": {**cfg["policy"], "prefill_first": False}}).steps
    assert ((v1["prefill_tokens"] > 0) & (v1["decode_seqs"] > 0)).any()


def test_sarathi_runs_every_decode_in_every_step_within_its_budget() -> None:
    cfg = scenario(policy={"kind": "sarathi", "num_gpu_blocks": 5000, "max_num_seqs": 64,
                           "max_num_batched_tokens": 128},
                   prompt={"dist": "uniform", "low": 100, "high": 800},
                   output={"dist": "uniform", "low": 5, "high": 80})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 15,
                       "n_requests": 200}
    result = run(cfg)
    steps = result.steps
    assert ((steps["prefill_tokens"] + steps["decode_seqs"]) <= 128).all()
    assert ((steps["prefill_tokens"] > 0) & (steps["decode_seqs"] > 0)).any()
    # a smaller budget spreads prefill over more steps: TTFT up, TPOT down (chunking trade)
    big = run({**cfg, "policy": {**cfg["policy"], "max_num_batched_tokens": 2048}}).summary
    small = result.summary
    assert small["tpot_ms"]["p99"] < big["tpot_ms"]["p99"]
    assert small["ttft_ms"]["p50"] > big["ttft_ms"]["p50"]


def test_continuous_reserves_the_whole_output_and_never_preempts() -> None:
    cfg = scenario(policy={"kind": "continuous", "num_gpu_blocks": 60, "block_size": 16},
                   prompt={"dist": "uniform", "low": 50, "high": 200},
                   output={"dist": "uniform", "low": 50, "high": 300})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 20,
                       "n_requests": 150}
    result = run(cfg)
    assert result.summary["preemptions"] == 0 and result.summary["ok"] == 150
    assert result.steps["kv_blocks_used"].max() <= 60
    paged = run({**cfg, "policy": {"kind": "vllm", "num_gpu_blocks": 60}}).steps
    # paging packs more sequences into the same cache
    assert paged["num_seqs"].mean() > result.steps["num_seqs"].mean()


def test_same_seed_same_tables_different_seed_differs() -> None:
    cfg = scenario(prompt={"dist": "lognormal", "mean": 300, "cv": 1.0},
                   output={"dist": "lognormal", "mean": 50, "cv": 1.0})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 5,
                       "n_requests": 100}
    a, b = run(cfg), run(cfg)
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert a.tokens.equals(b.tokens)
    c = run({**cfg, "seed": 2})
    assert not np.array_equal(a.requests["arrival_s"], c.requests["arrival_s"])


def test_the_azure_trace_columns_work_as_they_are() -> None:
    result = run("builtin:llm-demo", overrides={"workload.n_requests": 300, "warmup_s": 0})
    req = result.requests
    assert len(req) == 300
    assert req["prompt_tokens"].iloc[:2].tolist() == [374, 396]
    assert req["output_tokens"].iloc[:2].tolist() == [44, 109]
    assert result.summary["ok"] == 300
    from tests.conftest import SHARED_DATA

    original = SHARED_DATA / "azure_llm_2023_conv.csv"
    if original.exists():  # the public file as published, not only the shipped copy
        again = run("builtin:llm-demo", overrides={"workload.n_requests": 300, "warmup_s": 0,
                                                   "workload.path": str(original)})
        assert again.requests["prompt_tokens"].equals(req["prompt_tokens"])


def test_throughput_counts_completions_when_a_backlog_remains_at_the_horizon() -> None:
    # each request needs ~10 + 100 x 0.1 ms of prefill and 20 decodes: one engine finishes
    # far fewer than the 200 req/s offered
    cfg = scenario(prompt=100, output=20,
                   policy={"kind": "vllm", "num_gpu_blocks": 100_000, "max_num_seqs": 4})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 200,
                       "duration_s": 10, "n_requests": None}
    cfg["workload"].pop("n_requests")
    result = run(cfg, drain_timeout_s=1.0)
    s = result.summary
    # 4 sequences at a time, a decode step of 4 takes 14 ms: at most 4 x 1000 / 14 / 20
    # completions per second
    assert s["offered_rps"] == pytest.approx(200, rel=0.05)
    assert s["throughput_rps"] < 20
    assert s["censored"] > 1000
    assert s["stability"]["verdict"] == "unstable"


def test_goodput_needs_an_slo_and_counts_requests_meeting_both() -> None:
    cfg = scenario(prompt={"dist": "uniform", "low": 10, "high": 500}, output=20)
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 10,
                       "duration_s": 30, "n_requests": None}
    cfg["workload"].pop("n_requests")
    assert run(cfg).summary["goodput_rps"] is None
    s = run({**cfg, "slo": {"ttft_ms": 40, "tpot_ms": 100}}).summary
    req = run(cfg).requests
    ttft_ms = (req["first_token_s"] - req["arrival_s"]) * 1e3
    done = (req["finish_s"] <= 30) & (req["status"] == "ok")
    assert s["goodput_rps"] == pytest.approx(float(((ttft_ms <= 40) & done).sum()) / 30)
    assert 0 < s["goodput_rps"] < s["throughput_rps"]


@pytest.mark.parametrize(("change", "text"), [
    ({"workload": {"kind": "poisson", "rate_rps": 1, "n_requests": 3, "prompt_tokens": 10}},
     "workload.output_tokens: required"),
    ({"policy": {"kind": "orca"}}, "policy.kind: unknown value 'orca'"),
    ({"policy": {"kind": "vllm", "num_gpu_blocks": 10, "max_num_seq": 3}},
     "policy.max_num_seq: unknown key; allowed keys here:"),
    ({"policy": {"kind": "vllm"}}, "policy.num_gpu_blocks: give it, or gpu_memory_gb"),
    ({"policy": {"kind": "vllm", "num_gpu_blocks": 10, "gpu_memory_gb": 1,
                 "kv_bytes_per_token": 2}}, "not both"),
    ({"workload": {"kind": "poisson", "rate_rps": 1, "n_requests": 3, "prompt_tokens": 10,
                   "output_tokens": {"dist": "lognormal", "mean": 10, "cv": 0}}}, "cv"),
    ({"workload": {"kind": "poisson", "rate_rps": 1, "n_requests": 3, "prompt_tokens": 10,
                   "output_tokens": {"dist": "uniform", "low": 9, "high": 3}}},
     "high: must be >= low"),
    ({"workload": {"kind": "trace", "path": "builtin:azure_llm_2023_conv.csv",
                   "prompt_tokens_column": "Prompt", "output_tokens": 10}},
     "workload.prompt_tokens_column: column 'Prompt' not in"),
    ({"service": {"kind": "llm_linear", "base_ms": -1}}, "service.base_ms"),
    ({"slo": {"ttft": 5}}, "slo.ttft: unknown key"),
    ({"policy": {"kind": "vllm", "num_gpu_blocks": 10, "max_num_seqs": 64,
                 "max_num_batched_tokens": 32}}, "is below max_num_seqs 64"),
    ({"replicas": 0}, "replicas"),
    ({"routing": "shared"}, "routing"),
])
def test_bad_llm_input_is_one_line_naming_the_field(change: dict[str, Any], text: str) -> None:
    with pytest.raises(sim.ScenarioError.__mro__[1]) as info:
        run({**scenario(), **change})
    message = str(info.value)
    assert text in message and "\n" not in message and "Traceback" not in message


def test_the_cli_simulates_an_llm_scenario_and_writes_its_run_directory(tmp_path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["simulate", "builtin:llm-demo", "--set",
                                      "workload.n_requests=200", "--set", "warmup_s=0",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "TTFT" in result.output and "TPOT" in result.output
    for name in ("requests", "steps", "tokens", "queue"):
        assert (out / f"{name}.parquet").exists()
    assert '"kind": "llm"' in (out / "summary.json").read_text()
    bad = CliRunner().invoke(app, ["simulate", "builtin:llm-demo", "--set",
                                   "policy.max_num_seqs=0"])
    assert bad.exit_code != 0 and "policy.max_num_seqs" in bad.output


POLICIES = st.one_of(
    st.builds(lambda s, t, c, b: {"kind": "vllm", "max_num_seqs": s, "max_num_batched_tokens": t,
                                  "enable_chunked_prefill": c, "num_gpu_blocks": b},
              st.integers(1, 16), st.integers(16, 1024), st.booleans(), st.integers(20, 400)),
    st.builds(lambda s, t, b: {"kind": "vllm", "max_num_seqs": s, "max_num_batched_tokens": t,
                               "prefill_first": True, "num_gpu_blocks": b},
              st.integers(1, 16), st.integers(16, 1024), st.integers(20, 400)),
    st.builds(lambda s, t, b: {"kind": "sarathi", "max_num_seqs": s,
                               "max_num_batched_tokens": t, "num_gpu_blocks": b},
              st.integers(1, 16), st.integers(16, 512), st.integers(20, 400)),
    st.builds(lambda s, b: {"kind": "continuous", "max_num_seqs": s, "num_gpu_blocks": b,
                            "max_num_batched_tokens": 4096},
              st.integers(1, 32), st.integers(20, 400)),
    st.builds(lambda b, w: {"kind": "static", "max_batch_size": b, "max_wait_ms": w},
              st.integers(1, 16), st.floats(0, 50)),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=POLICIES, rate=st.floats(1, 200), seed=st.integers(0, 10_000),
       prompt_high=st.integers(1, 600), output_high=st.integers(1, 200))
def test_every_step_respects_the_limits_and_every_token_comes_once(
        policy: dict[str, Any], rate: float, seed: int, prompt_high: int,
        output_high: int) -> None:
    cfg = scenario(policy=policy, prompt={"dist": "uniform", "low": 1, "high": prompt_high},
                   output={"dist": "uniform", "low": 1, "high": output_high}, kv_ms=0.001)
    cfg["seed"] = seed
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": rate,
                       "n_requests": 80}
    result = run(cfg)  # the core checks seqs, tokens and blocks at every step
    req, steps, tokens = result.requests, result.steps, result.tokens
    assert set(req["status"]) <= {"ok", "rejected"}
    ok = req[req["status"] == "ok"]
    produced = tokens.dropna().groupby("id").size()
    assert produced.reindex(ok["id"]).to_numpy() == pytest.approx(ok["output_tokens"])
    assert (tokens.dropna().groupby("id")["time_s"].apply(
        lambda t: bool(np.all(np.diff(t.to_numpy()) > 0)))).all()
    assert (ok["first_token_s"] > ok["arrival_s"]).all()
    assert (ok["finish_s"] >= ok["first_token_s"]).all()
    if policy["kind"] != "static":
        limit = policy["max_num_batched_tokens"]
        assert ((steps["prefill_tokens"] + steps["decode_seqs"]) <= limit).all()
        assert (steps["num_seqs"] <= policy["max_num_seqs"]).all()
        assert (steps["kv_blocks_used"] <= policy["num_gpu_blocks"]).all()
    else:
        assert (steps["num_seqs"] <= policy["max_batch_size"]).all()
    # recomputation is the only extra work: each ok request computed P + O - 1 tokens or more
    assert (ok["work_tokens"] >= ok["prompt_tokens"] + ok["output_tokens"] - 1).all()
    if result.summary["preemptions"] == 0:
        assert (ok["work_tokens"] == ok["prompt_tokens"] + ok["output_tokens"] - 1).all()


def test_capacity_finds_the_rate_holding_ttft_and_tpot_slos() -> None:
    from sim.experiments import capacity, sweep

    cfg = scenario(prompt={"dist": "uniform", "low": 50, "high": 400},
                   output={"dist": "uniform", "low": 10, "high": 100},
                   policy={"kind": "vllm", "num_gpu_blocks": 4000, "max_num_seqs": 32,
                           "max_num_batched_tokens": 512})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 5.0,
                       "duration_s": 60, "n_requests": None}
    cfg["workload"].pop("n_requests")
    cfg["warmup_s"] = 5
    found = capacity(cfg, {"ttft_p99_ms": 500, "tpot_p99_ms": 100}, seeds=2, workers=1,
                     tol=0.05)
    assert found.max_value > 0
    rows = sweep(cfg, {"workload.rate_rps": [found.max_value, found.interval[1] * 1.5]},
                 seeds=2, workers=1)
    at, past = rows.groupby("workload.rate_rps")["ttft_ms.p99"].mean().to_numpy()
    assert at <= 500 < past


def test_round_robin_replicas_are_independent_engines() -> None:
    from sim.drivers.llm_simulate import build_scheduler, build_step_model, simulate
    from sim.scenario.llm import load_llm_scenario
    from sim.serving.llm.core import LlmCore

    cfg = scenario(prompt={"dist": "uniform", "low": 20, "high": 600},
                   output={"dist": "uniform", "low": 5, "high": 80},
                   policy={"kind": "vllm", "num_gpu_blocks": 300, "max_num_seqs": 8,
                           "max_num_batched_tokens": 256}, kv_ms=0.001)
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 40,
                       "n_requests": 200}
    fleet = run({**cfg, "replicas": 2, "routing": "round_robin"})
    req = fleet.requests
    assert (req["replica"] == req["id"] % 2).all()
    scn = load_llm_scenario(cfg)
    for r in (0, 1):
        mine = req[req["replica"] == r]
        alone = LlmCore(mine["arrival_s"].to_numpy(), mine["prompt_tokens"].to_numpy(),
                        mine["output_tokens"].to_numpy(), build_scheduler(scn))
        simulate(alone, build_step_model(scn))
        assert alone.finish_s == pytest.approx(mine["finish_s"].to_numpy(), abs=1e-12)
    assert set(fleet.steps["replica"]) == {0, 1}


def test_jsq_routing_beats_round_robin_on_skewed_requests() -> None:
    cfg = scenario(prompt={"dist": "lognormal", "mean": 300, "cv": 2.0, "max": 4000},
                   output={"dist": "lognormal", "mean": 60, "cv": 2.0, "max": 1000},
                   policy={"kind": "vllm", "num_gpu_blocks": 2000, "max_num_seqs": 16,
                           "max_num_batched_tokens": 512})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 25,
                       "n_requests": 1500}
    jsq = run({**cfg, "replicas": 4, "routing": "jsq"}).summary
    rr = run({**cfg, "replicas": 4, "routing": "round_robin"}).summary
    assert jsq["e2e_ms"]["p99"] < rr["e2e_ms"]["p99"]
    assert jsq["ttft_ms"]["p99"] < rr["ttft_ms"]["p99"]


def test_replicas_needed_finds_the_fewest_engines_holding_the_slo() -> None:
    from sim.experiments import replicas_needed

    cfg = scenario(prompt={"dist": "uniform", "low": 50, "high": 400},
                   output={"dist": "uniform", "low": 10, "high": 100},
                   policy={"kind": "vllm", "num_gpu_blocks": 4000, "max_num_seqs": 32,
                           "max_num_batched_tokens": 512}, price_per_replica_hour=2.0)
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 5.0,
                       "duration_s": 60, "n_requests": None}
    cfg["workload"].pop("n_requests")
    cfg["warmup_s"] = 5
    answer = replicas_needed(cfg, 20.0, {"ttft_p99_ms": 500}, seeds=2, workers=1)
    n = answer["replicas"]
    assert n >= 2 and answer["met"] and answer["tried"][str(n)]
    assert not answer["tried"].get(str(n - 1), False)
    assert answer["cost_per_million_usd"] > 0


def test_the_experiment_commands_take_llm_scenarios(tmp_path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    small = ["--set", "workload.n_requests=300", "--set", "warmup_s=0"]
    swept = CliRunner().invoke(app, ["sweep", "builtin:llm-demo", *small, "--grid",
                                     "policy.max_num_batched_tokens=512,4096", "--seeds", "1",
                                     "--workers", "1", "--out", str(tmp_path / "sw")])
    assert swept.exit_code == 0, swept.output
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "sw" / "results.parquet")
    assert list(rows["policy.max_num_batched_tokens"]) == [512, 4096]
    assert (rows["error"] == "").all() and rows["ttft_ms.p99"].notna().all()
    import yaml

    cfg = scenario(prompt={"dist": "uniform", "low": 50, "high": 400}, output=50,
                   policy={"kind": "vllm", "num_gpu_blocks": 4000, "max_num_seqs": 32,
                           "max_num_batched_tokens": 512})
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "n_requests": 400}
    path = tmp_path / "llm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    needed = CliRunner().invoke(app, ["replicas", str(path), "--target-rps", "20", "--slo",
                                      "ttft_p99_ms=300", "--seeds", "1"])
    assert needed.exit_code == 0, needed.output
    assert "replicas hold" in needed.output
    trace = CliRunner().invoke(app, ["replicas", "builtin:llm-demo", "--target-rps", "5",
                                     "--slo", "ttft_p99_ms=300"])
    assert trace.exit_code == 2 and "workload.rate_rps: unknown key" in trace.output


def test_the_priority_policy_serves_level_0_first_and_preempts_the_lowest() -> None:
    cfg = scenario(prompt={"dist": "uniform", "low": 100, "high": 800},
                   output={"dist": "uniform", "low": 20, "high": 200},
                   policy={"kind": "vllm", "num_gpu_blocks": 300, "max_num_seqs": 16,
                           "max_num_batched_tokens": 512})
    # a cache of 300 blocks (4,800 tokens) for requests of up to 1,000: preemptions galore
    cfg["workload"] = {**cfg["workload"], "kind": "poisson", "rate_rps": 4,
                       "n_requests": 600, "priority_mix": [0.3, 0.7]}
    fcfs = run(cfg).summary["priorities"]
    prio = run({**cfg, "policy": {**cfg["policy"], "scheduling_policy": "priority"}})
    by = prio.summary["priorities"]
    assert by["0"]["ttft_ms"]["p99"] < 0.5 * by["1"]["ttft_ms"]["p99"]
    assert by["0"]["ttft_ms"]["p99"] < fcfs["0"]["ttft_ms"]["p99"]
    req = prio.requests
    # preemption takes the lowest priority first: level 0 is preempted less often
    rate0 = req.loc[req["priority"] == 0, "preemptions"].mean()
    rate1 = req.loc[req["priority"] == 1, "preemptions"].mean()
    assert rate1 > rate0



def test_the_core_step_refuses_a_scheduler_with_work_that_plans_nothing() -> None:
    from sim.drivers.llm_simulate import build_llm_core
    from sim.scenario.llm import load_llm_scenario
    from sim.serving.llm.schedulers import StepPlan
    from sim.serving.llm.steps import StepDone, StepInvariantError

    core = build_llm_core(load_llm_scenario(scenario()))
    t0 = float(core.arrival_s[0])
    first = core.step(t0)  # the request arrives and its prefill starts
    assert [s.replica for s in first.start] == [0] and first.wake_s == float("inf")
    core.schedulers[0].schedule = lambda now_s: StepPlan()  # type: ignore[method-assign]
    assert core.step(t0 + 0.5).start == []  # still in its step: not asked to plan
    begun = first.start[0]
    done = StepDone(begun.replica, begun.plan, begun.comp, t0, t0 + 1.0)
    with pytest.raises(StepInvariantError, match="has work but planned nothing"):
        core.step(t0 + 1.0, [done])  # four tokens to go, no plan, no timer
