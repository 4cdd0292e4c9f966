"""Review of round 45 (``queue.retry``, ``autoscaling.graceful_shutdown_timeout_s``,
``autoscaling.retire: newest``): a seeded fuzz over random scenarios that combine them with
the batching policies, routers, bounds, timeouts and bursty workloads, and hand-checked
edge cases.

Every check in the fuzz is an exact fact of the rules (the simulator is deterministic):
conservation, order of times, the ``max_ongoing_requests`` bound, FIFO joins from the
router's wait with retry, joins only to ready replicas with retry, kills at exactly their
deadline, the same seed giving the same tables. A wall-clock guard turns a hang into a
failure naming the scenario.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim

N_SCENARIOS = 300
TERMINAL = {"ok", "rejected", "timed_out", "dropped", "failed"}
EPS_S = 1e-9  # float rounding of sums of times (a deadline = retire time + timeout)


@contextmanager
def _wall_guard(limit_s: float, what: str) -> Iterator[None]:
    """Fail (instead of hanging) if the body runs longer than ``limit_s`` of wall time."""
    def _alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"run took over {limit_s} s of wall time (a hang?): {what}")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _bursty_trace(rng: np.random.Generator, path: Path, n: int, rate_rps: float) -> None:
    """Arrivals in bursts: clumps of simultaneous or near-simultaneous requests."""
    times: list[float] = []
    t = 0.0
    while len(times) < n:
        t += rng.exponential(1.0 / rate_rps) * rng.integers(1, 8)
        k = int(rng.integers(1, 12))
        spread_s = 0.0 if rng.random() < 0.5 else float(rng.uniform(0, 0.02))
        times += list(t + np.sort(rng.uniform(0, spread_s, k)))
    pd.DataFrame({"t": np.sort(np.round(times[:n], 6))}).to_csv(path, index=False)


def _random_scenario(seed: int, tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    service_ms = float(rng.uniform(10, 60))
    service = pick([{"kind": "constant", "ms": service_ms, "deterministic": True},
                    {"kind": "exponential", "mean_ms": service_ms},
                    {"kind": "gamma", "mean_ms": service_ms, "cv": 0.5}])
    batch = int(rng.integers(1, 5))
    kind = pick(["greedy", "dynamic", "slo"])
    policy: dict[str, Any] = {"kind": kind, "max_batch_size": batch}
    if kind == "dynamic":
        policy.update(max_wait_ms=float(rng.uniform(1, 20)), timer=pick(["first", "arrival"]))
    autoscaled = rng.random() < 0.5
    replicas = int(rng.integers(1, 5))
    capacity_rps = replicas * batch / (service_ms / 1e3)
    n = int(rng.integers(100, 260))
    if rng.random() < 0.5:
        workload: dict[str, Any] = {
            "kind": "mmpp", "n_requests": n,
            "rates_rps": [capacity_rps * float(rng.uniform(0.01, 0.3)),
                          capacity_rps * float(rng.uniform(0.8, 3.0))],
            "mean_dwell_s": [float(rng.uniform(0.2, 1.5)), float(rng.uniform(0.05, 0.5))]}
    else:
        path = tmp_path / f"trace{seed}.csv"
        _bursty_trace(rng, path, n, capacity_rps * float(rng.uniform(0.3, 1.5)))
        workload = {"kind": "trace", "path": str(path), "timestamp_column": "t"}
    queue: dict[str, Any] = {}
    if rng.random() < 0.85:
        queue["max_ongoing_requests"] = int(rng.integers(1, 6))
        if rng.random() < 0.6:
            queue["retry"] = pick([{}, {"tasks_per_replica": int(rng.integers(1, 4)),
                                        "max_tasks": int(rng.integers(1, 9)),
                                        "initial_backoff_ms": float(rng.uniform(2, 40)),
                                        "max_backoff_ms": 200.0}])
    if rng.random() < 0.3:
        queue["max_len"] = int(rng.integers(3, 40))
    if rng.random() < 0.3:
        queue["timeout_ms"] = float(rng.uniform(50, 800))
    scn: dict[str, Any] = {
        "name": f"fuzz{seed}", "seed": seed, "service": service, "workload": workload,
        "policy": policy, "routing": pick(["p2c", "jsq", "random", "round_robin",
                                           "least_work"]),
        "queue": queue, "warmup_s": 0}
    if kind == "slo":
        scn["slo_ms"] = service_ms * float(rng.uniform(1.5, 6))
    if autoscaled:
        lo = int(rng.integers(0, 2))
        scn["autoscaling"] = {
            "kind": "target", "min_replicas": lo, "max_replicas": max(lo, replicas),
            "cold_start_s": float(pick([0.0, rng.uniform(0.01, 0.4)])),
            "target_ongoing_requests": float(rng.integers(1, 4)),
            "upscale_delay_s": float(rng.uniform(0, 0.3)),
            "downscale_delay_s": float(rng.uniform(0, 0.2)),
            "look_back_period_s": float(rng.uniform(0.1, 0.6)),
            "control_period_s": float(rng.uniform(0.03, 0.15)),
            "retire": pick(["newest", "least_loaded"])}
        if rng.random() < 0.6:
            scn["autoscaling"]["graceful_shutdown_wait_loop_s"] = float(rng.uniform(0.02, 0.3))
        if rng.random() < 0.7:
            scn["autoscaling"]["graceful_shutdown_timeout_s"] = float(rng.uniform(0.005, 0.08))
    else:
        scn["replicas"] = replicas
    return scn


def _ready_intervals(events: pd.DataFrame) -> dict[int, list[tuple[float, float]]]:
    """Per slot, the intervals in which it was ready (taking new work)."""
    out: dict[int, list[tuple[float, float]]] = {}
    open_s: dict[int, float] = {}
    for t, r, ev in events[["time_s", "replica", "event"]].itertuples(index=False):
        if ev in ("ready", "deploy"):
            open_s[int(r)] = float(t)
        elif ev in ("retire", "stop", "kill", "cancel") and int(r) in open_s:
            out.setdefault(int(r), []).append((open_s.pop(int(r)), float(t)))
    for r, t in open_s.items():
        out.setdefault(r, []).append((t, np.inf))
    return out


def _check_run(scn: dict[str, Any], res: Any) -> dict[str, int]:
    """The exact facts every run must satisfy; returns what was exercised."""
    req = res.requests.sort_values("id").reset_index(drop=True)
    what = scn["name"]
    queue = scn["queue"]
    retry = "retry" in queue
    # conservation: every request once, each in one terminal status
    assert req["id"].tolist() == list(range(len(req))), what
    assert set(req["status"].astype(str)) <= TERMINAL, (what, req["status"].value_counts())
    assert res.summary["in_flight"] == 0 and res.summary["censored"] == 0, what
    arrival, start, finish = req["arrival_s"], req["start_s"], req["finish_s"]
    if "joined_s" not in req:  # no router wait: a request joins its queue on arrival
        req["joined_s"] = arrival
    joined, replica, status = req["joined_s"], req["replica"], req["status"].astype(str)
    # times in order where defined
    assert (finish >= arrival - EPS_S).all(), what
    ran = start.notna()
    assert (joined[ran] >= arrival[ran]).all() and (start[ran] >= joined[ran]).all(), what
    assert (finish[ran] >= start[ran]).all(), what
    assert ((status == "ok") <= ran).all(), what
    placed = replica >= 0
    if "max_ongoing_requests" in queue:
        assert (joined[placed] <= finish[placed] + EPS_S).all(), what
        # nothing waits at the router and then runs without joining a replica
        assert (placed | ~ran).all(), what
    # the bound: never more than max_ongoing requests at a replica (joined .. finish)
    limit = queue.get("max_ongoing_requests")
    events = res.fleet_events if "autoscaling" in scn else pd.DataFrame(
        columns=["time_s", "replica", "event"])
    moved_s = np.sort(events.loc[events["event"].isin(["retire", "cancel"]),
                                 "time_s"].to_numpy(float))
    if limit is not None:
        at = req[placed].copy()
        moved_at = np.append(moved_s, np.inf)  # (never empty)
        # a removed replica's request routed straight to another keeps its first join
        # time (admission.requeue): it is at its last replica from the last retire or
        # cancel before it started (or ended) at the latest; count it from there
        until = np.where(at["start_s"].notna(), at["start_s"], at["finish_s"])
        k = np.searchsorted(moved_s, until.astype(float) + EPS_S, side="right") - 1
        last_move = np.where(k >= 0, moved_at[np.clip(k, 0, None)], -np.inf)
        at["joined_s"] = np.maximum(at["joined_s"].to_numpy(float), last_move)
        events_s = np.unique(np.concatenate([at["joined_s"], at["finish_s"]]))
        for _, mine in at.groupby("replica"):
            j = np.sort(mine["joined_s"].to_numpy())
            f = np.sort(mine["finish_s"].to_numpy())
            ongoing = (np.searchsorted(j, events_s, side="right")
                       - np.searchsorted(f, events_s, side="right"))
            assert ongoing.max() <= limit, (what, ongoing.max(), limit)
    if scn["policy"]["kind"] == "greedy" and (retry or "autoscaling" not in scn):
        # a greedy replica starts what it holds the moment it is free: a request that joined
        # and did not start then found its replica running a batch (one that started by
        # its join and had not ended). (Without retry an autoscaled router may route to a
        # replica still starting, and a moved request keeps its first join time.)
        # (a request placed at the very instant it times out, by a task started by an
        # earlier request's timeout at that instant, expires before its batcher looks)
        at_deadline = (status == "timed_out") & (finish <= joined + EPS_S)
        waited = req[placed & ~(start <= joined + EPS_S) & ~at_deadline]
        running = req[ran & placed]
        for r, t in waited[["replica", "joined_s"]].itertuples(index=False):
            on_r = running[running["replica"] == r]
            busy = ((on_r["start_s"] <= t + EPS_S) & (on_r["finish_s"] > t + EPS_S)).any()
            assert busy, (what, "joined an idle greedy replica and did not start", r, t)
    fifo_pairs = 0
    if retry:
        # with retry every arrival waits at the router and a replica found goes to the
        # oldest waiting request: joins happen in arrival order. Only a request sent back
        # by a removed replica (at a retire/cancel time between the two joins) may join
        # after a younger one
        at = req[placed].sort_values(["arrival_s", "id"])
        j = at["joined_s"].to_numpy()
        later_max = np.maximum.accumulate(j)
        for k in np.flatnonzero(j < later_max - EPS_S):
            older = at.iloc[: k][at["joined_s"].iloc[: k] > j[k] + EPS_S]
            for oj in older["joined_s"]:
                assert ((moved_s >= j[k] - EPS_S) & (moved_s <= oj + EPS_S)).any(), (
                    what, "a held request joined before an older one", at.iloc[k].to_dict())
        fifo_pairs = len(j)
        # with retry a routing task places requests only on ready replicas
        if "autoscaling" in scn:
            ready = _ready_intervals(events)
            for r, t in at[["replica", "joined_s"]].itertuples(index=False):
                assert any(lo - EPS_S <= t <= hi + EPS_S for lo, hi in ready.get(int(r), [])), (
                    what, "joined a replica that was not ready", r, t)
    # kills: a killed replica's running requests fail at exactly its deadline (its retire
    # + graceful_shutdown_timeout_s), nothing else fails, nothing runs on past a kill
    n_killed = 0
    failed = req[status == "failed"]
    assert (failed["reason"].astype(str) == "shutdown").all(), what
    kills = events[events["event"] == "kill"]
    timeout_s = scn.get("autoscaling", {}).get("graceful_shutdown_timeout_s")
    assert kills.empty or timeout_s is not None, what
    matched = np.zeros(len(failed), dtype=bool)
    for t, r in kills[["time_s", "replica"]].itertuples(index=False):
        retires = events[(events["replica"] == r) & (events["event"] == "retire")
                         & (events["time_s"] <= t)]
        assert len(retires) and abs(retires["time_s"].max() + timeout_s - t) <= EPS_S, what
        on_r = req[(replica == r) & ran]
        alive = on_r[(on_r["start_s"] < t - EPS_S) & (on_r["finish_s"] > t + EPS_S)]
        assert alive.empty, (what, "ran on past its replica's kill", alive.to_dict("records"))
        here = ((failed["replica"] == r) & (failed["finish_s"] == t)).to_numpy()
        matched |= here
        n_killed += int(here.sum())
    assert matched.all(), (what, "failed but not at its replica's kill",
                           failed[~matched].to_dict("records"))
    return {"requests": len(req), "held_joins": fifo_pairs, "killed": n_killed,
            "kills": len(kills),
            "retired": int((events["event"] == "retire").sum()),
            "timed_out": int((status == "timed_out").sum()),
            "dropped": int((status == "dropped").sum()),
            "rejected": int((status == "rejected").sum())}


def test_fuzz_retry_kill_timeout_and_retire_newest(tmp_path: Path) -> None:
    totals: dict[str, int] = {}
    for seed in range(N_SCENARIOS):
        scn = _random_scenario(seed, tmp_path)
        what = json.dumps(scn)
        with _wall_guard(20.0, what):
            a = sim.run(scn, drain_timeout_s=600.0)
            b = sim.run(scn, drain_timeout_s=600.0)
        pd.testing.assert_frame_equal(a.requests, b.requests)
        if "autoscaling" in scn:
            pd.testing.assert_frame_equal(a.fleet_events, b.fleet_events)
        for key, n in _check_run(scn, a).items():
            totals[key] = totals.get(key, 0) + n
    # the fuzz reached what it is for (else its generator drifted)
    assert totals["held_joins"] > 0 and totals["killed"] > 0 and totals["retired"] > 0
    assert totals["timed_out"] > 0 and totals["dropped"] > 0 and totals["rejected"] > 0
    print(totals)


# -- hand-checked edge cases (deterministic service, traced arrivals: exact times) ----------
def _trace(tmp_path: Path, times_s: list[float]) -> dict[str, Any]:
    path = tmp_path / "t.csv"
    pd.DataFrame({"t": times_s}).to_csv(path, index=False)
    return {"kind": "trace", "path": str(path), "timestamp_column": "t"}


def _one_replica(tmp_path: Path, times_s: list[float], **over: Any) -> dict[str, Any]:
    scn: dict[str, Any] = {
        "name": "edge", "seed": 1,
        "service": {"kind": "constant", "ms": 100, "deterministic": True},
        "workload": _trace(tmp_path, times_s),
        "policy": {"kind": "greedy", "max_batch_size": 1}, "replicas": 1,
        "routing": "p2c", "warmup_s": 0, "queue": {"max_ongoing_requests": 1, "retry": {}}}
    scn.update(over)
    return scn


def _rows(res: Any) -> pd.DataFrame:
    return res.requests.sort_values("id").set_index("id")


def test_a_timeout_that_ends_a_routing_task_places_work_at_once(tmp_path: Path) -> None:
    # one replica holding one, 100 ms batches, timeouts 150 ms. r0 runs 0-100 ms; r1 (task
    # A) and r2 (task B) try at 1/2 ms twice, then sleep to 26/27, 76/77, 176/177 ms; r3
    # has no task (two per replica). r1 expires at 151 ms: A ends, task C starts then, takes
    # r3 and tries at once: the replica is free since 100 ms, so the room goes to the
    # oldest, r2 (B is cancelled), which starts at 151 ms and ends at 251 ms; r3 expires at
    # 153 ms. Before the fix the core was not called at 151 ms (only at the next arrival,
    # batch end or task due): r2 joined the idle replica at 151 ms but its batcher saw it
    # only at 176 ms, after it had expired (152 ms) in the replica's queue.
    res = sim.run(_one_replica(tmp_path, [0.0, 0.001, 0.002, 0.003],
                               queue={"max_ongoing_requests": 1, "timeout_ms": 150,
                                      "retry": {}}))
    req = _rows(res)
    assert req["status"].tolist() == ["ok", "timed_out", "ok", "timed_out"]
    np.testing.assert_allclose(req.loc[2, ["joined_s", "start_s", "finish_s"]].to_numpy(
        dtype=float), [0.151, 0.151, 0.251], atol=1e-12)
    np.testing.assert_allclose(req.loc[[1, 3], "finish_s"], [0.151, 0.153], atol=1e-12)


def test_retry_from_zero_replicas_starts_tasks_when_the_first_is_ready(tmp_path: Path) -> None:
    # min_replicas 0, cold start 0.5 s: no routing task runs before the replica is ready
    # (none per ready replica); at 0.5 s two start: A places r0 (its own, at once) and goes
    # on with r1; B takes r2. Both try twice at 0.5 s, then at 0.525, 0.575, 0.675 s (r0
    # runs 0.5-0.6 s): A places r1 at 0.675 s and ends; B sleeps 200 ms to 0.875 s (r1
    # runs to 0.775 s) and places r2. Tasks running with no replica (or started only at
    # the next arrival) would place r1/r2 at other times
    scn = _one_replica(tmp_path, [0.0, 0.001, 0.002],
                       autoscaling={"kind": "target", "min_replicas": 0, "max_replicas": 1,
                                    "initial_replicas": 0, "cold_start_s": 0.5,
                                    "target_ongoing_requests": 1, "upscale_delay_s": 0,
                                    "downscale_delay_s": 60, "control_period_s": 0.1})
    scn.pop("replicas")
    req = _rows(sim.run(scn))
    np.testing.assert_allclose(req["joined_s"], [0.5, 0.675, 0.875], atol=1e-12)
    np.testing.assert_allclose(req["start_s"], [0.5, 0.675, 0.875], atol=1e-12)


def test_a_retired_replica_s_queue_goes_first_while_tasks_sleep(tmp_path: Path) -> None:
    # two resident replicas holding two each (round robin, 100 ms batches of one); six
    # arrivals 1 ms apart: r0/r1 run on 0/1, r2/r3 queue on 0/1, r4 (task A) and r5 (task
    # B) find both full: A tries at 4 ms twice, 29, 79, 179 ms; B at 5 ms twice, 30, 80,
    # 180 ms. At 50 ms the schedule retires replica 1: r3 goes back to the router, older
    # than r4 and r5, and no task starts for it (two per ready replica: the cap is 2). At
    # 179 ms A finds room on replica 0 (r0 ended at 100 ms): it goes to r3 (the oldest),
    # not to A's own r4; A sleeps 200 ms and places r4 at 379 ms (r3 ran 200-300 ms); B
    # (full at 180 ms) places r5 at 380 ms. Nothing joins the retired replica after 50 ms
    scn = _one_replica(tmp_path, [0.0, 0.001, 0.002, 0.003, 0.004, 0.005],
                       routing="round_robin",
                       queue={"max_ongoing_requests": 2, "retry": {}},
                       autoscaling={"kind": "schedule", "steps": [[0, 2], [0.05, 1]],
                                    "control_period_s": 0.05, "cold_start_s": 0.1})
    scn.pop("replicas")
    res = sim.run(scn)
    req = _rows(res)
    assert (req["status"] == "ok").all()
    assert req["replica"].tolist() == [0, 1, 0, 0, 0, 0]
    np.testing.assert_allclose(req["joined_s"], [0, 0.001, 0.002, 0.179, 0.379, 0.380],
                               atol=1e-12)
    assert res.fleet_events.query("event == 'retire'")["time_s"].tolist() == [0.05]


@pytest.mark.parametrize(("retry", "joined_s"), [
    ({"max_tasks": 1}, [0.0, 0.176, 0.351]),
    ({"tasks_per_replica": 10_000, "max_tasks": 10_000}, [0.0, 0.176, 0.377])])
def test_tasks_per_replica_and_max_tasks_at_their_extremes(
        tmp_path: Path, retry: dict[str, int], joined_s: list[float]) -> None:
    # one replica holding one, 100 ms batches, arrivals 0, 1, 2 ms. With one task at most,
    # r2 gets no task of its own: the task that places r1 at 176 ms goes on with r2 afresh
    # (tries at 176 ms twice, 201, 251, 351 ms: r1 ended at 276 ms). With a task per held
    # request, r2's own task (2, 2, 27, 77, 177 ms, then 200 ms later) places it at 377 ms
    req = _rows(sim.run(_one_replica(tmp_path, [0.0, 0.001, 0.002],
                                     queue={"max_ongoing_requests": 1, "retry": retry})))
    np.testing.assert_allclose(req["joined_s"], joined_s, atol=1e-12)


def test_the_run_ends_at_its_last_event_not_at_a_stale_wake_up(tmp_path: Path) -> None:
    # the simpy driver keeps a replaced wake-up's timeout (and a cancelled launch's ready)
    # in its queue; those change nothing, so the run's end (meta end_s, drain_s, and the
    # window's end with a drain timeout) is the last event that did something: a batch's
    # end, a timeout, a fleet event. Before, 54 of 120 of these scenarios ended later,
    # at a stale wake-up (seed 0: 2.978 s against 2.938 s)
    for seed in range(20):
        (tmp_path / str(seed)).mkdir()
        scn = _random_scenario(seed, tmp_path / str(seed))
        res = sim.run(scn)
        req = res.requests
        last_s = float(req["finish_s"].max())
        timeout_ms = (scn.get("queue") or {}).get("timeout_ms")
        expired = req[req["status"].astype(str) == "timed_out"]
        if timeout_ms is not None and len(expired):
            last_s = max(last_s, float(expired["arrival_s"].max()) + timeout_ms / 1e3)
        events = res.fleet_events
        if events is not None and len(events):
            last_s = max(last_s, float(events["time_s"].max()))
        assert res.meta["end_s"] <= last_s + 1e-9, (seed, res.meta["end_s"], last_s)
