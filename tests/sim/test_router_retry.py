"""``queue.retry``: a router that retries held requests as Ray Serve 2.60's routing tasks do
(:mod:`sim.serving.router_tasks`, :mod:`sim.serving.admission`).

The schedules below are worked out by hand from the rules (the simulator is deterministic,
so every time is exact): a task tries at once twice, then sleeps 25, 50, 100, 200, 400,
500, 500 ms between tries; nothing wakes it early; a replica it finds goes to the oldest
waiting request, whose own task is then cancelled; there are at most two tasks per ready
replica.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
from sim.scenario.build import Streams, build_core
from sim.scenario.schema import ScenarioError, validate_scenario
from sim.serving.router_tasks import RetryConfig

SERVICE_MS = 100.0


def _scenario(tmp_path: Path, arrivals_s: list[float], **over: Any) -> dict[str, Any]:
    trace = tmp_path / "arrivals.csv"
    pd.DataFrame({"t": arrivals_s}).to_csv(trace, index=False)
    scn: dict[str, Any] = {
        "name": "retry", "seed": 1,
        "service": {"kind": "constant", "ms": SERVICE_MS, "deterministic": True},
        "workload": {"kind": "trace", "path": str(trace), "timestamp_column": "t"},
        "policy": {"kind": "greedy", "max_batch_size": 1},
        "replicas": 1, "routing": "p2c", "warmup_s": 0,
        "queue": {"max_ongoing_requests": 1, "retry": {}}}
    scn.update(over)
    return scn


def _joined(res: Any) -> np.ndarray:
    return res.requests.sort_values("id")["joined_s"].to_numpy()


def test_the_back_off_doubles_from_25_ms_to_a_500_ms_cap() -> None:
    cfg = RetryConfig()
    assert [round(cfg.backoff_s(k) * 1e3, 9) for k in range(8)] == [
        25, 50, 100, 200, 400, 500, 500, 500]
    assert cfg.backoff_s(10**6) == 0.5  # no overflow far past the cap
    assert RetryConfig(backoff_multiplier=1.0).backoff_s(50) == 0.025
    assert [cfg.n_tasks(n) for n in (0, 1, 4, 25, 30)] == [0, 2, 8, 50, 50]


def test_a_held_request_waits_for_its_task_to_wake_not_for_the_room(tmp_path: Path) -> None:
    # r0 runs 0-100 ms. r1 (arrives 1 ms) finds the replica full: its task tries at 1 ms
    # twice, then at 26, 76 and 176 ms; the room came at 100 ms, so r1 joins at 176 ms.
    # r2 (2 ms) gets the second task: tries at 2, 27, 77, 177 ms (r1 runs then: full),
    # then sleeps 200 ms to 377 ms (r1 ended at 276 ms) and joins then.
    res = sim.run(_scenario(tmp_path, [0.0, 0.001, 0.002]))
    assert np.allclose(_joined(res), [0.0, 0.176, 0.377], atol=1e-9)
    starts = res.requests.sort_values("id")["start_s"].to_numpy()
    assert np.allclose(starts, [0.0, 0.176, 0.377], atol=1e-9)
    # without retry the router sends each on the moment the replica has room
    plain = sim.run(_scenario(tmp_path, [0.0, 0.001, 0.002],
                              queue={"max_ongoing_requests": 1}))
    assert np.allclose(_joined(plain), [0.0, 0.1, 0.2], atol=1e-9)


def test_a_replica_found_goes_to_the_oldest_request_and_its_task_is_cancelled(
        tmp_path: Path) -> None:
    # r1 (1 ms) is routed by task A: tries at 1 ms, then 26, 76, 176 ms. r2 (90 ms) by
    # task B: tries at 90 ms, then 115 ms, when the replica (free since 100 ms) has room.
    # B gives it to the oldest request, r1 (not its own r2), and A is cancelled. B keeps
    # r2 and its back-off: it sleeps 50 ms to 165 ms (r1 runs 115-215: full), 100 ms to
    # 265 ms, and places r2 then. A task that placed its own request first would have
    # put r2 in at 115 ms and r1 at 176 ms.
    res = sim.run(_scenario(tmp_path, [0.0, 0.001, 0.090]))
    assert np.allclose(_joined(res), [0.0, 0.115, 0.265], atol=1e-9)


def test_a_task_goes_on_with_the_next_request_and_room_goes_to_the_oldest(
        tmp_path: Path) -> None:
    # ten requests 1 ms apart against one replica holding one: tasks A (r1) and B (r2).
    # A places r1 at 176 ms (its own) and goes on with the next request no task routes
    # (r3), its back-off afresh: tries at 176 ms twice (r1 runs: full), then at 201, 251
    # and 351 ms (r1 ended at 276 ms: room). The room goes to the oldest, r2 (B's, whose
    # next try was 377 ms): r2 joins at 351 ms and B is cancelled. A task that ended after
    # its own request (or kept its old back-off) would leave r2 to B, at 377 ms
    arrivals = [0.001 * i for i in range(10)]
    res = sim.run(_scenario(tmp_path, arrivals))
    joined = _joined(res)
    assert res.summary["ok"] == 10
    assert np.all(np.diff(joined) > 0)  # FIFO: the oldest first
    assert joined[1] == pytest.approx(0.176, abs=1e-9)
    assert joined[2] == pytest.approx(0.351, abs=1e-9)


@pytest.mark.parametrize(("replicas", "per_replica", "cap", "expected"), [
    (1, 2, 50, 2), (3, 2, 50, 6), (3, 2, 4, 4), (2, 3, 50, 6)])
def test_at_most_tasks_per_replica_times_ready_replicas_and_the_cap(
        tmp_path: Path, replicas: int, per_replica: int, cap: int, expected: int) -> None:
    # 40 requests at once against replicas holding one each: all but one per replica wait,
    # and min(cap, per_replica x replicas) routing tasks run for them, no more
    scn = validate_scenario(_scenario(
        tmp_path, [0.0] * 40, replicas=replicas,
        queue={"max_ongoing_requests": 1,
               "retry": {"tasks_per_replica": per_replica, "max_tasks": cap}}))
    core = build_core(scn, Streams.from_seed(1), lambda items: SERVICE_MS / 1e3)
    core.step(0.0)
    assert core.admission.n_held == 40 - replicas
    assert core.admission.tasks is not None
    assert core.admission.tasks.count == expected


def test_no_ready_replica_means_no_routing_task(tmp_path: Path) -> None:
    # from zero replicas: requests wait at the router (no task runs with no replica ready)
    # and go in only once the first replica is ready
    scn = _scenario(tmp_path, [0.0, 0.001, 0.002], replicas=None,
                    autoscaling={"kind": "target", "min_replicas": 0, "max_replicas": 1,
                                 "initial_replicas": 0, "cold_start_s": 0.5,
                                 "target_ongoing_requests": 1, "upscale_delay_s": 0,
                                 "downscale_delay_s": 60, "control_period_s": 0.1})
    scn.pop("replicas")
    res = sim.run(scn)
    assert res.summary["ok"] == 3
    joined = _joined(res)
    assert joined.min() >= 0.5 - 1e-9  # nothing joined before the replica was ready


def test_timeouts_reach_requests_routing_tasks_hold_and_nothing_is_lost(tmp_path: Path) -> None:
    arrivals = list(np.sort(np.random.default_rng(5).uniform(0, 2.0, 120)))
    res = sim.run(_scenario(tmp_path, arrivals, replicas=3,
                            queue={"max_ongoing_requests": 2, "timeout_ms": 400,
                                   "retry": {}}))
    req = res.requests
    assert len(req) == 120
    status = {k: v for k, v in req["status"].value_counts().to_dict().items() if v}
    assert set(status) <= {"ok", "timed_out"}
    assert status.get("timed_out", 0) > 0 and status.get("ok", 0) > 0
    # a request that timed out never joined a replica after its deadline
    done = req[req["status"] == "ok"]
    assert np.all(done["joined_s"] <= done["arrival_s"] + 0.4 + 1e-9)


def test_the_bound_holds_and_the_same_seed_gives_the_same_run(tmp_path: Path) -> None:
    arrivals = list(np.sort(np.random.default_rng(7).uniform(0, 3.0, 300)))
    scn = _scenario(tmp_path, arrivals, replicas=3,
                    policy={"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 5,
                            "timer": "arrival"},
                    queue={"max_ongoing_requests": 4, "retry": {}})
    a, b = sim.run(scn), sim.run(scn)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    req = a.requests
    assert a.summary["ok"] == 300
    events = np.unique(np.concatenate([req["joined_s"], req["finish_s"]]))
    for r in range(3):
        mine = req[req["replica"] == r]
        joined = np.sort(mine["joined_s"].to_numpy())
        ended = np.sort(mine["finish_s"].to_numpy())
        ongoing = (np.searchsorted(joined, events, side="right")
                   - np.searchsorted(ended, events, side="right"))
        assert ongoing.max() <= 4


@pytest.mark.parametrize(("queue", "field"), [
    ({"retry": {}}, "queue.retry"),
    ({"max_ongoing_requests": 4, "retry": {"initial_backoff_ms": 50,
                                            "max_backoff_ms": 10}}, "max_backoff_ms"),
    ({"max_ongoing_requests": 4, "retry": {"initial_backoff_ms": 0}}, "initial_backoff_ms"),
    ({"max_ongoing_requests": 4, "retry": {"backoff_multiplier": 0.5}}, "backoff_multiplier"),
    ({"max_ongoing_requests": 4, "retry": {"tasks_per_replica": 0}}, "tasks_per_replica"),
    ({"max_ongoing_requests": 4, "retry": {"max_backoff_ms": float("inf")}}, "max_backoff_ms"),
    ({"max_ongoing_requests": 4, "retry": {"jitter": 1}}, "jitter"),
])
def test_bad_retry_settings_are_refused_by_name(tmp_path: Path, queue: dict[str, Any],
                                                field: str) -> None:
    with pytest.raises(ScenarioError, match=field):
        validate_scenario(_scenario(tmp_path, [0.0], queue=queue))
