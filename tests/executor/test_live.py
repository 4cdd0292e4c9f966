"""The live executor: parity with the simulator, faults, interruption, a real-model smoke run."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from executor.lifecycle import LiveError
from executor.live_requests import live
from executor.testing import SleepRunner
from sim.scenario.service import ReplayService

PARITY = {
    "seed": 5,
    "service": {"kind": "linear", "base_ms": 3, "per_item_ms": 1, "deterministic": True},
    "workload": {"kind": "constant", "rate_rps": 100, "n_requests": 40},
    "policy": {"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 12},
    "model": {"name": "sleep"},
}


def linear_s(n: int) -> float:
    return 0.003 + 0.001 * n


def members(result: sim.Result) -> list[tuple[int, ...]]:
    req = result.requests[result.requests["batch_id"] >= 0]
    return [tuple(g["id"]) for _, g in req.sort_values("id").groupby("batch_id", sort=True)]


def test_parity_same_dispatch_sequence_and_latencies_as_the_simulator() -> None:
    measured = live(PARITY, runners=[SleepRunner(linear_s)])
    # the simulation of this very run: the same scenario with the service time each live
    # batch measured (a busy machine oversleeps every batch), replayed in dispatch order
    took_s = (measured.batches.sort_values("batch_id")["finish_s"]
              - measured.batches.sort_values("batch_id")["start_s"]).to_numpy()
    simulated = sim.run(PARITY, service=lambda model: ReplayService(took_s, model))
    assert measured.meta["driver"] == "live" and measured.summary["driver"] == "live"
    # a live decision is late by the loop's wake-up lateness, which this run measured; a
    # decision may see another arrival only when it came later than the time the simulated
    # batch had before the next arrival (8 ms here): up to there the batches must be the same
    arrival = np.sort(simulated.requests["arrival_s"].to_numpy())
    sim_start = simulated.batches.sort_values("batch_id")["start_s"].to_numpy()
    margin_s = arrival[np.minimum(np.searchsorted(arrival, sim_start, side="right"),
                                  len(arrival) - 1)] - sim_start
    live_start = measured.batches.sort_values("batch_id")["start_s"].to_numpy()
    n = min(len(sim_start), len(live_start))
    late = live_start[:n] - sim_start[:n] >= margin_s[:n]
    same = int(np.argmax(late)) if late.any() else n
    assert members(measured)[:same] == members(simulated)[:same]
    # the latencies of those requests differ only by how late each live decision was: never
    # less than simulated, and at most the worst wake-up or arrival lateness the loop saw
    # (a dispatch the executor delayed by more than it measured, or a batch time it did not
    # count, shows here)
    ids = [i for batch in members(simulated)[:same] for i in batch]
    health = measured.summary["executor_health"]
    worst_s = float(np.nanmax([health["wake_lateness_ms"]["max"],
                               health["arrival_lateness_ms"]["max"]])) / 1e3
    assert same == n or worst_s >= margin_s[same]  # a batch that late: the loop saw it
    lat_sim = (simulated.requests.set_index("id").loc[ids, "finish_s"]
               - simulated.requests.set_index("id").loc[ids, "arrival_s"]).to_numpy()
    lat_live = (measured.requests.set_index("id").loc[ids, "finish_s"]
                - measured.requests.set_index("id").loc[ids, "arrival_s"]).to_numpy()
    assert np.all(lat_live >= lat_sim - 1e-9)
    assert np.all(lat_live - lat_sim <= worst_s + 1e-9)
    pd.testing.assert_index_equal(measured.requests.columns, simulated.requests.columns)
    pd.testing.assert_index_equal(measured.batches.columns, simulated.batches.columns)
    assert set(simulated.summary) <= set(measured.summary)


def test_a_failing_batch_fails_only_its_requests() -> None:
    cfg = {**PARITY, "workload": {"kind": "constant", "rate_rps": 200, "n_requests": 30}}
    result = live(cfg, runners=[SleepRunner(linear_s, fail_on=[2])])
    req = result.requests
    failed = req[req["status"] == "failed"]
    assert len(failed) >= 1
    assert failed["batch_id"].nunique() == 1
    assert set(failed["reason"]) == {"RuntimeError: injected failure in batch 2"}
    assert (req["status"].isin(["ok", "failed"])).all()
    assert result.summary["error_rate_by_cause"]["failed"] > 0
    assert bool(result.batches.loc[result.batches["batch_id"] == failed["batch_id"].iloc[0],
                                   "failed"].iloc[0])


def test_batch_timeout_fails_the_slow_batch_and_keeps_the_replica_busy() -> None:
    cfg = {**PARITY, "policy": {"kind": "greedy", "max_batch_size": 4},
           "workload": {"kind": "constant", "rate_rps": 50, "n_requests": 10}}
    result = live(cfg, runners=[SleepRunner(linear_s, stall_on={1: 0.25})],
                  batch_timeout_s=0.05)
    req = result.requests.set_index("id")
    slow = req[req["reason"] == "batch_timeout"]
    assert len(slow) == 1 and slow["status"].iloc[0] == "failed"
    # failed at start + 50 ms, not when the call returned 250 ms later
    assert slow["finish_s"].iloc[0] - slow["start_s"].iloc[0] == pytest.approx(0.05, abs=1e-9)
    batch = result.batches.set_index("batch_id").loc[int(slow["batch_id"].iloc[0])]
    assert batch["finish_s"] - batch["start_s"] >= 0.25
    nxt = req[req["start_s"] > slow["start_s"].iloc[0]]["start_s"].min()
    assert nxt >= batch["finish_s"] - 1e-9  # the replica stayed busy until the call returned
    assert (req["status"] != "in_flight").all()


@pytest.mark.parametrize("mode", ["drain", "abandon"])
def test_interrupt_mid_run_keeps_partial_results_and_the_invariant(mode: str, tmp_path) -> None:
    cfg = {**PARITY, "policy": {"kind": "greedy", "max_batch_size": 2},
           "workload": {"kind": "constant", "rate_rps": 400, "duration_s": 5}}

    armed: dict = {}

    def arm(driver) -> None:
        armed["driver"], armed["at_s"] = driver, time.perf_counter()
        threading.Timer(0.4, driver.stop, args=(mode,)).start()

    # 10 ms per request pair at 400 rps: the queue grows, so abandon leaves work behind
    result = live(cfg, runners=[SleepRunner(lambda n: 0.008)], on_driver=arm)
    assert result.meta["stopped_early"] is True
    req = result.requests
    # stopped admitting at the stop (the timer thread fires 0.4 s after it was armed, never
    # sooner, later on a busy machine; it was armed before the run's clock started, by as
    # much as the run's start-up took, which a busy machine makes longer: 3 ms once): every
    # arrival due by then (one each 2.5 ms from t = 0), give or take the arrivals this run's
    # own lateness held back
    stop_s = result.meta["stopped_s"]
    late_s = result.summary["executor_health"]["arrival_lateness_ms"]["max"] / 1e3
    armed_before_s = armed["driver"].start_perf - armed["at_s"]
    assert armed_before_s >= 0
    assert 0.4 - armed_before_s <= stop_s < 5, (stop_s, armed_before_s)
    assert abs(len(req) - (np.floor(stop_s * 400) + 1)) <= 1 + np.ceil(late_s * 400)
    counts = req["status"].value_counts()
    assert counts.sum() == len(req)
    if mode == "drain":
        assert counts.get("in_flight", 0) == 0
    else:
        assert counts.get("in_flight", 0) > 0
    out = result.write(tmp_path / "run")
    assert (out / "requests.parquet").exists() and (out / "summary.json").exists()


def test_executor_health_is_reported() -> None:
    result = live(PARITY, runners=[SleepRunner(linear_s)])
    health = result.summary["executor_health"]
    assert health["dispatch_overhead_ms"]["count"] == len(result.batches)
    assert health["handoff_ms"]["count"] == len(result.batches)
    for series in health.values():  # how large depends on the machine's load; the order not
        assert 0 <= series["p50"] <= series["p99"] <= series["max"]
    # the hand-off it reports is inside each batch's measured time (dispatch to finish)
    took_ms = (result.batches["finish_s"] - result.batches["start_s"]) * 1e3
    assert health["handoff_ms"]["max"] <= took_ms.max()


def test_synthetic_profile_has_nothing_to_run_live() -> None:
    cfg = {k: v for k, v in PARITY.items() if k != "model"}
    cfg["service"] = {"kind": "profile", "path": "builtin:synthetic-demo"}
    with pytest.raises(LiveError, match="model:"):
        live(cfg)


def test_live_smoke_with_the_real_mlp(tmp_path) -> None:
    pytest.importorskip("torch")
    cfg = {"seed": 1, "service": {"kind": "profile", "path": "builtin:mlp-cpu"},
           "workload": {"kind": "poisson", "rate_rps": 150, "duration_s": 2},
           "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 2}}
    result = live(cfg)
    s = result.summary
    assert s["ok"] == s["requests"] > 200 and s["error_rate"] == 0
    assert result.meta["model"]["name"] == "mlp" and result.meta["threads"] == 1
    assert result.meta["calibration_warnings"] == []
    # no fixed latency bound (a busy machine slows the MLP by any factor): the records must
    # agree with each other instead. A request starts with its batch, after it arrived, and
    # its latency holds that batch's measured run
    req, batches = result.requests, result.batches.set_index("batch_id")
    started_s = batches["start_s"].reindex(req["batch_id"]).to_numpy()
    took_s = (batches["finish_s"] - batches["start_s"]).reindex(req["batch_id"]).to_numpy()
    assert np.allclose(req["start_s"].to_numpy(), started_s)
    assert (req["start_s"] >= req["arrival_s"] - 1e-9).all()
    assert ((req["finish_s"] - req["arrival_s"]).to_numpy() >= took_s - 1e-9).all()
    assert 0 < s["utilization"] <= 1
    out = result.write(tmp_path / "live")
    assert '"driver": "live"' in (out / "meta.json").read_text()


def test_replicas_can_be_placed_on_a_list_of_devices() -> None:
    pytest.importorskip("torch")
    from executor.live_requests import default_runners
    from sim.scenario.schema import load_scenario

    scn = load_scenario({**PARITY, "replicas": 3,
                         "model": {"name": "mlp", "device": ["cpu", "cpu"], "threads": 1,
                                   "params": {"width": 8, "depth": 1, "in_features": 4}}})
    runners = default_runners(scn)
    assert len(runners) == 3 and {r.device for r in runners} == {"cpu"}
    assert runners[0] is not runners[1]


OVERLOAD = {
    "seed": 9,
    "service": {"kind": "linear", "base_ms": 5, "per_item_ms": 0, "deterministic": True},
    "workload": {"kind": "poisson", "rate_rps": 400, "duration_s": 1.0},
    "policy": {"kind": "none"},  # capacity 200 req/s: a backlog of ~200 at the horizon
    "warmup_s": 0.1,
    "model": {"name": "sleep"},
}


def test_a_live_run_with_a_drain_timeout_ends_on_time_with_censored_requests() -> None:
    import time

    t0 = time.perf_counter()
    result = live(OVERLOAD, runners=[SleepRunner(lambda n: 0.005)], drain_timeout_s=0.5)
    wall_s = time.perf_counter() - t0
    s = result.summary
    assert result.meta["drain_timed_out"] is True
    # horizon 1 s + drain 0.5 s: the loop ends once it sees the deadline, at most one of its
    # waits late (a 50 ms poll, or the longest batch this run measured, when the machine
    # is busy, plus the worst wake-up lateness it saw)
    took = result.batches["finish_s"] - result.batches["start_s"]
    lateness_ms = result.summary["executor_health"]["loop_lateness_ms"]["max"]
    late_s = max(0.05, float(took.max())) + lateness_ms / 1e3
    assert 1.5 <= result.meta["end_s"] <= 1.5 + late_s
    assert wall_s < result.meta["end_s"] + 1.0  # and then no hang: the summary, no more
    # one replica runs one batch at a time, each 5 ms sleep lasts at least 5 ms, and the
    # next batch starts only after the loop took in the last one's finish: starts, and so
    # finishes, lie at least 5 ms apart (less only by the rounding of the perf_counter
    # readings they come from: one unit in the last place of the clock now)
    sleep_s = 0.005
    gap_s = sleep_s - math.ulp(time.perf_counter())
    # so at most (end - warm-up) / 5 ms + 1 requests that arrived in the window finished
    # before the run ended; every other arrival in the window of the seeded schedule is
    # still in flight, censored (~80 of ~360 when idle; fewer as the loop ends later on a
    # busy machine). A drain that ran past its deadline, or censored requests counted as
    # finished, leave fewer
    arrivals = sim.run(OVERLOAD).requests["arrival_s"].to_numpy()
    in_window = int((arrivals >= 0.1).sum())
    finished_most = math.floor((result.meta["end_s"] - 0.1) / gap_s) + 1
    assert s["censored"] >= in_window - finished_most, (s["censored"], in_window, finished_most)
    assert s["censored"] == int(((result.requests["arrival_s"] >= 0.1)
                                 & (result.requests["status"] == "in_flight")).sum())
    # completions in the window are the capacity (200 req/s when idle; less when the machine
    # is busy and each 5 ms sleep wakes late), not the offered 400: one request per dispatch
    # interval of this run's own batches, up to one completion at each edge of the window.
    # The interval is never below the sleep (a replica running two batches at once, or a
    # batch recorded shorter than it ran, breaks this)
    start = np.sort(result.batches["start_s"].to_numpy())
    start = start[(start >= 0.1) & (start <= 0.1 + s["window_s"])]
    interval_s = float(np.mean(np.diff(start)))
    assert interval_s >= gap_s, interval_s
    capacity = 1 / interval_s
    assert s["throughput_rps"] == pytest.approx(capacity, abs=2 / s["window_s"])
    assert s["completions"] <= math.floor(s["window_s"] / gap_s) + 1
    # the offered load is the seeded schedule's, above the most the replica can finish
    assert s["offered_rps"] == pytest.approx(in_window / s["window_s"], rel=1e-12)
    assert s["offered_rps"] > 1 / sleep_s
    assert s["stability"]["verdict"] == "unstable"
    assert sum(result.meta["status_counts"].values()) == len(result.requests)


def test_live_refuses_an_unstable_scenario_unless_forced() -> None:
    with pytest.raises(LiveError, match=r"unstable.*--force"):
        live(OVERLOAD, runners=[SleepRunner(lambda n: 0.005)], force=False)
    long = {**OVERLOAD, "workload": {"kind": "poisson", "rate_rps": 10, "duration_s": 900}}
    with pytest.raises(LiveError, match="exceeds --max-wall-s 600"):
        live(long, runners=[SleepRunner(lambda n: 0.005)], force=False)


def _held_run(queue: dict[str, Any]) -> pd.DataFrame:
    """Two replicas of a 20 ms sleep holding at most 3 requests each (Ray Serve's
    max_ongoing_requests), 400 req/s against at most 2 * 2 / 20 ms = 200 req/s, live; the
    request table by id, every request checked ok and the bound checked never passed.
    """
    cfg = {"seed": 2, "model": {"name": "sleep"},
           "service": {"kind": "constant", "ms": 20, "deterministic": True},
           "workload": {"kind": "constant", "rate_rps": 400, "n_requests": 60},
           "policy": {"kind": "dynamic", "max_batch_size": 2, "max_wait_ms": 2,
                      "timer": "arrival"},
           "replicas": 2, "routing": "p2c", "queue": queue}
    result = live(cfg, runners=[SleepRunner(lambda n: 0.02), SleepRunner(lambda n: 0.02)],
                  force=True)
    req = result.requests.sort_values("id")
    assert (req["status"] == "ok").all()
    assert (req["joined_s"] > req["arrival_s"]).sum() > 20  # the bound acted
    assert np.all(np.diff(req["joined_s"].to_numpy()) >= 0)  # the router's wait is FIFO
    for r in (0, 1):
        mine = req[req["replica"] == r]
        joined = np.sort(mine["joined_s"].to_numpy())
        ended = np.sort(mine["finish_s"].to_numpy())
        at = np.unique(np.concatenate([joined, ended]))
        ongoing = (np.searchsorted(joined, at, side="right")
                   - np.searchsorted(ended, at, side="right"))
        assert ongoing.max() == 3, ongoing  # reached, never passed
    return req


def test_live_holds_requests_at_the_router_past_max_ongoing_requests() -> None:
    # the live driver runs the simulator's admission, so the bound, the FIFO wait at the
    # router and the join times hold exactly, whatever the machine's timing (they are facts
    # of the driver's own clock)
    req = _held_run({"max_ongoing_requests": 3})
    assert np.all(req["start_s"] >= req["joined_s"])  # a batch holds only joined requests


def test_live_retries_held_requests_from_routing_tasks() -> None:
    # the same load with queue.retry (Ray Serve's routing tasks): the routing tasks' rules
    # hold exactly on the driver's own clock. With the replicas fixed, a held request joins
    # only when a routing task tries: at an arrival (a new task tries at once) or at a
    # task's due time, never at a batch's end (nothing wakes a sleeping task), where the
    # immediate release puts every one
    req = _held_run({"max_ongoing_requests": 3, "retry": {}})
    held = req[req["joined_s"] > req["arrival_s"]]
    joins = set(held["joined_s"].to_numpy().tolist())
    assert not joins & set(req["finish_s"].to_numpy().tolist())
    # some joined at a task's due time (the back-off), not only at arrivals
    assert joins - set(req["arrival_s"].to_numpy().tolist())
