"""Kills that hit busy replicas (issue 28): ``autoscaling.graceful_shutdown_timeout_s``
force-kills a retiring replica that has not drained, failing its running requests with
reason ``shutdown``. The round-45 fuzz (``test_review_round45``) reached a busy replica in 4
of its 67 kills; here every scenario is built for it: service times of 0.15-0.8 s, a kill
0.5-40 ms after the retire, and load that falls right after a burst, so the autoscaler
retires replicas while their batches still run.

Each scenario is checked for exact facts (the simulator is deterministic), beyond the
round-45 checks (:func:`tests.sim.test_review_round45._check_run`: conservation, kills at
exactly retire + timeout, nothing running on past a kill, failures only at a kill):

- a request failed by ``shutdown`` had started on the killed replica before the kill;
- no batch on a killed replica that started before the kill ends after it, and the
  batch the kill cut is marked failed, with the kill as its end;
- the replica count series (what replica-seconds integrate) equals, at each of its times,
  the replica incarnations alive then (from launch or deploy to stop, kill or cancel), so a
  killed replica's seconds end at its kill; the replica-seconds agree to float rounding;
- the same seed gives identical request, batch, fleet-event and replica tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sim
from sim.serving.fleet import replica_seconds
from tests.sim.test_review_round45 import EPS_S, _check_run, _wall_guard

N_SCENARIOS = 60
STARTS = ("deploy", "launch")
ENDS = ("stop", "kill", "cancel")


def _burst_then_lull(rng: np.random.Generator, path: Path, capacity_rps: float) -> None:
    """A burst of 1-3x what the largest fleet serves in a second, then a few stragglers
    over the next 0.5-3 s: the load falls while the burst's batches still run.
    """
    burst = max(5, int(capacity_rps * rng.uniform(1.0, 3.0)))
    burst_s = float(rng.uniform(0.0, 0.4))
    tail = int(rng.integers(0, 20))
    tail_s = float(rng.uniform(0.5, 3.0))
    times = np.concatenate([rng.uniform(0.0, burst_s, burst),
                            burst_s + rng.uniform(0.0, tail_s, tail)])
    pd.DataFrame({"t": np.sort(np.round(times, 6))}).to_csv(path, index=False)


def _busy_kill_scenario(seed: int, tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(10_000 + seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    service_ms = float(rng.uniform(150, 800))
    service = pick([{"kind": "constant", "ms": service_ms, "deterministic": True},
                    {"kind": "exponential", "mean_ms": service_ms},
                    {"kind": "gamma", "mean_ms": service_ms, "cv": 0.5}])
    batch = int(rng.integers(1, 4))
    kind = pick(["greedy", "dynamic"])
    policy: dict[str, Any] = {"kind": kind, "max_batch_size": batch}
    if kind == "dynamic":
        policy.update(max_wait_ms=float(rng.uniform(1, 20)), timer=pick(["first", "arrival"]))
    lo, hi = int(rng.integers(0, 2)), int(rng.integers(3, 9))
    path = tmp_path / f"burst{seed}.csv"
    _burst_then_lull(rng, path, hi * batch / (service_ms / 1e3))
    queue: dict[str, Any] = {}
    if rng.random() < 0.8:
        queue["max_ongoing_requests"] = int(rng.integers(1, 6))
        if rng.random() < 0.5:
            queue["retry"] = {}
    if rng.random() < 0.3:
        queue["timeout_ms"] = float(rng.uniform(500, 3000))
    return {
        "name": f"busykill{seed}", "seed": seed, "service": service,
        "workload": {"kind": "trace", "path": str(path), "timestamp_column": "t"},
        "policy": policy, "queue": queue, "warmup_s": 0,
        "routing": pick(["p2c", "jsq", "random", "round_robin", "least_work"]),
        "autoscaling": {
            "kind": "target", "min_replicas": lo, "max_replicas": hi,
            "initial_replicas": int(rng.integers(max(lo, 1), hi + 1)),
            "cold_start_s": float(pick([0.0, rng.uniform(0.01, 0.2)])),
            "target_ongoing_requests": float(rng.integers(1, 4)),
            "upscale_delay_s": float(rng.uniform(0, 0.1)),
            "downscale_delay_s": float(rng.uniform(0, 0.15)),
            "look_back_period_s": float(rng.uniform(0.05, 0.3)),
            "control_period_s": float(rng.uniform(0.02, 0.08)),
            "retire": pick(["newest", "least_loaded"]),
            "graceful_shutdown_wait_loop_s": float(rng.uniform(0.005, 0.05)),
            "graceful_shutdown_timeout_s": float(rng.uniform(0.0005, 0.04))}}


def _lifetimes(events: pd.DataFrame) -> list[tuple[int, float, float, str]]:
    """Each replica incarnation: (slot, start, end, how it ended); one still up at the end
    of the run ends at inf (``open``).
    """
    out: list[tuple[int, float, float, str]] = []
    began: dict[int, float] = {}
    for t, r, ev in events[["time_s", "replica", "event"]].itertuples(index=False):
        if ev in STARTS:
            assert int(r) not in began, ("a slot started twice", r, t)
            began[int(r)] = float(t)
        elif ev in ENDS:
            out.append((int(r), began.pop(int(r)), float(t), str(ev)))
    out += [(r, t, np.inf, "open") for r, t in began.items()]
    return out


def _check_busy_kills(scn: dict[str, Any], res: Any) -> dict[str, int]:
    """The facts of the module docstring; returns the kills and the busy ones."""
    what = scn["name"]
    req = res.requests
    status, reason = req["status"].astype(str), req["reason"].astype(str)
    events, batches = res.fleet_events, res.batches
    end_s = float(res.meta["end_s"])
    kills = events[events["event"] == "kill"]
    busy = 0
    failed = req[status == "failed"]
    assert (reason[status == "failed"] == "shutdown").all(), what
    for t, r in kills[["time_s", "replica"]].itertuples(index=False):
        cut = failed[(failed["replica"] == r) & (failed["finish_s"] == t)]
        # failed by this kill: they had started on r before it (not queued there)
        assert cut["start_s"].notna().all() and (cut["start_s"] <= t).all(), (what, r, t)
        busy += int(not cut.empty)
        # no batch on r that began before the kill ends after it; the cut one ends at it
        on_r = batches[(batches["replica"] == r) & (batches["start_s"] <= t + EPS_S)]
        assert (on_r["finish_s"] <= t + EPS_S).all(), (what, "a batch outlived its kill")
        cut_batches = on_r[on_r["batch_id"].isin(cut["batch_id"])]
        assert len(cut_batches) == cut["batch_id"].nunique(), what
        assert (cut_batches["finish_s"] == t).all() and cut_batches["failed"].all(), what
    # a request counted ok never belonged to a failed batch
    ok_batches = req.loc[status == "ok", "batch_id"]
    assert not batches.loc[batches["batch_id"].isin(ok_batches), "failed"].any(), what
    # the replica series is the incarnations alive at each of its times; killed ones end
    # at their kill, so replica-seconds (its integral) end there too
    lives = _lifetimes(events)
    ended_by_kill = {(r, e) for r, _, e, how in lives if how == "kill"}
    assert ended_by_kill == set(zip(kills["replica"], kills["time_s"], strict=True)), what
    series = res.replicas.groupby("time_s", sort=True).last().reset_index()
    for t, n in series[["time_s", "replicas"]].itertuples(index=False):
        alive = sum(1 for _, a, b, _ in lives if a <= t < b)
        assert n == alive, (what, "replica series", t, n, alive)
    held_s = sum(min(b, end_s) - a for _, a, b, _ in lives)
    assert abs(replica_seconds(res.replicas, 0.0, end_s) - held_s) <= 1e-9 * max(held_s, 1), what
    return {"kills": len(kills), "busy_kills": busy, "killed_requests": len(failed)}


def test_fuzz_kills_that_hit_busy_replicas(tmp_path: Path) -> None:
    totals = {"kills": 0, "busy_kills": 0, "killed_requests": 0, "scenarios_with_busy": 0}
    for seed in range(N_SCENARIOS):
        scn = _busy_kill_scenario(seed, tmp_path)
        what = json.dumps(scn)
        with _wall_guard(20.0, what):
            a = sim.run(scn, drain_timeout_s=600.0)
            b = sim.run(scn, drain_timeout_s=600.0)
        for name in ("requests", "batches", "fleet_events", "replicas"):
            pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), obj=name)
        _check_run(scn, a)
        got = _check_busy_kills(scn, a)
        for key, n in got.items():
            totals[key] += n
        totals["scenarios_with_busy"] += int(got["busy_kills"] > 0)
    print(totals)
    # the fuzz reached what it is for (else its generator drifted): most kills hit a busy
    # replica, in most scenarios
    assert totals["busy_kills"] * 2 > totals["kills"], totals
    assert totals["scenarios_with_busy"] * 2 > N_SCENARIOS, totals
