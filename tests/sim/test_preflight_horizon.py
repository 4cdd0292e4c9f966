"""The pre-flight estimate prices the simulated time of traces and closed loops: the
autoscaler ticks over the trace's span or over the clients' round trips (think time plus
service), which a tiny control period turns into a hang."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.experiments.preflight import estimate_run, requests_and_horizon
from sim.scenario.schema import load_scenario

SCALING = {"kind": "target", "min_replicas": 1, "max_replicas": 2,
           "target_ongoing_requests": 2, "control_period_s": 0.1}


def trace(tmp_path, t: list, **workload) -> dict:
    path = tmp_path / "t.csv"
    pd.DataFrame({"t": t}).to_csv(path, index=False)
    return {"seed": 1, "service": {"kind": "constant", "ms": 1},
            "policy": {"kind": "none"},
            "workload": {"kind": "trace", "path": str(path), "timestamp_column": "t",
                         **workload}}


def test_a_trace_horizon_is_its_span_after_start_and_time_scale(tmp_path) -> None:
    cfg = trace(tmp_path, [10.0, 11.0, 12.0, 20.0], time_scale=3.0, start_s=2.0)
    count, horizon, _ = requests_and_horizon(load_scenario(cfg))
    assert count == 4 and horizon == pytest.approx((10.0 - 2.0) * 3.0)
    # cut by duration_s, or by n_requests at the trace's mean rate
    cut = load_scenario({**cfg, "workload": {**cfg["workload"], "duration_s": 5.0}})
    assert requests_and_horizon(cut)[1] == pytest.approx(5.0)
    half = load_scenario({**cfg, "workload": {**cfg["workload"], "n_requests": 2}})
    assert requests_and_horizon(half)[1] == pytest.approx(24.0 / 2)
    stamps = trace(tmp_path, ["2024-01-01T00:00:00", "2024-01-01T01:00:00"])
    assert requests_and_horizon(load_scenario(stamps))[1] == pytest.approx(3600.0)


def test_an_autoscaled_trace_prices_its_control_ticks(tmp_path) -> None:
    # two requests a day apart with a 1 ms control period: 8.6e7 ticks, not "2 requests"
    cfg = {**trace(tmp_path, [0.0, 86_400.0]),
           "autoscaling": {**SCALING, "control_period_s": 0.001}}
    est = estimate_run(load_scenario(cfg))
    assert est.driver == "autoscaling.control_period_s" and est.verb == "raise"
    assert est.time_s == pytest.approx(86_400 / 0.001 / 100_000, rel=0.01)
    assert "other events" in est.detail


def test_a_closed_loop_prices_think_time_and_keeps_full_records() -> None:
    cfg = {"seed": 1, "service": {"kind": "constant", "ms": 10}, "policy": {"kind": "none"},
           "workload": {"kind": "closed", "clients": 4, "think_ms": 990, "n_requests": 400},
           "autoscaling": {**SCALING, "control_period_s": 0.001}}
    count, horizon, driver = requests_and_horizon(load_scenario(cfg))
    # 400 requests over 4 clients, 1 s round trip each (990 ms think + 10 ms service)
    assert count == 400 and horizon == pytest.approx(100.0) and driver == "workload.n_requests"
    est = estimate_run(load_scenario(cfg), "sketch")
    assert est.driver == "autoscaling.control_period_s"
    # a closed loop bounded by n_requests keeps full records whatever was asked
    plain = {k: v for k, v in cfg.items() if k != "autoscaling"}
    full = estimate_run(load_scenario(plain), "full").memory_bytes
    assert estimate_run(load_scenario(plain), "sketch").memory_bytes == full
    timed = {**plain, "workload": {"kind": "closed", "clients": 4, "think_ms": 990,
                                   "duration_s": 10.0}}
    assert requests_and_horizon(load_scenario(timed))[:2] == pytest.approx((40.0, 10.0))
    assert estimate_run(load_scenario(timed), "sketch").memory_bytes < full


def test_a_hash_trace_is_priced_by_its_rows_not_refused_as_endless() -> None:
    # the estimate knew no hash_trace workload: inf requests, so `servelab simulate
    # builtin:llm-prefix-cache` (the README's example) was refused without --yes
    from sim.experiments.preflight import BUDGET
    from sim.scenario.llm import load_llm_scenario

    est = estimate_run(load_llm_scenario("builtin:llm-prefix-cache"))
    assert est.requests == 1100  # the shipped trace's rows
    assert est.memory_bytes < BUDGET.memory_bytes and est.time_s < BUDGET.time_s
    cut = load_llm_scenario("builtin:llm-prefix-cache", {"workload.n_requests": 50})
    assert requests_and_horizon(cut)[0] == 50
