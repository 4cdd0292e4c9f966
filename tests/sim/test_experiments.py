"""Sweeps, replications, capacity planning, Pareto fronts, Dask, and the CLI around them."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import sim
from servelab.cli import app
from sim.experiments import (
    ExperimentError,
    confidence_table,
    pareto,
    parse_grid,
    replicate,
    sweep,
)
from sim.experiments.capacity import capacity, parse_slo, replicas_needed
from tests.sim.test_analytic import erlang_c

BASE = {"seed": 0, "service": {"kind": "linear", "base_ms": 2, "per_item_ms": 0.5, "cv": 0.3},
        "workload": {"kind": "poisson", "rate_rps": 400, "n_requests": 3000},
        "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 2}}


def test_sweep_rows_match_single_runs_and_are_reproducible() -> None:
    grid = {"policy.max_batch_size": [1, 4], "workload.rate_rps": [200, 400]}
    frame = sweep(BASE, grid, seeds=2, workers=2)
    assert len(frame) == 8 and set(frame["seed"]) == {0, 1} and (frame["error"] == "").all()
    assert {"latency_ms.p99", "throughput_rps", "utilization"} <= set(frame.columns)
    row = frame[(frame["policy.max_batch_size"] == 4) & (frame["workload.rate_rps"] == 400)
                & (frame["seed"] == 1)].iloc[0]
    single = sim.run(BASE, overrides={"policy.max_batch_size": 4, "workload.rate_rps": 400,
                                      "seed": 1}).summary
    assert row["latency_ms.p99"] == single["latency_ms"]["p99"]
    again = sweep(BASE, grid, seeds=2, workers=1)
    pd.testing.assert_frame_equal(frame.drop(columns="wall_s"), again.drop(columns="wall_s"))


def test_a_failing_run_is_recorded_and_the_sweep_goes_on() -> None:
    base = {**BASE, "service": {"kind": "profile", "path": "builtin:mlp-cpu"},
            "workload": {"kind": "poisson", "rate_rps": 50_000, "n_requests": 3000}}
    frame = sweep(base, {"policy.max_batch_size": [8, 128]}, seeds=1, workers=1)
    bad = frame[frame["policy.max_batch_size"] == 128]
    good = frame[frame["policy.max_batch_size"] == 8]
    assert "outside the measured range" in bad["error"].iloc[0]
    assert good["error"].iloc[0] == "" and good["ok"].iloc[0] > 0


def test_invalid_grid_values_fail_before_any_run() -> None:
    with pytest.raises(sim.ScenarioError, match=r"policy\.max_batch_size"):
        sweep(BASE, {"policy.max_batch_size": [4, -1]}, seeds=1)


def test_interrupted_sweep_keeps_rows_and_resumes(tmp_path) -> None:
    grid = {"workload.rate_rps": [100, 200, 300]}
    calls = []

    def stop_after_two(done: int, total: int) -> None:
        calls.append(done)
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(BASE, grid, seeds=2, workers=1, out_dir=tmp_path, progress=stop_after_two)
    kept = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert len(kept) == 2
    seen = []
    frame = sweep(BASE, grid, seeds=2, workers=1, out_dir=tmp_path,
                  progress=lambda d, t: seen.append(d))
    assert len(frame) == 6 and seen[0] == 2 and seen[-1] == 6  # resumed after the 2 kept
    full = sweep(BASE, grid, seeds=2, workers=1)
    pd.testing.assert_frame_equal(frame.drop(columns="wall_s"), full.drop(columns="wall_s"),
                                  check_dtype=False)


def test_grid_parsing() -> None:
    assert parse_grid(["a.b=1,2,4", "c=100:300:100", "d=0.5:1.0:0.25", "e=x,y"]) == {
        "a.b": [1, 2, 4], "c": [100, 200, 300], "d": [0.5, 0.75, 1.0], "e": ["x", "y"]}
    for bad in ["nokey", "a=1:2", "a=5:1:1", "a=1:5:0", "a=x:y:z"]:
        with pytest.raises(ExperimentError, match="--grid"):
            parse_grid([bad])


def test_replicate_t_interval_by_hand() -> None:
    table = replicate(BASE, seeds=5, metrics=["latency_ms.mean"], workers=1)
    values = sweep(BASE, {}, seeds=5, workers=1)["latency_ms.mean"].to_numpy()
    half = 2.7764451051977987 * values.std(ddof=1) / math.sqrt(5)  # t(0.975, 4)
    row = table.loc["latency_ms.mean"]
    assert row["mean"] == pytest.approx(values.mean())
    assert row["ci_high"] - row["mean"] == pytest.approx(half)


def test_replications_cover_the_mm1_truth() -> None:
    mm1 = {"service": {"kind": "exponential", "mean_ms": 1},
           "workload": {"kind": "poisson", "rate_rps": 500, "n_requests": 20_000},
           "policy": {"kind": "none"}, "warmup_s": 2}
    row = replicate(mm1, seeds=8, metrics=["queue_ms.mean"], workers=2).loc["queue_ms.mean"]
    assert row["ci_low"] < 1.0 < row["ci_high"]  # Wq = rho / (mu - lambda) = 1 ms
    assert row["ci_high"] - row["ci_low"] < 0.2


def test_capacity_finds_the_mm1_rate_for_a_mean_latency_target() -> None:
    # M/M/1, 1 ms mean service: mean latency 1/(mu - lambda) <= 5 ms  <=>  lambda <= 800/s
    mm1 = {"service": {"kind": "exponential", "mean_ms": 1},
           "workload": {"kind": "poisson", "rate_rps": 300, "n_requests": 40_000},
           "policy": {"kind": "none"}, "warmup_s": 2}
    result = capacity(mm1, {"mean_ms": 5}, seeds=3, tol=0.01, workers=2)
    lo, hi = result.interval
    assert hi / lo - 1 <= 0.011 and lo == result.max_value
    assert result.max_value == pytest.approx(800, rel=0.04)
    assert result.evaluations["met"].any() and not result.evaluations["met"].all()
    assert len(result.runs) == 3 * len(result.evaluations)


def test_replicas_needed_matches_erlang_c() -> None:
    mu, lam = 100.0, 250.0  # 10 ms exponential service, 250 req/s

    def mean_latency_ms(c: int) -> float:
        return (1 / mu + erlang_c(c, lam / mu) / (c * mu - lam)) * 1e3

    target = (mean_latency_ms(3) + mean_latency_ms(4)) / 2  # 3 too few, 4 enough
    cfg = {"service": {"kind": "exponential", "mean_ms": 10},
           "workload": {"kind": "poisson", "rate_rps": 1, "n_requests": 30_000},
           "policy": {"kind": "none"}, "warmup_s": 5, "price_per_replica_hour": 3.6}
    answer = replicas_needed(cfg, lam, {"mean_ms": target}, seeds=2, workers=2)
    assert answer["replicas"] == 4 and answer["tried"]["3"] is False
    # 4 replicas x 3.6 $/h = 0.004 $/s at ~250 req/s -> 16 $ per million
    assert answer["cost_per_million_usd"] == pytest.approx(16, rel=0.03)


def test_slo_parsing_errors() -> None:
    assert parse_slo(["p99_ms=100", "error_rate=0.01"]) == {"p99_ms": 100, "error_rate": 0.01}
    for bad, text in [(["p98_ms=1"], "allowed"), (["p99_ms"], "KEY=VALUE"),
                      (["p99_ms=fast"], "number"), ([], "at least one")]:
        with pytest.raises(ExperimentError, match=text):
            parse_slo(bad)


def test_pareto_front() -> None:
    frame = pd.DataFrame({"throughput_rps": [100, 200, 300, 250, 150],
                          "latency_ms.p99": [5, 8, 20, 30, 9]})
    front = pareto(frame)
    assert front["throughput_rps"].tolist() == [100, 200, 300]


def test_confidence_table_skips_nan() -> None:
    frame = pd.DataFrame({"x": [1.0, 2.0, np.nan, 3.0]})
    row = confidence_table(frame).loc["x"]
    assert row["n"] == 3 and row["mean"] == 2.0


def test_dask_local_cluster_gives_identical_rows() -> None:
    distributed = pytest.importorskip("distributed")
    grid = {"policy.max_batch_size": [2, 8]}
    local = sweep(BASE, grid, seeds=2, workers=1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        remote = sweep(BASE, grid, seeds=2, dask=cluster.scheduler_address)
    pd.testing.assert_frame_equal(local.drop(columns="wall_s"), remote.drop(columns="wall_s"))


def test_cli_sweep_and_capacity(tmp_path) -> None:
    scn = tmp_path / "s.yaml"
    import yaml

    scn.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", str(scn), "--grid", "policy.max_batch_size=1,4",
                                      "--grid", "workload.rate_rps=200:400:200", "--seeds", "2",
                                      "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out / "results.parquet")
    assert len(frame) == 8 and (out / "results.csv").exists()
    assert "Pareto" in (out / "report.html").read_text()
    cap = CliRunner().invoke(app, ["capacity", str(scn), "--slo", "p99_ms=30", "--seeds", "1",
                                   "--tol", "0.05", "--workers", "1", "--out",
                                   str(tmp_path / "cap")])
    assert cap.exit_code == 0, cap.output
    data = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert data["max_rps"] > 0 and data["interval"][0] <= data["interval"][1]
    bad = CliRunner().invoke(app, ["sweep", str(scn), "--grid", "policy.max_batch_size"])
    assert bad.exit_code == 2 and "KEY=VALUES" in bad.output
    bad = CliRunner().invoke(app, ["capacity", str(scn), "--slo", "p98_ms=3"])
    assert bad.exit_code == 2 and "allowed" in bad.output
