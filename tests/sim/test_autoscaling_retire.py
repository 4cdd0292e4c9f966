"""Which ready replica a scale-down retires (``autoscaling.retire``), and the kill of a
removed replica that outlives ``autoscaling.graceful_shutdown_timeout_s`` (Ray Serve 2.60:
``DeploymentScheduler._get_replicas_to_stop`` takes the newest running replica on a node;
``DeploymentReplica.check_stopped`` force-kills a stopping replica past its deadline, and the
requests it held end with the actor's death error at their callers, not retried).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from calibration.profile import LatencyProfile
from sim.serving.autoscaling import FleetView
from sim.serving.fleet import DRAINING, OFF, Fleet
from tests.conftest import Want, scenario


# -- retire: least_loaded | newest ----------------------------------------------------------
def test_the_newest_rule_retires_the_slot_that_became_ready_last() -> None:
    fleets = {rule: Fleet(4, Want(4), control_period_s=0.5, retire_rule=rule)
              for rule in ("least_loaded", "newest")}
    for fleet in fleets.values():  # slot 0 resident; 1 launched first but ready last
        fleet.launch(1, 1.0)
        fleet.launch(2, 1.0)
        fleet.launch(3, 1.0)
        fleet.ready(2, 2.0)
        fleet.ready(3, 2.5)
        fleet.ready(1, 3.0)
        fleet.autoscaler.n = 2  # type: ignore[attr-defined]
    queued = [0, 4, 0, 1]  # slot 1 holds the most: least_loaded keeps it
    # newest: slot 1 (ready at 3 s), then 3 (2.5 s); least_loaded: slot 2 (empty, then
    # the highest of the empties), then 0. A rule that took the highest slot (3, 2) or the
    # last launched (all at 1 s: the highest again) fails the first
    assert fleets["newest"].plan(FleetView(4.0, 4, 0, 0, 0), queued) == ([], [], [1, 3])
    assert fleets["least_loaded"].plan(FleetView(4.0, 4, 0, 0, 0), queued) == ([], [], [2, 0])
    # the resident slots all became ready at 0: the highest goes first
    resident = Fleet(3, Want(1, initial_replicas=3), 1.0, retire_rule="newest")
    assert resident.plan(FleetView(1.0, 3, 0, 0, 0), [0, 0, 0]) == ([], [], [2, 1])
    with pytest.raises(ValueError, match="retire_rule: 'oldest'"):
        Fleet(2, Want(1), 1.0, retire_rule="oldest")


def _varied_cold_starts(tmp_path: Path) -> str:
    """120 ms a request; cold starts of 0.5 s or 3 s (bootstrap draws): two replicas launched
    at one tick often become ready in the other order.
    """
    return str(LatencyProfile({1: np.full(3, 0.120)}, model={"name": "flat"},
                              load_samples_s=np.array([0.5, 3.0])).save(
        tmp_path / "flat.json"))


def _bursts(tmp_path: Path, retire: str) -> dict[str, Any]:
    # three bursts (40 req/s) between quiet spells (2 req/s): up to 4 replicas and down again
    quiet, busy = np.arange(0, 10, 0.5), np.arange(0, 10, 0.025)
    times = np.concatenate([quiet, 10 + busy, 20 + quiet, 30 + busy, 40 + quiet,
                            50 + busy, 60 + quiet])
    path = tmp_path / "bursts.csv"
    pd.DataFrame({"t": times}).to_csv(path, index=False)
    return scenario(seed=5, service={"kind": "profile", "path": _varied_cold_starts(tmp_path)},
                    workload={"kind": "trace", "path": str(path), "timestamp_column": "t"},
                    routing="p2c", autoscaling={
                        "kind": "target", "min_replicas": 1, "max_replicas": 4,
                        "target_ongoing_requests": 2, "upscale_delay_s": 1,
                        "downscale_delay_s": 2, "look_back_period_s": 2,
                        "control_period_s": 0.4, "retire": retire})


def _retired_and_newest(events: pd.DataFrame) -> list[tuple[int, int, int]]:
    """Per retire: the slot retired, the newest ready slot then (latest ready, then the
    highest) and the highest ready slot, replayed from the run's own events.
    """
    ready_at_s: dict[int, float] = {}
    out = []
    for _, replica, event in events[["time_s", "replica", "event"]].itertuples(index=False):
        if event == "ready":
            ready_at_s[replica] = _
        elif event == "retire":
            newest = max(ready_at_s, key=lambda r: (ready_at_s[r], r))
            out.append((int(replica), int(newest), int(max(ready_at_s))))
            del ready_at_s[replica]
    return out


def test_a_run_with_retire_newest_retires_the_replica_ready_last(tmp_path: Path) -> None:
    newest = sim.run(_bursts(tmp_path, "newest"))
    picks = _retired_and_newest(newest.fleet_events)
    assert len(picks) >= 6  # three scale-downs of several replicas each
    assert all(retired == want for retired, want, _ in picks), picks
    # the cold starts made a lower slot the newest at some retire: there the rule differs
    # from "the highest slot" (what least_loaded does among equally loaded replicas)
    assert any(want != highest for _, want, highest in picks), picks
    # the default keeps the old rule: some retire there is not the newest replica
    loaded = _retired_and_newest(sim.run(_bursts(tmp_path, "least_loaded")).fleet_events)
    assert any(retired != want for retired, want, _ in loaded), loaded
    again = sim.run(_bursts(tmp_path, "newest"))  # same seed: the same run
    pd.testing.assert_frame_equal(again.requests, newest.requests)
    pd.testing.assert_frame_equal(again.fleet_events, newest.fleet_events)


def test_a_bad_retire_rule_is_a_one_line_error() -> None:
    with pytest.raises(sim.ScenarioError.__mro__[1]) as info:
        sim.run(scenario(autoscaling={"kind": "target", "cold_start_s": 1,
                                      "retire": "oldest"}))
    message = str(info.value)
    assert "autoscaling.retire" in message and "'least_loaded'" in message \
        and "'newest'" in message and "\n" not in message


# -- graceful_shutdown_timeout_s ------------------------------------------------------------
def _three_busy(tmp_path: Path, timeout_s: float | None, poll_s: float | None = None,
                tail: tuple[float, ...] = (2.0, 2.5), last_size: int = 1) -> dict[str, Any]:
    # three resident replicas, each given one request at once (1 s an item; the third has
    # ``last_size`` items); with 3 ongoing and a target of 2 the autoscaler wants 2 at its
    # first tick (0.1 s): slot 2 is retired while busy; when it is gone 2 are ongoing and
    # slot 1 is retired at the next tick
    path = tmp_path / "three.csv"
    pd.DataFrame({"t": [0.0, 0.01, 0.02, *tail],
                  "size": [1, 1, last_size, *([1] * len(tail))]}).to_csv(path, index=False)
    return scenario(service={"kind": "linear", "base_ms": 0, "per_item_ms": 1000,
                             "deterministic": True},
                    workload={"kind": "trace", "path": str(path), "timestamp_column": "t",
                              "size_column": "size"},
                    routing="jsq", autoscaling={
                        "kind": "target", "min_replicas": 1, "max_replicas": 3,
                        "initial_replicas": 3, "target_ongoing_requests": 2,
                        "upscale_delay_s": 100, "downscale_delay_s": 0,
                        "look_back_period_s": 0.1, "control_period_s": 0.1,
                        "cold_start_s": 1, "graceful_shutdown_timeout_s": timeout_s,
                        "graceful_shutdown_wait_loop_s": poll_s})


@pytest.mark.parametrize("poll_s", [None, 2.0])
def test_a_draining_replica_still_busy_at_its_timeout_is_killed_and_its_requests_fail(
        tmp_path: Path, poll_s: float | None) -> None:
    kept = sim.run(_three_busy(tmp_path, None, poll_s))
    killed = sim.run(_three_busy(tmp_path, 0.3, poll_s))
    ev, req, batches = killed.fleet_events, killed.requests, killed.batches
    retires = ev[ev["event"] == "retire"]
    kills = ev[ev["event"] == "kill"]
    assert len(retires) == 2 and len(kills) == 2 and not (ev["event"] == "stop").any()
    for (_, retire), (_, kill) in zip(retires.iterrows(), kills.iterrows(), strict=True):
        r, kill_s = int(kill["replica"]), float(kill["time_s"])
        assert int(retire["replica"]) == r
        # at the deadline itself, also between two stop polls (the first poll is 2 s after
        # the removal): a kill at the next poll, or when the batch ends, fails here
        assert kill_s == pytest.approx(float(retire["time_s"]) + 0.3, abs=1e-12)
        mine = req[req["replica"] == r]
        assert len(mine) == 1  # the one request it ran fails at the kill, cause shutdown
        assert mine["status"].iloc[0] == "failed" and mine["reason"].iloc[0] == "shutdown"
        assert float(mine["finish_s"].iloc[0]) == pytest.approx(kill_s, abs=1e-12)
        # its batch is abandoned: failed, ended at the kill, not when its 1 s would end
        b = batches[batches["replica"] == r]
        assert bool(b["failed"].iloc[0]) and float(b["finish_s"].iloc[0]) == \
            pytest.approx(kill_s, abs=1e-12)
    # without the timeout the same replicas finish their requests and stop (or poll) later
    assert (kept.requests["status"] == "ok").all()
    assert (kept.fleet_events["event"] == "kill").sum() == 0
    # replica-seconds end at the kills: each killed replica counts 0.3 s past its removal,
    # where it counted until its stop (its request's end, or the poll after it) before
    kept_ev = kept.fleet_events
    saved_s = 0.0
    for _, kill in kills.iterrows():
        r = int(kill["replica"])
        stop_s = float(kept_ev.loc[(kept_ev["replica"] == r) & (kept_ev["event"] == "stop"),
                                   "time_s"].min())
        saved_s += stop_s - float(kill["time_s"])
    assert saved_s > 0
    # replica-seconds (the summary integrates the count series over its window) agree with
    # each replica's own deploy-to-kill spans read from the events: a kill that left the
    # count series (or the slot) busy until the batch's own end shows here
    hi_s = float(killed.summary["window_s"])
    assert killed.summary["replica_seconds"] == pytest.approx(
        sum(_alive_s(ev, r, hi_s) for r in range(3)), abs=1e-9)
    assert killed.summary["failed"] == 2 and killed.summary["ok"] == 3
    again = sim.run(_three_busy(tmp_path, 0.3, poll_s))  # same seed: the same run
    pd.testing.assert_frame_equal(again.requests, req)
    pd.testing.assert_frame_equal(again.batches, batches)


def _alive_s(events: pd.DataFrame, replica: int, end_s: float) -> float:
    """Seconds in [0, end_s] that ``replica`` held resources (deploy or launch to stop,
    kill or cancel).
    """
    total_s, since_s = 0.0, None
    for time_s, event in events.loc[events["replica"] == replica,
                                    ["time_s", "event"]].itertuples(index=False):
        if event in ("deploy", "launch"):
            since_s = time_s
        elif event in ("stop", "kill", "cancel") and since_s is not None:
            total_s += min(time_s, end_s) - min(since_s, end_s)
            since_s = None
    return total_s + (end_s - min(since_s, end_s) if since_s is not None else 0.0)


def test_a_killed_batch_s_late_end_neither_finishes_its_requests_nor_ends_the_run(
        tmp_path: Path) -> None:
    # no later arrivals; slot 2's request has 5 items (5 s): without the timeout the run
    # ends no earlier than it does (5.02 s; a control tick after it may come last). Killed
    # at 0.4 s, its batch's end at 5.02 s (still a pending event in the simulator) changes
    # no record and is not the run's end: that comes at most one control period (0.1 s)
    # after slot 0's request ends (1 s)
    kept = sim.run(_three_busy(tmp_path, None, tail=(), last_size=5))
    assert kept.meta["end_s"] >= 5.02 - 1e-9
    result = sim.run(_three_busy(tmp_path, 0.3, tail=(), last_size=5))
    assert result.meta["end_s"] <= 1.0 + 0.1 + 1e-9
    assert (result.requests["finish_s"] <= 1.0 + 1e-9).all()
    assert result.meta["status_counts"]["failed"] == 2


def test_an_idle_draining_replica_is_killed_at_its_timeout_between_polls(
        tmp_path: Path) -> None:
    # a 2 s poll period and a 0.3 s timeout: slot 2 (retired at 0.1 s) runs its request to
    # 1.02 s with no timeout; with a 1.5 s timeout it is idle at its deadline (1.6 s), before
    # its first poll (2.1 s): Ray's controller kills it then (the replica's drain loop still
    # sleeps, so it has not reported stopped); nothing fails
    result = sim.run(_three_busy(tmp_path, 1.5, 2.0))
    ev = result.fleet_events
    assert (result.requests["status"] == "ok").all()
    mine = ev[ev["replica"] == 2]
    retire_s = float(mine.loc[mine["event"] == "retire", "time_s"].iloc[0])
    ends = mine[mine["event"].isin(["stop", "kill"])]
    assert list(ends["event"]) == ["kill"]
    assert float(ends["time_s"].iloc[0]) == pytest.approx(retire_s + 1.5, abs=1e-12)


def test_the_fleet_kills_at_the_deadline_and_a_poll_at_that_instant_stops_an_idle_slot(
        ) -> None:
    fleet = Fleet(2, Want(2, initial_replicas=2), 1.0, stop_poll_s=2.0, kill_after_s=4.0)
    fleet.retire(1, 1.0)  # polls at 3, 5, ...; kill deadline 5
    assert fleet.next_poll_s() == 3.0
    assert fleet.poll(3.0, [0, 1]) == [] and fleet.kills_due(3.0) == []
    assert fleet.next_poll_s() == 5.0
    assert fleet.poll(5.0, [0, 0]) == [1] and fleet.kills_due(5.0) == []  # idle: a stop
    assert [e[2] for e in fleet.log.events if e[1] == 1][-1] == "stop"
    busy = Fleet(2, Want(2, initial_replicas=2), 1.0, stop_poll_s=2.0, kill_after_s=4.0)
    busy.retire(1, 1.0)
    # a late call (a live loop) at 8 s with the slot busy: the polls at 3 and 5 find it
    # busy, the kill at 5 comes before the poll at 7, which is not run
    assert busy.poll(8.0, [0, 1]) == []
    assert busy.kills_due(8.0) == [(1, 5.0)]
    busy.kill(1, 5.0)
    assert busy.state[1] == OFF and busy.next_poll_s() == float("inf")
    with pytest.raises(ValueError, match="not draining"):
        busy.kill(1, 6.0)
    assert DRAINING not in busy.state
