"""A removed replica that lingers (Ray Serve's ``graceful_shutdown_wait_loop_s``): it takes no
new work, first waits a poll period, then stops at the first poll that finds it idle; it
counts replica-seconds until then.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from sim.serving.autoscaling import TargetOngoing
from sim.serving.fleet import DRAINING, OFF, Fleet
from tests.conftest import scenario


def _day(tmp_path: Path, poll_s: float | None) -> dict[str, Any]:
    # 10 s at 2 req/s, 10 s at 40 req/s, 20 s at 2 req/s; 120 ms a request, one at a time
    times = np.concatenate([np.arange(0, 10, 0.5), 10 + np.arange(0, 10, 0.025),
                            20 + np.arange(0, 20, 0.5)])
    path = tmp_path / "day.csv"
    pd.DataFrame({"t": times}).to_csv(path, index=False)
    return scenario(service={"kind": "constant", "ms": 120},
                    workload={"kind": "trace", "path": str(path), "timestamp_column": "t"},
                    policy={"kind": "none"}, routing="p2c", autoscaling={
                        "kind": "target", "min_replicas": 1, "max_replicas": 4,
                        "target_ongoing_requests": 2, "upscale_delay_s": 1,
                        "downscale_delay_s": 2, "look_back_period_s": 2,
                        "control_period_s": 0.4, "cold_start_s": 1.5,
                        "graceful_shutdown_wait_loop_s": poll_s})


def test_a_removed_replica_stops_at_the_first_poll_that_finds_it_idle(tmp_path: Path) -> None:
    prompt, polled = sim.run(_day(tmp_path, None)), sim.run(_day(tmp_path, 2.0))
    # the drain changes only when a slot is freed: no launch waited for a slot here, so
    # every request and batch is the same
    cols = ["id", "arrival_s", "start_s", "finish_s", "replica", "status"]
    pd.testing.assert_frame_equal(prompt.requests[cols], polled.requests[cols])
    for result, poll_s in ((prompt, None), (polled, 2.0)):
        ev, batches = result.fleet_events, result.batches
        retires = ev[ev["event"] == "retire"]
        assert len(retires) >= 2  # the burst's replicas went after it
        for _, row in retires.iterrows():
            r, retire_s = int(row["replica"]), float(row["time_s"])
            stop_s = float(ev[(ev["replica"] == r) & (ev["event"] == "stop")
                              & (ev["time_s"] >= retire_s)]["time_s"].min())
            mine = batches[(batches["replica"] == r) & (batches["start_s"] < retire_s)]
            last_s = max(float(mine["finish_s"].max()), retire_s)
            if poll_s is None:  # as soon as its work is done
                assert stop_s == pytest.approx(last_s)
            else:  # retire + k polls, k >= 1 the first with the work done
                k = max(1, math.ceil((last_s - retire_s) / poll_s - 1e-9))
                assert stop_s == pytest.approx(retire_s + k * poll_s)
            # no batch starts on it after its removal
            assert not ((batches["replica"] == r) & (batches["start_s"] >= retire_s)
                        & (batches["start_s"] < stop_s)).any()
    gained = polled.summary["replica_seconds"] - prompt.summary["replica_seconds"]
    n_retired = int((polled.fleet_events["event"] == "retire").sum())
    assert 0 < gained <= 2.0 * n_retired + 1e-9


def test_the_fleet_polls_a_busy_draining_slot_again_a_period_later() -> None:
    fleet = Fleet(2, TargetOngoing(min_replicas=1, max_replicas=2, initial_replicas=2,
                                   target_ongoing_requests=1, upscale_delay_s=0,
                                   downscale_delay_s=0, look_back_period_s=1),
                  control_period_s=1.0, stop_poll_s=2.0)
    fleet.retire(1, 1.0)
    assert fleet.state[1] == DRAINING and fleet.next_poll_s() == 3.0
    assert fleet.poll(2.9, [0, 0]) == []  # not due yet
    assert fleet.poll(3.0, [0, 1]) == [] and fleet.next_poll_s() == 5.0  # busy at 3 s
    assert fleet.poll(7.5, [0, 0]) == [1]  # idle at the poll due at 5 s: stops then
    assert fleet.state[1] == OFF and fleet.next_poll_s() == math.inf
    assert [e for e in fleet.log.events if e[1] == 1][-2:] == [(1.0, 1, "retire"),
                                                                (5.0, 1, "stop")]


def test_a_bad_or_unmodelled_poll_period_is_a_one_line_error(tmp_path: Path) -> None:
    cfg = _day(tmp_path, 0.0)
    with pytest.raises(sim.ScenarioError.__mro__[1]) as info:
        sim.run(cfg)
    assert "graceful_shutdown_wait_loop_s" in str(info.value)
    assert "\n" not in str(info.value)
