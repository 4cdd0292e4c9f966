"""A scale-down during a cold start cancels the starting replicas first, as Ray Serve 2.60's
``DeploymentScheduler._get_replicas_to_stop`` stops the replicas that are not running before
the running ones: a cancelled replica goes off at once (it never served), counts
replica-seconds only until the cancel, and the requests routed to it go back to the router.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from sim.serving.fleet import OFF, READY, STARTING, Fleet, replica_seconds
from tests.conftest import Want, scenario


def test_the_fleet_cancels_the_newest_starting_slots_before_it_retires_a_ready_one() -> None:
    want = Want(2)
    fleet = Fleet(4, want, control_period_s=0.5)  # slot 0 resident
    launch, cancel, retire = fleet.plan(fleet.view(1.0, 0, 0), [0] * 4)
    assert (launch, cancel, retire) == ([1], [], [])
    fleet.launch(1, 1.0)
    want.n = 4
    launch, cancel, retire = fleet.plan(fleet.view(2.0, 0, 0), [0] * 4)
    assert (launch, cancel, retire) == ([2, 3], [], [])
    for r in launch:
        fleet.launch(r, 2.0)
    # 3 fewer while 1, 2 and 3 start: the three starting ones, the latest launches first
    # (2 and 3 at 2 s, the highest first, then 1 at 1 s); the ready slot 0 stays. The old
    # rule retired slot 0 and left all three to finish their cold starts
    want.n = 1
    assert fleet.plan(fleet.view(3.0, 0, 0), [0] * 4) == ([], [3, 2, 1], [])
    # once 1 is ready, 2 fewer: the two starting ones first, no ready one
    fleet.ready(1, 2.5)
    want.n = 2
    assert fleet.plan(fleet.view(3.0, 0, 0), [0] * 4) == ([], [3, 2], [])
    # 3 fewer: both starting ones, then the least loaded ready one (slot 1 holds less)
    want.n = 1
    assert fleet.plan(fleet.view(3.0, 0, 0), [5, 0, 0, 0]) == ([], [3, 2], [1])
    fleet.cancel(3, 3.0)
    fleet.cancel(2, 3.0)
    fleet.retire(1, 3.0)
    fleet.stop(1, 3.5)
    assert fleet.state == [READY, OFF, OFF, OFF]
    ev = fleet.log.event_frame()
    assert ev[ev["event"] == "cancel"][["time_s", "replica"]].values.tolist() == [
        [3.0, 3], [3.0, 2]]
    # replica-seconds over [0, 4]: slot 0 all 4 s, slot 1 from its launch to its stop
    # (2.5 s), slots 2 and 3 from their launch to the cancel (1 s each), not to a ready
    assert replica_seconds(fleet.log.series(), 0.0, 4.0) == pytest.approx(
        4 + 2.5 + 1 + 1, rel=1e-12)
    # a cancelled launch's late ready report is refused (a driver must drop it), and only a
    # starting slot can be cancelled
    with pytest.raises(ValueError, match="not starting"):
        fleet.ready(3, 3.2)
    with pytest.raises(ValueError, match="not starting"):
        fleet.cancel(0, 3.2)
    # a relaunch of a cancelled slot is a new launch (its own time for the newest-first rule)
    fleet.launch(2, 4.0)
    fleet.launch(3, 3.9)
    assert fleet.state[2] == fleet.state[3] == STARTING
    want.n = 2
    assert fleet.plan(fleet.view(4.5, 0, 0), [0] * 4) == ([], [2], [])


def _burst(tmp_path: Path, cold_s: float = 6.0) -> dict[str, Any]:
    # 2 s at 40 req/s, then 1 req/s to 20 s; 50 ms a request, one at a time: the resident
    # replica falls behind, the autoscaler launches more; the backlog is gone (t ~ 3 s) long
    # before their 6 s cold start ends, and the scale-down comes while they start
    times = np.concatenate([np.arange(0, 2, 0.025), 2 + np.arange(0, 18, 1.0)])
    path = tmp_path / "burst.csv"
    pd.DataFrame({"t": times}).to_csv(path, index=False)
    return scenario(service={"kind": "constant", "ms": 50}, warmup_s=0,
                    workload={"kind": "trace", "path": str(path), "timestamp_column": "t"},
                    policy={"kind": "none"}, routing="jsq", autoscaling={
                        "kind": "target", "min_replicas": 1, "max_replicas": 4,
                        "target_ongoing_requests": 2, "upscale_delay_s": 0.5,
                        "downscale_delay_s": 1, "look_back_period_s": 1,
                        "control_period_s": 0.25, "cold_start_s": cold_s})


def _slot_lives_s(ev: pd.DataFrame, lo_s: float, hi_s: float) -> float:
    """Replica-seconds from the events alone: each incarnation from its launch (or deploy)
    to its cancel or stop (or ``hi_s``), clipped to [lo, hi].
    """
    total = 0.0
    for _, group in ev.groupby("replica"):
        born_s = None
        for time_s, event in zip(group["time_s"], group["event"], strict=True):
            if event in ("launch", "deploy"):
                born_s = time_s
            elif event in ("cancel", "stop"):
                assert born_s is not None
                total += max(0.0, min(time_s, hi_s) - max(born_s, lo_s))
                born_s = None
        if born_s is not None:
            total += max(0.0, hi_s - max(born_s, lo_s))
    return total


def test_a_scale_down_during_a_cold_start_cancels_the_starting_replicas(tmp_path) -> None:
    cfg = _burst(tmp_path)
    result = sim.run(cfg)
    req, bat, ev, s = result.requests, result.batches, result.fleet_events, result.summary
    assert s["ok"] == len(req) == 98  # nothing lost
    cancels = ev[ev["event"] == "cancel"]
    launches = ev[ev["event"] == "launch"]
    assert len(cancels) >= 1 and len(launches) >= 1
    # no launched replica ever became ready: every launch ended in a cancel (the cold start
    # is longer than the backlog lasts), none was retired, and only the resident one served
    assert (ev["event"] == "ready").sum() == (ev["event"] == "deploy").sum() == 1
    assert len(cancels) == len(launches) and not (ev["event"] == "retire").any()
    assert set(bat["replica"]) == {0}
    for _, row in cancels.iterrows():  # each cancel came before its launch's ready time
        launch_s = launches.loc[launches["replica"] == row["replica"], "time_s"]
        launch_s = float(launch_s[launch_s <= row["time_s"]].max())
        assert row["time_s"] < launch_s + cfg["autoscaling"]["cold_start_s"]
    # replica-seconds count a cancelled replica from its launch to its cancel: the summary
    # (integrated from the count series) equals the events' own lifetimes. A cancel that
    # went to draining, or a slot that kept counting to its ready time, differs by seconds
    lo_s, hi_s = 0.0, s["window_s"]  # no warm-up: the window is [0, window_s]
    assert s["replica_seconds"] == pytest.approx(_slot_lives_s(ev, lo_s, hi_s), rel=1e-12)
    again = sim.run(cfg)  # the same seed: the same output
    pd.testing.assert_frame_equal(again.fleet_events, ev)
    pd.testing.assert_frame_equal(again.requests, req)
    pd.testing.assert_frame_equal(again.replicas, result.replicas)


def test_requests_held_by_a_cancelled_replica_go_back_to_the_router(tmp_path) -> None:
    # from zero: the first arrival launches 3 (the schedule), the next arrivals wait on the
    # starting ones (no replica is ready); at 1 s the schedule wants 1: the two newest
    # launches (slots 2 and 1) are cancelled and what they held goes to slot 0
    times = np.append(np.arange(0.0, 0.9, 0.05), 6.0)  # the last one: the window to 6 s
    path = tmp_path / "t.csv"
    pd.DataFrame({"t": times}).to_csv(path, index=False)
    cfg = scenario(service={"kind": "constant", "ms": 10}, warmup_s=0,
                   workload={"kind": "trace", "path": str(path), "timestamp_column": "t"},
                   policy={"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 0},
                   routing="jsq", autoscaling={
                       "kind": "schedule", "steps": [[0, 3], [1.0, 1]],
                       "min_replicas": 0, "initial_replicas": 0, "cold_start_s": 4,
                       "control_period_s": 0.5})
    result = sim.run(cfg)
    req, ev, s = result.requests, result.fleet_events, result.summary
    assert ev[["time_s", "replica", "event"]].values.tolist() == [
        [0.0, 0, "launch"], [0.0, 1, "launch"], [0.0, 2, "launch"],
        [1.0, 2, "cancel"], [1.0, 1, "cancel"], [4.0, 0, "ready"]]
    assert s["ok"] == len(req) == len(times)  # nothing lost with the cancelled slots
    assert (req["replica"] == 0).all()  # every request, held by 1 or 2 or not, served by 0
    assert (req["start_s"] >= 4.0).all()
    # the cancelled slots held some of them before the cancel (jsq over three starting
    # slots): their queues' series show it, then drop to zero at the cancel
    q = result.queue
    for r in (1, 2):
        mine = q[q["queue"] == r]
        assert mine.loc[mine["time_s"] < 1.0, "length"].max() > 0
        assert mine["length"].iloc[-1] == 0 and mine["time_s"].iloc[-1] == 1.0
    # replica-seconds over the window [0, 6 s]: slot 0 all of it, slots 1 and 2 from 0 s
    # to the cancel at 1 s (to their ready at 4 s and on, if they had loaded on)
    assert s["window_s"] == 6.0
    assert s["replica_seconds"] == pytest.approx(6.0 + 2 * 1.0, rel=1e-12)
