"""``queue.max_ongoing_requests``: Ray Serve's bound on what a replica holds (queued + running),
the rest waiting at the router in arrival order (:mod:`sim.serving.admission`).

Every check below is exact (the simulator is deterministic): the bound is never passed, a
request waits at the router only while every replica it may go to is full, the wait is FIFO,
``max_len`` bounds it, timeouts reach requests that wait there, a batcher sees the time a
request joined its queue (not its arrival), and the autoscaler counts the wait.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from sim.scenario.schema import ScenarioError, validate_scenario


def _scenario(**over: Any) -> dict[str, Any]:
    scn: dict[str, Any] = {
        "name": "held", "seed": 3,
        "service": {"kind": "linear", "base_ms": 20, "per_item_ms": 5, "deterministic": True},
        "workload": {"kind": "poisson", "rate_rps": 300, "n_requests": 1500},
        "policy": {"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 5,
                   "timer": "arrival"},
        "replicas": 3, "routing": "p2c", "queue": {"max_ongoing_requests": 6}}
    scn.update(over)
    return scn


def _ongoing_at(req: pd.DataFrame, replica: int, t_s: np.ndarray) -> np.ndarray:
    """Requests at ``replica`` (joined its queue, not yet finished) just after each time."""
    mine = req[req["replica"] == replica]
    joined = np.sort(mine["joined_s"].to_numpy())
    ended = np.sort(mine["finish_s"].to_numpy())
    return (np.searchsorted(joined, t_s, side="right")
            - np.searchsorted(ended, t_s, side="right"))


def test_a_replica_never_holds_more_than_the_bound_and_the_router_waits_in_order() -> None:
    # 300 req/s against 3 replicas that serve at most 3 * 4 / 40 ms = 300 req/s: a queue
    # builds and most requests wait at the router
    res = sim.run(_scenario())
    req = res.requests
    assert res.summary["ok"] == 1500
    held = req["joined_s"] > req["arrival_s"]
    assert held.sum() > 500  # the bound acts (else this test checks nothing)
    # FIFO at the router: any arrival while others wait waits too, and the wait is served
    # oldest first, so join times follow arrival order
    assert np.all(np.diff(req.sort_values("id")["joined_s"].to_numpy()) >= 0)
    events = np.unique(np.concatenate([req["joined_s"].to_numpy(),
                                       req["finish_s"].to_numpy()]))
    at = {r: _ongoing_at(req, r, events) for r in range(3)}
    assert max(int(v.max()) for v in at.values()) == 6  # reached, never passed
    # a request waits only while every replica is full: at its arrival all three held 6
    t_held = req.loc[held, "arrival_s"].to_numpy()
    for r in range(3):
        assert np.all(_ongoing_at(req, r, t_held - 1e-12) == 6)
    # and it joins when a replica gets room: at a finish on the replica it joins
    joins = req.loc[held, ["joined_s", "replica"]]
    finishes = set(zip(req["finish_s"].round(12), req["replica"], strict=True))
    assert all((round(t, 12), r) in finishes for t, r in joins.itertuples(index=False))


def test_without_the_bound_nothing_waits_at_the_router() -> None:
    scn = _scenario(queue={})
    res = sim.run(scn)
    assert "joined_s" not in res.requests.columns
    # the same arrivals and service: the bound only moves where requests wait, so every
    # request is served in both runs
    assert res.summary["ok"] == sim.run(_scenario()).summary["ok"] == 1500


def test_max_len_bounds_the_wait_at_the_router_and_timeouts_reach_it() -> None:
    res = sim.run(_scenario(queue={"max_ongoing_requests": 6, "max_len": 10},
                            workload={"kind": "poisson", "rate_rps": 600,
                                      "n_requests": 1500}))
    req, summary = res.requests, res.summary
    assert summary["rejected"] > 0
    assert set(req.loc[req["status"] == "rejected", "reason"]) == {"queue_full"}
    # a rejected request found 10 waiting at the router: the accepted ones that arrived
    # before it and had not yet joined a replica
    accepted = req[req["status"] != "rejected"]
    for t_s in req.loc[req["status"] == "rejected", "arrival_s"].to_numpy()[:50]:
        waiting = ((accepted["arrival_s"] < t_s) & (accepted["joined_s"] > t_s)).sum()
        assert waiting == 10
    # a bound of 4, the batch size: a full replica may hold only a running batch, so a
    # request at the router can wait past its timeout
    timed = sim.run(_scenario(queue={"max_ongoing_requests": 4, "timeout_ms": 50},
                              workload={"kind": "poisson", "rate_rps": 600,
                                        "n_requests": 1500}))
    out = timed.requests
    gone = out[out["status"] == "timed_out"]
    assert len(gone) > 0
    # some timed out while they waited at the router (never joined a replica)
    assert (gone["replica"] == -1).sum() > 0
    assert timed.summary["ok"] + len(gone) == 1500
    # a bound of 6 leaves at least 2 queued behind a batch of 4 at each full replica; they
    # arrived before any request at the router and time out first, each letting the
    # router's oldest in: none times out at the router (it did while an expiry at a
    # replica did not release the router's wait)
    six = sim.run(_scenario(queue={"max_ongoing_requests": 6, "timeout_ms": 50},
                            workload={"kind": "poisson", "rate_rps": 600,
                                      "n_requests": 1500})).requests
    gone = six[six["status"] == "timed_out"]
    assert len(gone) > 0 and (gone["replica"] >= 0).all()


def test_a_batcher_times_a_held_request_from_when_it_joined(tmp_path: Path) -> None:
    # one replica holding at most 4, batches of up to 4, the oldest request's timer 20 ms;
    # ten arrivals 1 ms apart, each batch 50 ms. Ids 0-3 join at once and run as a full
    # batch at 3 ms; 4-7 wait, join at 53 ms (full again) and run at once; 8 and 9 join at
    # 103 ms and wait their 20 ms from there: their batch starts at 123 ms. Timed from their
    # arrivals (8, 9 ms) it would start at 103 ms.
    trace = tmp_path / "t.csv"
    pd.DataFrame({"t": np.arange(10) * 0.001}).to_csv(trace, index=False)
    res = sim.run(_scenario(
        replicas=1, service={"kind": "constant", "ms": 50},
        workload={"kind": "trace", "path": str(trace), "timestamp_column": "t"},
        policy={"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 20,
                "timer": "request"},
        queue={"max_ongoing_requests": 4}))
    start = res.requests.sort_values("id")["start_s"].to_numpy()
    np.testing.assert_allclose(start, [0.003] * 4 + [0.053] * 4 + [0.123] * 2, atol=1e-9)


def test_the_autoscaler_counts_requests_waiting_at_the_router() -> None:
    # one replica holding at most 2 and a target of 2 ongoing: only the wait at the router
    # can ask for more replicas
    scn = _scenario(replicas=1, queue={"max_ongoing_requests": 2},
                    workload={"kind": "poisson", "rate_rps": 200, "duration_s": 10},
                    autoscaling={"kind": "target", "min_replicas": 1, "max_replicas": 4,
                                 "target_ongoing_requests": 2, "upscale_delay_s": 0.5,
                                 "downscale_delay_s": 5, "look_back_period_s": 1,
                                 "control_period_s": 0.2, "cold_start_s": 1})
    del scn["replicas"]
    res = sim.run(scn)
    assert res.replicas is not None
    assert int(res.replicas["replicas"].max()) == 4
    a = sim.run(scn)  # the same seed: the same run
    pd.testing.assert_frame_equal(a.requests, res.requests)


def test_the_bound_needs_per_replica_queues() -> None:
    with pytest.raises(ScenarioError, match=r"queue\.max_ongoing_requests.*routing"):
        validate_scenario(_scenario(routing="shared"))
    with pytest.raises(ScenarioError, match="max_ongoing_requests"):
        validate_scenario(_scenario(queue={"max_ongoing_requests": 0}))


def _outside_day(tmp_path: Path, outside_ms: float) -> Any:
    # one request every 20 ms, 5 ms after each 20 ms mark (a trace starts at its first row:
    # one at 0 first), each served alone in 10 ms: at every control tick (multiples of
    # 0.2 s) the last request finished 5 ms before, so the replica holds none; counted
    # 10 ms past its batch's end, it is still ongoing at each
    trace = tmp_path / "t.csv"
    pd.DataFrame({"t": np.r_[0.0, 0.005 + 0.02 * np.arange(499)]}).to_csv(trace, index=False)
    scn = _scenario(
        service={"kind": "constant", "ms": 10, "deterministic": True},
        workload={"kind": "trace", "path": str(trace), "timestamp_column": "t"},
        policy={"kind": "greedy", "max_batch_size": 1}, queue={},
        autoscaling={"kind": "target", "min_replicas": 1, "max_replicas": 4,
                     "target_ongoing_requests": 0.5, "upscale_delay_s": 0,
                     "downscale_delay_s": 600, "look_back_period_s": 1,
                     "control_period_s": 0.2, "cold_start_s": 0.1,
                     "outside_ms": outside_ms})
    del scn["replicas"]
    return sim.run(scn)


def test_the_autoscaler_counts_the_path_outside_the_replica(tmp_path: Path) -> None:
    # Ray Serve's ongoing count holds a request from its proxy's router until the proxy
    # has the answer; autoscaling.outside_ms counts each request that long past its batch.
    # Without it every tick sees 0 ongoing and one replica stays; with 10 ms every tick
    # sees 1, and a target of 0.5 asks for ceil(1 / 0.5) = 2
    alone, counted = _outside_day(tmp_path, 0.0), _outside_day(tmp_path, 10.0)
    assert alone.replicas is not None and counted.replicas is not None
    assert int(alone.replicas["replicas"].max()) == 1
    assert int(counted.replicas["replicas"].max()) == 2
    # a request answered 5 ms before a tick is outside 5 ms later: 4 ms does not count it
    assert int(_outside_day(tmp_path, 4.0).replicas["replicas"].max()) == 1
    # the requests are served alike (the count only moves the fleet)
    assert alone.summary["ok"] == counted.summary["ok"] == 500


def test_a_closed_loop_without_think_time_refuses_a_queue_bound() -> None:
    # a rejected client resends at once: with no think time it would be rejected again at
    # the same instant for ever (a review found it filling 20 GB before the OOM killer)
    with pytest.raises(ScenarioError, match=r"workload\.think_ms: 0 with queue\.max_len"):
        validate_scenario(_scenario(
            workload={"kind": "closed", "clients": 50, "think_ms": 0, "duration_s": 5},
            queue={"max_len": 2}))
    ok = sim.run(_scenario(
        workload={"kind": "closed", "clients": 50, "think_ms": 1, "duration_s": 2},
        queue={"max_len": 2}))
    assert ok.summary["rejected"] > 0
