"""Autoscaling live: the same autoscaler objects start and stop real replicas."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from executor.live_requests import live
from executor.testing import SleepRunner, precise_sleep
from sim.scenario.service import ReplayService

COLD_S = 0.3


def linear_s(n: int) -> float:
    return 0.005 + 0.001 * n


def burst(tmp_path: Path) -> str:
    """1 s at 20 req/s, 1.5 s at 400 req/s, 2 s at 10 req/s."""
    t = np.concatenate([np.arange(0, 1, 1 / 20), 1 + np.arange(0, 1.5, 1 / 400),
                        2.5 + np.arange(0, 2, 1 / 10)])
    path = tmp_path / "burst.csv"
    pd.DataFrame({"t": t}).to_csv(path, index=False)
    return str(path)


def scenario(tmp_path: Path, **model: Any) -> dict[str, Any]:
    return {"seed": 2, "name": "live-scaling",
            "service": {"kind": "linear", "base_ms": 5, "per_item_ms": 1, "deterministic": True},
            "workload": {"kind": "trace", "path": burst(tmp_path), "timestamp_column": "t"},
            "policy": {"kind": "none"},
            "autoscaling": {"kind": "target", "min_replicas": 1, "max_replicas": 3,
                            "target_ongoing_requests": 2, "upscale_delay_s": 0.1,
                            "downscale_delay_s": 0.5, "look_back_period_s": 0.3,
                            "control_period_s": 0.1, "cold_start_s": COLD_S},
            "model": model or {"name": "sleep"}}


def sleeping_loader(replica: int) -> tuple[SleepRunner, dict[str, float]]:
    begin = time.perf_counter()
    precise_sleep(COLD_S)  # the stand-in's cold start
    LOADS.append((replica, begin, time.perf_counter()))
    return SleepRunner(linear_s), {"build_s": COLD_S, "first_forward_s": 0.0,
                                   "total_s": COLD_S}


LOADS: list[tuple[int, float, float]] = []  # sleeping_loader's calls: replica, begin, end


def test_live_scales_up_and_down_like_the_simulator(tmp_path) -> None:
    cfg = scenario(tmp_path)
    predicted = sim.run(cfg)
    drivers: list[Any] = []
    LOADS.clear()
    measured = live(cfg, runners=[SleepRunner(linear_s)], loader=sleeping_loader,
                    on_driver=drivers.append)
    s, p = measured.summary, predicted.summary
    assert s["ok"] == len(measured.requests) == p["ok"]  # nothing lost
    ev = measured.fleet_events
    launches = ev[ev["event"] == "launch"]
    assert len(launches) >= 1 and (ev["event"] == "stop").sum() >= 1  # up, then down
    # the same decisions, up to one launch: a few ms of timer lateness at a control period
    # can tip the decision after the burst (seen once in CI)
    assert abs(s["cold_starts"] - p["cold_starts"]) <= 1
    for r, group in measured.batches.groupby("replica"):
        ready = ev.loc[(ev["replica"] == r) & (ev["event"] == "ready"), "time_s"].min()
        assert (group["start_s"] >= ready - 1e-9).all()  # never before its model loaded
    # the measured cold start is launch to ready: the loader ran after the launch decision,
    # took at least COLD_S (a sleep never ends early), and the replica was ready when it
    # returned, stamped on the worker late by at most the worst lateness this run measured
    # for a thread to go on (a wait, a batch end taken in, a hand-off). A ready stamped when
    # the loop took it in at a later control tick, or a launch stamped at another time than
    # the decision, shows here
    health = s["executor_health"]
    late_s = float(np.nanmax([health["loop_lateness_ms"]["max"],
                              health["notice_lateness_ms"]["max"]])) / 1e3
    thread_late_s = max(late_s, float(np.nan_to_num(health["handoff_ms"]["max"])) / 1e3)
    start_perf = drivers[0].start_perf
    assert len(measured.meta["cold_starts_measured_s"]) == s["cold_starts"] == len(LOADS)
    for replica, begin, end in LOADS:
        mine = ev[ev["replica"] == replica]
        launch_s = float(mine.loc[(mine["event"] == "launch")
                                  & (mine["time_s"] <= begin - start_perf + 1e-9),
                                  "time_s"].max())
        ready_s = float(mine.loc[(mine["event"] == "ready")
                                 & (mine["time_s"] >= launch_s), "time_s"].min())
        assert end - begin >= COLD_S
        assert begin - start_perf >= launch_s - 1e-9, (replica, launch_s)
        assert 0 <= ready_s - (end - start_perf) <= thread_late_s, (replica, ready_s)
    assert s["cold_start_s"]["p50"] >= COLD_S
    # replica-seconds, against the simulator replaying this run's own batch times (a busy
    # machine's oversleeps then show on both sides). Launches and stops are decided on control
    # ticks: the loop's lateness in this run (a few ms at most) can move a threshold crossing
    # by one tick, so each launch or stop found in both runs may differ by one control period
    # plus that lateness, and a replica launched in only one run adds its whole lifetime
    took_s = (measured.batches["finish_s"] - measured.batches["start_s"]).to_numpy()
    replayed = sim.run(cfg, service=lambda model: ReplayService(
        took_s, model, replicas=measured.batches["replica"].to_numpy()))
    tick_s = cfg["autoscaling"]["control_period_s"] + late_s
    # the first scale-up among them: control ticks and the decision rule are the same
    # objects, so it comes within one tick of the simulator's (a live control loop on
    # another period or phase moves it by more)
    rev = replayed.fleet_events
    first_live = float(launches["time_s"].min())
    first_sim = float(rev.loc[rev["event"] == "launch", "time_s"].min())
    assert abs(first_live - first_sim) <= tick_s + 1e-9, (first_live, first_sim, tick_s)
    matched, unmatched_s = _pair_fleet_events(ev, rev, s["window_s"])
    for live_s, sim_s in matched:
        assert abs(live_s - sim_s) <= tick_s + 1e-9, (live_s, sim_s, tick_s)
    allowed_s = (len(matched) * tick_s + unmatched_s + cfg["autoscaling"]["max_replicas"]
                 * abs(s["window_s"] - replayed.summary["window_s"]))
    assert abs(s["replica_seconds"] - replayed.summary["replica_seconds"]) <= allowed_s + 1e-9
    out = measured.write(tmp_path / "run")
    assert (out / "replicas.parquet").exists() and (out / "fleet_events.parquet").exists()


def _pair_fleet_events(a: pd.DataFrame, b: pd.DataFrame,
                       end_s: float) -> tuple[list[tuple[float, float]], float]:
    """Launches and stops of two fleet logs paired per replica slot in order: the pairs of
    times, and the lifetime (launch to stop, or to ``end_s``) of replicas only one log has.
    """
    matched: list[tuple[float, float]] = []
    unmatched_s = 0.0
    for replica in sorted(set(a["replica"]) | set(b["replica"])):
        lives = []
        for log in (a, b):
            mine = log[log["replica"] == replica]
            starts = mine.loc[mine["event"] == "launch", "time_s"].tolist()
            stops = mine.loc[mine["event"] == "stop", "time_s"].tolist()
            lives.append([(s0, stops[k] if k < len(stops) else end_s)
                          for k, s0 in enumerate(starts)])
        for k in range(max(len(lives[0]), len(lives[1]))):
            if k < len(lives[0]) and k < len(lives[1]):
                matched += [(lives[0][k][0], lives[1][k][0]), (lives[0][k][1], lives[1][k][1])]
            else:
                launch_s, stop_s = (lives[0] if k < len(lives[0]) else lives[1])[k]
                unmatched_s += stop_s - launch_s
    return matched, unmatched_s


def test_a_real_mlp_replica_is_loaded_when_launched_and_freed_when_stopped(tmp_path) -> None:
    pytest.importorskip("torch")
    cfg = scenario(tmp_path, name="mlp", device="cpu", threads=1)
    cfg["autoscaling"]["target_ongoing_requests"] = 0.25
    # after the burst, 3 s with no arrivals, then two: whatever the MLP's speed on a loaded
    # machine, the backlog drains and the ongoing count falls to 0, so the autoscaler must
    # stop the launched replicas (with the 10 req/s tail of `burst`, the ongoing count under
    # two CPU hogs stayed above the target and the fleet never scaled down, 1 run in 3)
    t = np.concatenate([np.arange(0, 1, 1 / 20), 1 + np.arange(0, 1.5, 1 / 400),
                        [5.5, 6.0]])
    path = tmp_path / "burst-idle.csv"
    pd.DataFrame({"t": t}).to_csv(path, index=False)
    cfg["workload"]["path"] = str(path)
    # round robin sends the launched replicas requests: from one shared queue the resident
    # replica, consulted first, often took every request alone (the MLP serves one in well
    # under the 2.5 ms between arrivals), and the test failed about 1 run in 4
    cfg["routing"] = "round_robin"
    result = live(cfg)  # the resident replica and every launched one load the real MLP
    s = result.summary
    assert s["ok"] == len(result.requests)
    assert s["cold_starts"] >= 1 and (result.fleet_events["event"] == "stop").sum() >= 1
    loads = result.meta["cold_starts_measured_s"]
    assert loads and all(x["build_s"] > 0 and x["first_forward_s"] > 0 for x in loads)
    assert set(result.batches["replica"]) > {0}  # launched replicas served


def test_a_big_heap_does_not_pause_the_live_clock(tmp_path) -> None:
    # a full collection of a big heap (a notebook's, the dashboard's, a long test session's)
    # takes ~0.2 s here; inside a live run it made control ticks late enough to launch an
    # extra replica. The live loop leaves the pre-existing heap out of collections.
    import gc

    heap = [[i, str(i)] for i in range(3_000_000)]
    cfg = scenario(tmp_path)
    try:
        predicted = sim.run(cfg)
        t0 = time.perf_counter()
        gc.collect()  # the pause a full collection of this heap takes on this machine now
        pause_s = time.perf_counter() - t0
        measured = live(cfg, runners=[SleepRunner(linear_s)], loader=sleeping_loader)
    finally:
        del heap
        gc.collect()
    # a collection of the heap inside the run holds every thread for the whole pause: the
    # loop's step (or the wait, the hand-off, the batch end, the arrival) it lands in is
    # late by about that much. The run's worst such delay stays under half of it (the other
    # half is room for the machine's own lateness)
    health = measured.summary["executor_health"]
    late_ms = float(np.nanmax([series["max"] for series in health.values()]))
    assert late_ms < pause_s / 2 * 1e3, (late_ms, pause_s, health)
    # the same decisions as the simulator, up to the one launch a tick's lateness can tip
    # (as in test_live_scales_up_and_down_like_the_simulator); the pause's extra replica is
    # the lateness above
    assert abs(measured.summary["cold_starts"] - predicted.summary["cold_starts"]) <= 1
