"""Autoscaling and cold starts in the simulator: policies, the fleet, metrics, bad input."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
from sim.serving.autoscaling import Concurrency, FleetView, Schedule, TargetOngoing
from sim.serving.fleet import Fleet, replica_seconds
from tests.conftest import scenario


def trace(tmp_path: Path, times_s: list[float] | np.ndarray) -> str:
    path = tmp_path / "arrivals.csv"
    pd.DataFrame({"t": np.asarray(times_s, dtype=float)}).to_csv(path, index=False)
    return str(path)


def test_autoscaling_policies_import_neither_simpy_nor_torch() -> None:
    import sim.serving.autoscaling as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
    names |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom)}
    assert not names & {"simpy", "torch", "time"}


@pytest.mark.parametrize("routing", ["shared", "jsq", "round_robin", "p2c"])
def test_pinned_bounds_and_instant_cold_start_equal_fixed_replicas_exactly(routing) -> None:
    base = scenario(service={"kind": "exponential", "mean_ms": 20},
                    workload={"kind": "poisson", "rate_rps": 120, "n_requests": 3000},
                    policy={"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5},
                    routing=routing)
    fixed = sim.run({**base, "replicas": 3})
    scaled = sim.run({**base, "autoscaling": {
        "kind": "target", "min_replicas": 3, "max_replicas": 3, "cold_start_s": 0,
        "upscale_delay_s": 0, "downscale_delay_s": 0, "control_period_s": 0.5}})
    cols = ["id", "arrival_s", "start_s", "finish_s", "batch_id", "replica", "status"]
    pd.testing.assert_frame_equal(fixed.requests[cols], scaled.requests[cols])
    pd.testing.assert_frame_equal(fixed.batches, scaled.batches)
    for key in ("throughput_rps", "latency_ms", "utilization", "replica_seconds"):
        assert scaled.summary[key] == pytest.approx(fixed.summary[key], rel=1e-12), key
    assert scaled.summary["cold_starts"] == 0 and scaled.summary["cold_start_waits"] == 0


def test_a_step_in_load_scales_up_after_the_delay_and_serves_after_the_cold_start(
        tmp_path) -> None:
    # 60 s at 2 req/s, then 60 s at 40 req/s; each request takes 100 ms on one replica
    times = np.concatenate([np.arange(0, 60, 0.5), 60 + np.arange(0, 60, 0.025)])
    cfg = scenario(service={"kind": "constant", "ms": 100},
                   workload={"kind": "trace", "path": trace(tmp_path, times),
                             "timestamp_column": "t"},
                   policy={"kind": "none"}, autoscaling={
                       "kind": "target", "min_replicas": 1, "max_replicas": 6,
                       "target_ongoing_requests": 2, "upscale_delay_s": 5,
                       "downscale_delay_s": 1000, "look_back_period_s": 2,
                       "cold_start_s": 7, "control_period_s": 1})
    result = sim.run(cfg)
    ev = result.fleet_events
    launches = ev[ev["event"] == "launch"]
    assert not launches.empty
    first = float(launches["time_s"].min())
    # before the step one replica carries 0.2 ongoing requests: no reason to scale; after
    # it, the decision must hold upscale_delay_s (5 s) on the 1 s control period
    assert 60 + 5 <= first <= 60 + 5 + 2
    for r, group in ev.groupby("replica"):
        launch = group.loc[group["event"] == "launch", "time_s"].to_numpy()
        ready = group.loc[group["event"] == "ready", "time_s"].to_numpy()
        if launch.size:
            assert ready[-launch.size:] == pytest.approx(launch + 7)  # the cold start
            served = result.batches[result.batches["replica"] == r]
            assert (served["start_s"] >= ready[-launch.size] - 1e-12).all()
    s = result.summary
    assert s["cold_starts"] == len(launches) and s["replicas"]["max"] > 1
    # the shared queue's backlog is served partly by the new replicas once they are ready
    assert s["cold_start_waits"] > 0


def test_after_scale_to_zero_an_arrival_waits_for_the_cold_start(tmp_path) -> None:
    times = [0.0, 1.0, 2.0, 100.0]
    cfg = scenario(service={"kind": "constant", "ms": 50},
                   workload={"kind": "trace", "path": trace(tmp_path, times),
                             "timestamp_column": "t"},
                   policy={"kind": "none"}, autoscaling={
                       "kind": "concurrency", "min_replicas": 0, "max_replicas": 2,
                       "initial_replicas": 1, "target_concurrency": 1,
                       "stable_window_s": 10, "panic_window_s": 2,
                       "scale_to_zero_grace_s": 20, "cold_start_s": 3})
    result = sim.run(cfg)
    req = result.requests
    latency = (req["finish_s"] - req["arrival_s"]).to_numpy()
    assert latency[:3] == pytest.approx([0.05] * 3)  # the resident replica
    assert latency[3] == pytest.approx(3.05)  # cold start + service
    ev = result.fleet_events
    stop = ev[ev["event"] == "stop"]
    # the last replica went only after the grace period without requests (the control
    # period last saw one at t = 2 s)
    assert len(stop) == 1 and 2 + 20 <= stop["time_s"].iloc[0] <= 2 + 20 + 1
    series = result.replicas
    at_90 = series[series["time_s"] <= 90]["replicas"].iloc[-1]
    assert at_90 == 0
    assert result.summary["cold_start_waits"] == 1
    # one episode with no replica ready: the arrival at 100 s waited the whole cold start
    assert result.summary["empty_fleet_wait_s"] == {"episodes": 1, "mean": pytest.approx(3.0),
                                                    "max": pytest.approx(3.0)}


def test_replica_seconds_integrate_the_replica_count_series() -> None:
    base = scenario(service={"kind": "exponential", "mean_ms": 50},
                    workload={"kind": "sinusoid", "rate_rps": 30, "amplitude": 0.9,
                              "period_s": 120, "duration_s": 600},
                    warmup_s=30, price_per_replica_hour=3.6, autoscaling={
                        "kind": "target", "min_replicas": 1, "max_replicas": 5,
                        "target_ongoing_requests": 1.5, "upscale_delay_s": 2,
                        "downscale_delay_s": 10, "cold_start_s": 4})
    result = sim.run(base)
    series, s = result.replicas, result.summary
    # by hand: each count times how long it held, clipped to the window [30, 600]
    t = np.append(series["time_s"].to_numpy(), np.inf)
    total = 0.0
    for i, n in enumerate(series["replicas"]):
        total += n * max(0.0, min(t[i + 1], 600) - max(t[i], 30))
    assert s["replica_seconds"] == pytest.approx(total, rel=1e-12)
    assert replica_seconds(series, 30, 600) == pytest.approx(total, rel=1e-12)
    assert 1 <= s["replicas"]["mean"] <= 5 and s["replicas"]["max"] > s["replicas"]["min"]
    # cost from the replica-seconds held, not from the most replicas
    assert s["cost_per_million_usd"] == pytest.approx(
        3.6 * total / 3600 / s["completions"] * 1e6)
    again = sim.run(base)  # the same seed: the same fleet history
    pd.testing.assert_frame_equal(again.replicas, series)
    pd.testing.assert_frame_equal(again.requests, result.requests)
    other = sim.run({**base, "seed": 9})
    assert not other.replicas.equals(series)


AUTOSCALING = st.one_of(
    st.fixed_dictionaries({
        "kind": st.just("target"), "min_replicas": st.integers(0, 1),
        "max_replicas": st.integers(1, 4),
        "target_ongoing_requests": st.floats(0.5, 4),
        "upscale_delay_s": st.floats(0, 2), "downscale_delay_s": st.floats(0, 2),
        "look_back_period_s": st.floats(0.1, 2)}),
    st.fixed_dictionaries({
        "kind": st.just("concurrency"), "max_replicas": st.integers(1, 4),
        "target_concurrency": st.floats(0.5, 4), "stable_window_s": st.floats(1, 3),
        "panic_window_s": st.floats(0.1, 1), "scale_to_zero_grace_s": st.floats(0, 1)}),
    st.fixed_dictionaries({
        "kind": st.just("schedule"), "steps": st.just([[0, 1], [0.7, 3], [1.4, 0]]),
        "period_s": st.just(2.0)}),
)


@given(autoscaling=AUTOSCALING,
       routing=st.sampled_from(["shared", "round_robin", "jsq", "p2c", "least_work"]),
       discipline=st.sampled_from(["fifo", "priority"]),
       max_len=st.one_of(st.none(), st.integers(1, 20)),
       cold_ms=st.floats(0, 500), period=st.floats(0.05, 0.5),
       rate=st.floats(20, 400), seed=st.integers(0, 10_000))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_request_is_lost_or_served_by_a_replica_that_is_not_ready(
        autoscaling, routing, discipline, max_len, cold_ms, period, rate, seed) -> None:
    if autoscaling["kind"] == "target":
        autoscaling["min_replicas"] = min(autoscaling["min_replicas"],
                                          autoscaling["max_replicas"])
    cfg = scenario(seed=seed, service={"kind": "exponential", "mean_ms": 10},
                   workload={"kind": "poisson", "rate_rps": rate, "n_requests": 400,
                             "priority_mix": [0.5, 0.5]},
                   policy={"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 2},
                   routing=routing, queue={"discipline": discipline, "max_len": max_len},
                   autoscaling={**autoscaling, "cold_start_s": cold_ms / 1e3,
                                "control_period_s": period})
    result = sim.run(cfg)
    req, bat, ev = result.requests, result.batches, result.fleet_events
    s = result.summary
    assert len(req) == 400 and (req["status"] != "in_flight").all()
    assert s["ok"] + s["rejected"] == 400  # nothing lost: served or refused by the bound
    # every batch ran inside a ready interval of its replica: from a ready to its retire
    for r, group in bat.groupby("replica"):
        mine = ev[ev["replica"] == r]
        ready = mine.loc[mine["event"] == "ready", "time_s"].to_numpy()
        retire = mine.loc[mine["event"] == "retire", "time_s"].to_numpy()
        for start in group["start_s"]:
            k = np.searchsorted(ready, start, side="right") - 1
            assert k >= 0, f"replica {r} ran a batch before it was ever ready"
            later = retire[retire >= ready[k]]
            assert later.size == 0 or start <= later[0] + 1e-12
    # the state machine: per replica the events follow launch/deploy -> ready -> retire ->
    # stop, or launch -> cancel (a scale-down during the cold start) -> launch
    order = {"deploy": {"ready"}, "launch": {"ready", "cancel"}, "ready": {"retire"},
             "retire": {"stop"}, "stop": {"launch"}, "cancel": {"launch"}}
    for _, group in ev.groupby("replica"):
        names = group["event"].tolist()
        for a, b in itertools.pairwise(names):
            assert b in order[a], names
    # a scale-down removes starting replicas before ready ones (Ray stops those not running
    # first): no ready replica is retired while another is still starting after the same
    # decision (the events of one decision share its time)
    state: dict[int, str] = {}
    for time_s, group in ev.groupby("time_s", sort=False):
        for r, event in zip(group["replica"], group["event"], strict=True):
            state[r] = {"launch": "starting", "cancel": "off", "ready": "ready",
                        "retire": "draining", "stop": "off", "deploy": "starting"}[event]
        if (group["event"] == "retire").any():
            assert "starting" not in state.values(), (time_s, state)


def test_policies_follow_their_rules_on_hand_made_views() -> None:
    ray = TargetOngoing(min_replicas=1, max_replicas=10, target_ongoing_requests=2,
                        upscale_delay_s=3, downscale_delay_s=5, look_back_period_s=1)
    # 12 ongoing on 2 replicas: 6 wanted, but only once the decision held 3 s
    assert [ray.desired(FleetView(t, 2, 0, 10, 2)) for t in (0, 1, 2, 3)] == [2, 2, 2, 6]
    half = TargetOngoing(min_replicas=1, max_replicas=10, target_ongoing_requests=2,
                         upscale_delay_s=0, upscaling_factor=0.5, look_back_period_s=1)
    assert half.desired(FleetView(0, 2, 0, 10, 2)) == 4  # half-way from 2 to 6
    assert ray.desired(FleetView(10, 0, 0, 1, 0)) == 1  # from zero: at once
    knative = Concurrency(min_replicas=0, max_replicas=10, target_concurrency=1,
                          stable_window_s=60, panic_window_s=6, panic_threshold=2,
                          scale_to_zero_grace_s=30)
    for t in range(60):
        knative.desired(FleetView(float(t), 2, 0, 0, 2))  # steady: 2 replicas carry 2
    assert knative.desired(FleetView(60, 2, 0, 0, 2)) == 2
    # a burst to 10 concurrent: the panic window (6 s) sees it long before the stable one
    out = [knative.desired(FleetView(61 + t, 2, 0, 8, 2)) for t in range(3)]
    assert knative.panicking and out[-1] > 2
    assert min(out) >= 2  # never down while panicking
    sched = Schedule(steps=[(0, 1), (3600, 4), (7200, 2)], period_s=86400)
    assert [sched.desired(FleetView(t, 1, 0, 0, 0)) for t in (0, 3599, 3600, 86400 + 8000)] \
        == [1, 1, 4, 2]


@pytest.mark.parametrize(("how", "want"), [("mean", 3), ("max", 5), ("min", 1)])
def test_target_reduces_the_look_back_window_as_ray_s_aggregation_function(
        how: str, want: int) -> None:
    # samples of the ongoing count, one a second, over a 3 s look-back on 1 replica with a
    # target of 2: 12 (dropped: older than the window), then 2, 10, 6 -> mean 6, max 10,
    # min 2 -> ceil(x / 2) replicas (Ray's aggregate_timeseries: the window's time-weighted
    # mean, or its largest / smallest point); with no delay the answer comes at once
    rule = TargetOngoing(min_replicas=1, max_replicas=10, target_ongoing_requests=2,
                         upscale_delay_s=0, downscale_delay_s=0, look_back_period_s=2,
                         aggregation_function=how)
    answers = [rule.desired(FleetView(float(t), 1, 0, q, 0))
               for t, q in enumerate((12, 2, 10, 6))]
    assert answers[-1] == want, answers
    assert answers[0] == 6  # one sample: every reduction is that sample


def test_target_follows_ray_2_60_from_zero_to_zero_and_at_its_edges() -> None:
    # Ray 2.60's autoscaling_policy.py, step by step (the class docstring names the functions)
    rule = TargetOngoing(min_replicas=0, max_replicas=8, target_ongoing_requests=2,
                         upscale_delay_s=1, downscale_delay_s=2, look_back_period_s=1,
                         downscale_to_zero_delay_s=5)
    # from zero with 10 waiting: one replica at once (the cold-start fast path:
    # max(ceil(upscaling_factor), target count)), not ceil(10 / 2) = 5
    assert rule.desired(FleetView(0.0, 0, 0, 10, 0)) == 1
    # while it starts (none running), the count holds whatever the delay: Ray's policy
    # only scales on running replicas' counts
    assert [rule.desired(FleetView(t, 0, 1, 10, 0)) for t in (0.5, 1.0, 2.0)] == [1, 1, 1]
    # running: 10 ongoing / 2 = 5, acted on once it held 1 s (Ray's 1e-6 s early is in)
    assert [rule.desired(FleetView(t, 1, 0, 4, 6)) for t in (3.0, 4.0 - 1e-7)] == [1, 5]
    # all idle on 5 running: 0 wanted, but from more than one replica a fall stops at 1
    idle = [rule.desired(FleetView(t, 5, 0, 0, 0)) for t in (10.0, 11.0, 12.0)]
    assert idle == [5, 5, 1], idle
    # 1 -> 0 waits downscale_to_zero_delay_s (5 s), not downscale_delay_s (2 s)
    last = [rule.desired(FleetView(t, 1, 0, 0, 0)) for t in (13.0, 15.0, 17.0, 18.0)]
    assert last == [1, 1, 1, 0], last
    # with no replica and nothing counted the count stays where it is
    assert rule.desired(FleetView(30.0, 0, 0, 0, 0)) == 0
    # a scale-down the factor rounds to no change goes down by one: 3 running, 4 ongoing
    # (2 wanted), factor 0.5 -> ceil(3 - 0.5) = 3 -> 2
    slow = TargetOngoing(min_replicas=1, max_replicas=8, target_ongoing_requests=2,
                         downscale_delay_s=0, look_back_period_s=1, downscaling_factor=0.5)
    assert slow.desired(FleetView(0.0, 3, 0, 4, 0)) == 2
    # the factor scales the change from the running count, not running + starting: 2
    # running, 2 starting, 12 ongoing (6 wanted), factor 0.5 -> ceil(2 + 2) = 4: no change
    half = TargetOngoing(min_replicas=1, max_replicas=8, target_ongoing_requests=2,
                         upscale_delay_s=0, look_back_period_s=1, upscaling_factor=0.5)
    assert half.desired(FleetView(0.0, 2, 2, 10, 2)) == 4


def test_the_fleet_records_each_consultation_only_when_asked() -> None:
    def fleet() -> Fleet:
        return Fleet(3, TargetOngoing(min_replicas=1, max_replicas=3, target_ongoing_requests=2,
                                      upscale_delay_s=0, look_back_period_s=1), 0.1)

    quiet = fleet()
    quiet.plan(FleetView(0.1, 1, 0, 5, 1), [0, 0, 0])
    assert quiet.log.controls is None  # a simulated day keeps no row per tick
    recorded = fleet()
    recorded.log.controls = []
    # 6 ongoing on 1 replica: 3 wanted; the live loop asked 2 ms after the tick
    assert recorded.plan(FleetView(0.1, 1, 0, 5, 1), [0, 0, 0], seen_s=0.102) == ([1, 2], [], [])
    recorded.plan(FleetView(0.2, 1, 2, 0, 0), [0, 0, 0])  # the simulator: asked at the tick
    assert recorded.log.controls == [(0.1, 0.102, 6, 1, 3), (0.2, 0.2, 0, 3, 3)]


@pytest.mark.parametrize(("autoscaling", "text"), [
    ({"kind": "target", "min_replicas": 3, "max_replicas": 2, "cold_start_s": 1},
     "autoscaling.min_replicas: 3 is above max_replicas 2"),
    ({"kind": "target", "upscale_delay_s": -1, "cold_start_s": 1},
     "autoscaling.upscale_delay_s"),
    ({"kind": "concurrency", "panic_window_s": 90, "cold_start_s": 1},
     "autoscaling.panic_window_s: 90 s must not exceed stable_window_s 60 s"),
    ({"kind": "target", "max_replicas": 2, "initial_replicas": 5, "cold_start_s": 1},
     "autoscaling.initial_replicas: 5 must lie in [min_replicas 1, max_replicas 2]"),
    ({"kind": "schedule", "steps": [[10, 1], [0, 2]], "cold_start_s": 1},
     "autoscaling.steps: start times must increase"),
    ({"kind": "elastic"}, "autoscaling.kind: unknown value 'elastic'"),
    ({"kind": "target", "aggregation_function": "median", "cold_start_s": 1},
     "autoscaling.aggregation_function"),
    ({"kind": "target", "max_replicas": 2}, "autoscaling.cold_start_s: the service has no "
     "measured cold starts"),
])
def test_bad_autoscaling_knobs_are_one_line_errors(autoscaling: dict[str, Any],
                                                   text: str) -> None:
    with pytest.raises(sim.ScenarioError.__mro__[1]) as info:
        sim.run(scenario(autoscaling=autoscaling))
    message = str(info.value)
    assert text in message and "\n" not in message
    with pytest.raises(sim.ScenarioError.__mro__[1], match="leave replicas out"):
        sim.run(scenario(replicas=3, autoscaling={"kind": "target", "cold_start_s": 1}))


def test_the_cli_simulates_an_autoscaled_scenario_and_writes_the_replica_series(
        tmp_path) -> None:
    import yaml
    from typer.testing import CliRunner

    from servelab.cli import app

    cfg = scenario(service={"kind": "exponential", "mean_ms": 40},
                   workload={"kind": "sinusoid", "rate_rps": 40, "amplitude": 1.0,
                             "period_s": 60, "duration_s": 120},
                   autoscaling={"kind": "concurrency", "max_replicas": 4,
                                "target_concurrency": 1, "stable_window_s": 10,
                                "panic_window_s": 2, "scale_to_zero_grace_s": 5,
                                "cold_start_s": 2})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["simulate", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "replica-seconds" in result.output and "cold starts" in result.output
    series = pd.read_parquet(out / "replicas.parquet")
    events = pd.read_parquet(out / "fleet_events.parquet")
    assert series["replicas"].max() > series["replicas"].min() == 0  # scaled to zero
    assert {"launch", "ready", "retire", "stop"} <= set(events["event"])
