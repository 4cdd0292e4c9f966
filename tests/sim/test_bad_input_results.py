"""Bad input that used to give a silently wrong number, a hang or a raw exception (issue 28):
each now gives a correct result or one clear error naming the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import sim
from servelab.cli import app
from sim.experiments import sweep
from sim.experiments.capacity import capacity
from sim.experiments.preflight import BudgetError, estimate_run
from sim.experiments.resume import ResumeError, read_runs
from sim.llm import run_any
from sim.scenario.build import policy_batch_sizes
from sim.scenario.schema import ScenarioError, load_scenario

GOOD = {
    "seed": 1,
    "service": {"kind": "constant", "ms": 1},
    "workload": {"kind": "poisson", "rate_rps": 100, "n_requests": 200},
    "policy": {"kind": "greedy", "max_batch_size": 4},
}


def scenario(**overrides: object) -> dict:
    data = json.loads(json.dumps(GOOD))
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        if field:
            data[section] = {**data.get(section, {}), field: value}
        else:
            data[section] = value
    return data


# -- the Python API: a ScenarioError naming the argument, never a raw exception ------------
API_CASES = [
    ("service_seed -1", {"service_seed": -1}, "service_seed"),
    ("service_seed 1.5", {"service_seed": 1.5}, "service_seed"),
    ("drain_timeout_s -1e9", {"drain_timeout_s": -1e9}, "drain_timeout_s"),
    ("drain_timeout_s -1", {"drain_timeout_s": -1}, "drain_timeout_s"),
    ("drain_timeout_s nan", {"drain_timeout_s": math.nan}, "drain_timeout_s"),
    ("overrides with a number key", {"overrides": {3: 4}}, "overrides: key 3"),
    ("overrides as one string", {"overrides": "seed=3"}, "overrides"),
]


@pytest.mark.parametrize(("label", "kwargs", "text"), API_CASES, ids=[c[0] for c in API_CASES])
def test_api_arguments_are_checked_by_name(label, kwargs, text) -> None:
    with pytest.raises(ScenarioError, match=text):
        sim.run(GOOD, **kwargs)


def test_an_infinite_drain_timeout_drains_every_request() -> None:
    assert sim.run(GOOD, drain_timeout_s=math.inf).summary == sim.run(GOOD).summary


def test_a_self_referencing_params_dict_is_refused_before_the_run() -> None:
    params: dict = {}
    params["self"] = params
    with pytest.raises(ScenarioError, match=r"model\.params\.self: refers to itself"):
        sim.run({**GOOD, "model": {"name": "mlp", "params": params}})


def test_shared_yaml_nodes_within_the_limit_still_load() -> None:
    shared = {"width": 8}
    loaded = load_scenario({**GOOD, "model": {"name": "mlp", "params": {"a": shared,
                                                                         "b": shared}}})
    assert loaded.model is not None and loaded.model.params["b"] == {"width": 8}


# -- results that used to be silently wrong -------------------------------------------------
def test_a_run_that_finishes_nothing_is_not_called_stable() -> None:
    result = sim.run(scenario(policy={"kind": "fixed", "batch_size": 10**6}))
    stability = result.summary["stability"]
    assert stability["verdict"] == "unstable"
    assert "no request finished" in stability["reason"]


def test_a_window_shorter_than_a_service_time_does_not_claim_the_capacity() -> None:
    from sim.metrics.stability import stability_warning

    result = sim.run(scenario(workload__rate_rps=1e12))
    assert result.summary["completions"] == 0
    text = stability_warning(result.summary)
    assert text is not None and "throughput is not measured" in text
    assert "throughput is the capacity" not in text


def test_a_time_scale_that_shrinks_the_trace_to_nothing_is_a_verdict(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP\n0\n1\n2\n")
    result = sim.run(scenario(workload={"kind": "trace", "path": str(trace),
                                        "time_scale": 1e-300}))
    assert result.summary["stability"]["verdict"] == "unstable"
    assert "throughput is not measured" in result.summary["stability"]["reason"]


def test_a_huge_max_batch_is_sized_by_the_run() -> None:
    data = scenario(policy__max_batch_size=10**9)
    assert len(policy_batch_sizes(load_scenario(data), 200)) == 200
    result = sim.run(data)
    assert result.summary["ok"] == 200
    assert result.batches["size"].max() <= 200


def test_rate_scale_repeats_only_what_the_bound_keeps(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP\n0\n1\n2\n")
    result = sim.run(scenario(workload={"kind": "trace", "path": str(trace),
                                        "rate_scale": 1e9, "n_requests": 10}))
    assert result.summary["requests"] == 10
    assert (result.requests["arrival_s"] == 0).all()  # ten copies of the first row


def test_sizes_beyond_32_bits_keep_their_value(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,n\n0,1000000000000\n0.5,1\n1,1\n")
    result = sim.run(scenario(workload={"kind": "trace", "path": str(trace),
                                        "size_column": "n"}))
    assert result.batches["items"].max() == 10**12
    assert result.summary["mean_batch_size"] > 0
    big = sim.run(scenario(workload__size=2**31 + 5))
    assert (big.batches["items"] % (2**31 + 5) == 0).all()
    assert big.batches["items"].min() == 2**31 + 5


def test_a_closed_loop_with_more_clients_than_requests_is_sized_by_the_requests() -> None:
    result = sim.run(scenario(workload={"kind": "closed", "clients": 10**9, "think_ms": 1,
                                        "n_requests": 100}))
    assert result.summary["requests"] == 100


def test_an_llm_request_too_big_for_the_kv_cache_costs_no_memory(tmp_path) -> None:
    trace = tmp_path / "llm.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,1000000000\n1,10,5\n")
    data = {"seed": 1,
            "service": {"kind": "llm_linear", "base_ms": 5, "per_decode_seq_ms": 0.05},
            "workload": {"kind": "trace", "path": str(trace),
                         "prompt_tokens_column": "ContextTokens",
                         "output_tokens_column": "GeneratedTokens"},
            "policy": {"kind": "vllm", "num_gpu_blocks": 64}}
    result = run_any(data)
    assert list(result.requests["reason"]) == ["kv_cache_too_small", ""]
    assert len(result.tokens) == 5  # slots only for the request that ran


def test_an_llm_run_that_serves_nothing_is_not_called_stable() -> None:
    # every request is larger than the KV cache and is rejected at admission: the run had
    # an error rate of 1 and measured nothing, and was called "stable" with no warning
    # (the waiting queue has no trend when everything leaves at once)
    from sim.metrics.stability import stability_warning

    data = {"seed": 1,
            "service": {"kind": "llm_linear", "base_ms": 5, "per_decode_seq_ms": 0.05},
            "workload": {"kind": "poisson", "rate_rps": 5, "n_requests": 20,
                         "prompt_tokens": 10, "output_tokens": 10**11},
            "policy": {"kind": "vllm", "num_gpu_blocks": 64}}
    result = run_any(data)
    assert result.summary["ok"] == 0 and result.summary["rejected"] == 20
    stability = result.summary["stability"]
    assert stability["verdict"] == "unstable", stability
    assert "no request was served" in stability["reason"]
    assert "20 rejected" in stability["reason"]
    text = stability_warning(result.summary)
    assert text is not None and "not measured" in text
    # one request that fits keeps the ordinary verdict: the rule is about a run with none
    data["workload"] = {**data["workload"], "output_tokens": 5}
    assert run_any(data).summary["stability"]["verdict"] != "unstable"


# -- the pre-flight estimate ----------------------------------------------------------------
def test_the_estimate_grows_with_the_work_and_names_the_knob() -> None:
    small = estimate_run(load_scenario(GOOD))
    large = estimate_run(load_scenario(scenario(workload__n_requests=200_000)))
    assert large.requests == 1000 * small.requests
    assert large.time_s == pytest.approx(1000 * small.time_s)
    assert large.driver == "workload.n_requests"
    lean = estimate_run(load_scenario(scenario(workload__n_requests=200_000)), "sketch")
    assert lean.memory_bytes < large.memory_bytes


def test_yes_runs_past_the_budget_and_the_default_refuses(tmp_path, monkeypatch) -> None:
    from sim.experiments import preflight

    monkeypatch.setattr(preflight, "BUDGET", preflight.Budget(time_s=1e-6))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    refused = CliRunner().invoke(app, ["simulate", str(path), "-q"])
    assert refused.exit_code == 2 and "pass --yes" in refused.output
    assert CliRunner().invoke(app, ["simulate", str(path), "-q", "--yes"]).exit_code == 0
    with pytest.raises(BudgetError, match="sweep would take"):
        sweep(GOOD, {"policy.max_batch_size": [1, 2]}, 1, workers=1)
    assert len(sweep(GOOD, {"policy.max_batch_size": [1, 2]}, 1, workers=1, yes=True)) == 2


def test_capacity_stops_at_a_candidate_beyond_the_budget(monkeypatch) -> None:
    from sim.experiments import preflight

    # the whole search (12 candidates of 100 requests) fits; a candidate of 1600 does not
    monkeypatch.setattr(preflight, "BUDGET", preflight.Budget(time_s=0.05))
    data = scenario(workload={"kind": "poisson", "rate_rps": 100, "duration_s": 1},
                    queue={"max_len": 4})
    with pytest.raises(BudgetError, match=r"runs at workload\.rate_rps=1600"):
        capacity(data, ["error_rate=1"], seeds=1, workers=1)


# -- sweep resume ---------------------------------------------------------------------------
def sweep_cli(path: Path, out: Path, *extra: str) -> object:
    return CliRunner().invoke(app, ["sweep", str(path), "--grid", "policy.max_batch_size=1,2",
                                    "--seeds", "1", "--workers", "1", "--out", str(out),
                                    *extra])


def test_a_changed_scenario_is_refused_naming_the_field(tmp_path) -> None:
    path, out = tmp_path / "s.yaml", tmp_path / "d"
    path.write_text(yaml.safe_dump(GOOD))
    assert sweep_cli(path, out).exit_code == 0
    before = (out / "runs.jsonl").read_text()
    changed = sweep_cli(path, out, "--set", "workload.rate_rps=3000")
    assert changed.exit_code == 2
    assert "workload.rate_rps: 100.0 -> 3000.0" in changed.output
    path.write_text(yaml.safe_dump(scenario(policy__kind="greedy", seed=2)))  # edited YAML
    edited = sweep_cli(path, out)
    assert edited.exit_code == 2 and "seed: 1 -> 2" in edited.output
    assert (out / "runs.jsonl").read_text() == before


def test_a_grown_grid_reuses_the_runs_of_the_same_scenario(tmp_path) -> None:
    out = tmp_path / "d"
    first = sweep(GOOD, {"policy.max_batch_size": [1, 2]}, 1, workers=1, out_dir=out)
    second = sweep(GOOD, {"policy.max_batch_size": [1, 2, 4]}, 1, workers=1, out_dir=out)
    assert len((out / "runs.jsonl").read_text().splitlines()) == 3
    assert list(second["key"][:2]) == list(first["key"])


def test_the_key_covers_the_whole_resolved_scenario() -> None:
    from sim.experiments.sweep import tasks_for

    a = tasks_for(load_scenario(GOOD), {"policy.max_batch_size": [2]}, 1)
    b = tasks_for(load_scenario(scenario(workload__rate_rps=3000)),
                  {"policy.max_batch_size": [2]}, 1)
    assert a[0].key != b[0].key


def test_a_torn_last_line_is_dropped_and_rerun(tmp_path) -> None:
    out = tmp_path / "d"
    sweep(GOOD, {"policy.max_batch_size": [1, 2]}, 1, workers=1, out_dir=out)
    log = out / "runs.jsonl"
    whole = log.read_text()
    log.write_text(whole[: len(whole) - 40])  # a write cut short
    again = sweep(GOOD, {"policy.max_batch_size": [1, 2]}, 1, workers=1, out_dir=out)
    assert len(again) == 2 and (again["error"] == "").all()
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


def test_a_broken_middle_line_names_the_line(tmp_path) -> None:
    log = tmp_path / "runs.jsonl"
    log.write_text('{"key": "a"}\n{not json\n{"key": "b"}\n')
    with pytest.raises(ResumeError, match="line 2 is not a JSON row"):
        read_runs(log)


def test_a_sweep_whose_every_run_fails_says_so_in_one_line(tmp_path) -> None:
    # every point's warm-up outlasts its arrivals: each run fails with a ScenarioError. The
    # report's Pareto front then met a frame without metric columns and the command ended
    # in an internal error after writing runs.jsonl; now the report says nothing succeeded
    # and the command exits 1 naming the first failure
    path, out = tmp_path / "s.yaml", tmp_path / "d"
    path.write_text(yaml.safe_dump({**GOOD, "warmup_s": 10}))
    result = CliRunner().invoke(app, ["sweep", str(path), "--grid", "workload.rate_rps=100,200",
                                      "--seeds", "1", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output
    assert "every run failed; the first: ScenarioError: warmup_s" in " ".join(
        result.output.split())
    assert "nothing to plot" in (out / "report.html").read_text()
    assert len((out / "runs.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(("flag", "text", "want"), [
    ("--set", "workload.size=1.5e9", 1.5e9), ("--set", "workload.size=2E3", 2000.0),
    ("--grid", "workload.rate_rps=1e2,2e2", [100.0, 200.0])])
def test_an_exponent_without_a_sign_is_a_number(flag, text, want) -> None:
    # YAML 1.1 reads 1e9 and 1.5e9 as strings: --set workload.size=1.5e9 was refused as
    # "unable to parse string as an integer (got '1.5e9')" and a --grid of 1e2,2e2 as "not
    # a number", where a person typed a number (1e+9 was read as one)
    from sim.experiments.sweep import parse_grid_value
    from sim.scenario.schema import apply_overrides

    if flag == "--set":
        data = apply_overrides(json.loads(json.dumps(GOOD)), [text])
        assert data["workload"]["size"] == want
        assert load_scenario(data).workload.size == int(want)
    else:
        assert parse_grid_value(text.split("=", 1)[1]) == want


def test_an_exponent_meant_as_text_stays_text() -> None:
    # a name, or a field the scenario already holds as text, keeps what was typed: reading
    # 1e5 as a number had made --set name=1e5 fail ("name: Input should be a valid string")
    from sim.scenario.schema import apply_overrides

    data = apply_overrides({**json.loads(json.dumps(GOOD)), "name": "base"},
                           ["name=1e5", "model.name=2e3", "workload.size=1e3"])
    assert data["name"] == "1e5" and data["model"]["name"] == "2e3"
    assert data["workload"]["size"] == 1000.0
    assert load_scenario({k: v for k, v in data.items() if k != "model"}).name == "1e5"
