"""Regressions found reviewing round 44 (``queue.max_ongoing_requests``, a scale-down that
cancels starting replicas): requests that waited at the router while a replica had room,
a cancelled replica's requests left on an idle replica, and routers that read a filtered
load list's indices as positions.

Every check is exact (deterministic service, traced arrivals). The runs that used to hang
(the autoscaler ticked for ever with a request nobody would serve) are bounded with
``drain_timeout_s``, so a regression fails as censored requests instead of hanging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from sim.serving.admission import Admission
from sim.serving.routing import JoinShortestQueue, LeastWork, ReplicaLoad


def _trace(tmp_path: Path, times_s: list[float]) -> dict[str, Any]:
    path = tmp_path / "t.csv"
    pd.DataFrame({"t": times_s}).to_csv(path, index=False)
    return {"kind": "trace", "path": str(path), "timestamp_column": "t"}


def _one_replica(workload: dict[str, Any], policy: dict[str, Any],
                 queue: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"name": "review", "seed": 1,
            "service": {"kind": "constant", "ms": 50, "deterministic": True},
            "workload": workload, "policy": policy, "replicas": 1, "routing": "p2c",
            "queue": queue, **over}


def test_a_request_timing_out_at_a_replica_lets_the_router_wait_in(tmp_path: Path) -> None:
    # one replica holding at most 2, whose batcher waits up to 300 ms for a batch of 4;
    # timeouts of 100 ms. Ids 0 and 1 join at once and wait for the batcher; 2-4 wait at
    # the router. 0 expires at 100 ms and 1 at 101 ms, each leaving room: 2 joins at
    # 100 ms, 3 at 101 ms, 4 when 2 expires (150 ms). Before the fix the router's wait
    # moved only when a batch ended or a replica became ready, so 2-4 waited at the router
    # (replica -1) until they expired, with the replica empty.
    res = sim.run(_one_replica(
        _trace(tmp_path, [0.0, 0.001, 0.050, 0.060, 0.070]),
        {"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 300, "timer": "request"},
        {"max_ongoing_requests": 2, "timeout_ms": 100}))
    req = res.requests.sort_values("id")
    assert (req["replica"] == 0).all()
    np.testing.assert_allclose(req["joined_s"], [0.0, 0.001, 0.100, 0.101, 0.150],
                               atol=1e-12)
    assert (req["status"] == "timed_out").all()


def test_a_policy_drop_lets_the_router_wait_in(tmp_path: Path) -> None:
    # one replica holding at most 2, the slo policy, deadlines 60 ms, batches of 50 ms.
    # Id 0 runs at 0 s, 1 joins the queue, 2-4 wait at the router. At 50 ms 0 ends: 2
    # joins; neither 1 nor 2 can meet its deadline, so the policy drops both, which leaves
    # the replica empty: 3 and 4 join at 50 ms and are dropped too. Before the fix they
    # waited at the router for a batch end that never came (in flight at the run's end;
    # with an autoscaler the run never ended: it ticked for ever).
    res = sim.run(_one_replica(
        _trace(tmp_path, [0.0, 0.001, 0.002, 0.003, 0.004]),
        {"kind": "slo", "max_batch_size": 4}, {"max_ongoing_requests": 2}, slo_ms=60),
        drain_timeout_s=1.0)
    req = res.requests.sort_values("id")
    assert res.summary["in_flight"] == 0
    assert req["status"].tolist() == ["ok"] + ["dropped"] * 4
    np.testing.assert_allclose(req["joined_s"], [0.0, 0.001, 0.05, 0.05, 0.05], atol=1e-12)


@pytest.mark.parametrize("max_ongoing", [None, 8])
def test_a_cancelled_launch_s_requests_start_on_an_idle_ready_replica(
        tmp_path: Path, max_ongoing: int | None) -> None:
    # a schedule 0 -> 1 (0.125 s) -> 2 (0.25 s) -> 1 (0.5 s), cold starts 0.3 s: slot 0
    # starts at 0.125 s, slot 1 at 0.25 s; the arrivals at 0.26-0.29 s find no replica
    # ready and are routed in turn to the two starting slots. Slot 0 is ready at 0.425 s,
    # runs what it holds and is idle by 0.435 s; at 0.5 s the scale-down cancels slot 1
    # (starting) and its two requests go to slot 0, which must start them then. Before
    # the fix nothing consulted slot 0 (a rerouted queue was not marked as fed): the two
    # requests sat there and the run never ended (the autoscaler ticked for ever).
    queue = {} if max_ongoing is None else {"max_ongoing_requests": max_ongoing}
    res = sim.run({
        "name": "review", "seed": 1,
        "service": {"kind": "constant", "ms": 10, "deterministic": True},
        "workload": _trace(tmp_path, [0.0, 0.26, 0.27, 0.28, 0.29]),
        "policy": {"kind": "greedy", "max_batch_size": 8}, "routing": "round_robin",
        "queue": queue,
        "autoscaling": {"kind": "schedule", "steps": [[0, 0], [0.125, 1], [0.25, 2],
                                                      [0.5, 1]],
                        "max_replicas": 2, "control_period_s": 0.125, "cold_start_s": 0.3}},
        drain_timeout_s=1.0)
    ev = res.fleet_events
    assert ev[["time_s", "replica", "event"]].values.tolist() == [
        [0.125, 0, "launch"], [0.25, 1, "launch"], [0.425, 0, "ready"], [0.5, 1, "cancel"]]
    req = res.requests.sort_values("id")
    assert (req["status"] == "ok").all() and (req["replica"] == 0).all()
    np.testing.assert_allclose(req["start_s"], [0.425, 0.5, 0.425, 0.5, 0.425], atol=1e-12)


def _room_router(router: Any, loads: list[ReplicaLoad], running: list[int],
                 limit: int) -> int | None:
    """Admission._route_with_room over given loads (no fleet)."""
    adm = object.__new__(Admission)
    adm.max_ongoing, adm.router, adm.candidates = limit, router, None
    adm.running_of = lambda r: running[r]
    adm.loads = lambda now_s, slots: loads
    return adm._route_with_room(0.0, 0)


@pytest.mark.parametrize("router", [JoinShortestQueue(), LeastWork()])
def test_routers_that_return_a_load_s_index_pick_among_replicas_with_room(router) -> None:
    # replicas 0 and 1 have room, 2 is full (2 queued + 1 running of 3). jsq and
    # least_work return the chosen load's ``index`` field, which the room list must
    # number by position: before the fix the room list kept the replicas' own numbers,
    # so picking replica 1 (position 0 after a full replica 0 left the list) read room[1],
    # and picking the last replica raised IndexError
    loads = [ReplicaLoad(0, 2, 2, 1, 9.0), ReplicaLoad(1, 1, 1, 1, 2.0),
             ReplicaLoad(2, 0, 0, 0, 0.5)]
    running = [1, 1, 0]
    assert _room_router(router, loads, running, 3) == 2  # the least loaded: 2 (was IndexError)
    loads[2] = ReplicaLoad(2, 0, 0, 1, 5.0)
    running[2] = 1
    loads[1] = ReplicaLoad(1, 0, 0, 1, 1.0)
    # replica 0 full; 1 is the least loaded of 1 and 2 (position 0): was routed to 2
    assert _room_router(router, loads, running, 3) == 1
    assert _room_router(router, [ReplicaLoad(0, 2, 2, 1, 1.0)], [1], 3) is None


@pytest.mark.parametrize("routing", ["jsq", "least_work"])
def test_jsq_and_least_work_keep_the_bound(routing: str) -> None:
    # three replicas holding at most 2, offered more than they serve: requests wait at the
    # router and are released among the replicas with room (IndexError before the fix)
    res = sim.run({"name": "review", "seed": 5,
                   "service": {"kind": "linear", "base_ms": 20, "per_item_ms": 3,
                               "deterministic": True},
                   "workload": {"kind": "poisson", "rate_rps": 600, "n_requests": 600},
                   "policy": {"kind": "greedy", "max_batch_size": 1}, "replicas": 3,
                   "routing": routing, "queue": {"max_ongoing_requests": 2}})
    req = res.requests
    assert res.summary["ok"] == 600
    assert (req["joined_s"] > req["arrival_s"]).sum() > 100  # the bound acts
    events = np.unique(np.r_[req["joined_s"].to_numpy(), req["finish_s"].to_numpy()])
    for r in range(3):
        mine = req[req["replica"] == r]
        ongoing = (np.searchsorted(np.sort(mine["joined_s"]), events, side="right")
                   - np.searchsorted(np.sort(mine["finish_s"]), events, side="right"))
        assert int(ongoing.max()) <= 2
