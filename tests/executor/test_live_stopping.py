"""Live: a scale-up launches while a removed replica still stops
(``autoscaling.stopping_holds_slot: false``, Ray Serve's rule), on the live driver's own
clock, with the simulator's core and fleet.

The hand-made day of ``tests/sim/test_autoscaling_stopping.py`` at 0.4 times its timing:
0.1 s an item, a tick every 0.2 s, a look-back of 0.1 s, a 0.4 s cold start. Every arrival,
batch end and cold-start end is at least 0.1 s (half a tick) from the tick that reads it,
so a loop late by less than that decides as the simulator does. Stand-in replicas sleep
(``precise_sleep``: the time does not depend on CPU load, and never ends early).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from executor.live_requests import live
from executor.testing import SleepRunner, precise_sleep

COLD_S = 0.4
EPS_S = 1e-9


def _day(tmp_path: Path) -> dict[str, Any]:
    # r0 (0.3 s) on A and r1 (3.9 s) on B at 0; tick 0.4: B retired while it runs r1;
    # r2 (3.6 s) on A at 0.9; tick 1.0: 2 ongoing for 1 ready: C (slot 2) launches at once,
    # ready at 1.4; r3 (0.4 s) at 1.7 goes to C; B stops at 3.9; tick 4.0: C is retired
    path = tmp_path / "day.csv"
    pd.DataFrame({"t": [0.0, 0.0, 0.9, 1.7], "size": [3, 39, 36, 4]}).to_csv(path,
                                                                            index=False)
    return {"name": "live-stopping", "seed": 3,
            "service": {"kind": "linear", "base_ms": 0, "per_item_ms": 100,
                        "deterministic": True},
            "workload": {"kind": "trace", "path": str(path), "timestamp_column": "t",
                         "size_column": "size"},
            "policy": {"kind": "none"}, "routing": "jsq",
            "autoscaling": {"kind": "target", "min_replicas": 1, "max_replicas": 2,
                            "initial_replicas": 2, "target_ongoing_requests": 1,
                            "upscale_delay_s": 0, "downscale_delay_s": 0,
                            "look_back_period_s": 0.1, "control_period_s": 0.2,
                            "cold_start_s": COLD_S, "stopping_holds_slot": False},
            "model": {"name": "sleep"}}


def _sleeps(*seconds: float) -> SleepRunner:
    """A replica whose k-th call sleeps ``seconds[k]`` (the items of the request it runs:
    the live runner is told only how many requests a batch has)."""
    each: Iterator[float] = iter(seconds)
    return SleepRunner(lambda n: next(each))


def _loader(replica: int) -> tuple[SleepRunner, dict[str, float]]:
    precise_sleep(COLD_S)  # the stand-in's cold start
    return _sleeps(0.4), {"build_s": COLD_S, "first_forward_s": 0.0, "total_s": COLD_S}


def test_live_launches_while_the_removed_replica_stops(tmp_path, monkeypatch) -> None:
    # catches: a live driver that cannot run a slot past max_replicas (one runner per
    # max_replicas slots), a launch that waits for B's stop, work sent to B while it
    # stops, and a stopping replica released before its call returned
    import calibration.cold_start

    monkeypatch.setattr(calibration.cold_start, "release", lambda device: None)
    cfg = _day(tmp_path)
    predicted = sim.run(cfg)
    t0 = time.perf_counter()
    measured = live(cfg, runners=[_sleeps(0.3, 3.6), _sleeps(3.9)], loader=_loader)
    wall_s = time.perf_counter() - t0
    ev, pev = measured.fleet_events, predicted.fleet_events
    # the same decisions as the simulator, in the same order
    assert list(zip(ev["replica"], ev["event"], strict=True)) == \
        list(zip(pev["replica"], pev["event"], strict=True)) == [
            (0, "deploy"), (0, "ready"), (1, "deploy"), (1, "ready"), (1, "retire"),
            (2, "launch"), (2, "ready"), (1, "stop"), (2, "retire"), (2, "stop")]
    # decided on control ticks, stamped with the tick's time: exactly the simulator's
    ticked = ev["event"].isin(["retire", "launch"]).to_numpy()
    assert np.allclose(ev["time_s"].to_numpy()[ticked], pev["time_s"].to_numpy()[ticked],
                       rtol=0, atol=EPS_S)
    launch_s = float(ev.loc[ev["event"] == "launch", "time_s"].iloc[0])
    assert launch_s == pytest.approx(1.0, abs=EPS_S)
    b_stop_s = float(ev.loc[(ev["replica"] == 1) & (ev["event"] == "stop"), "time_s"].iloc[0])
    c_ready_s = float(ev.loc[(ev["replica"] == 2) & (ev["event"] == "ready"), "time_s"].iloc[0])
    # B stops when its 3.9 s call returns (a sleep never ends early), long after C launched
    assert b_stop_s >= 3.9 and c_ready_s >= launch_s + COLD_S
    # three replicas held while B stops; never more than max_replicas ready or starting
    series = measured.replicas
    assert int((series["ready"] + series["starting"]).max()) == 2
    assert int(series["replicas"].max()) == 3
    req = measured.requests.sort_values("id")
    assert req["replica"].tolist() == [0, 1, 0, 2] and (req["status"] == "ok").all()
    assert float(req["start_s"].iloc[3]) >= 1.7  # r3 ran on C at its arrival, not queued
    assert float(req["start_s"].iloc[3]) - 1.7 < 0.1
    assert wall_s < 15.0
