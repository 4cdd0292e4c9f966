"""One test per defect a line-by-line review found (each failed before its fix)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import sim
from sim.serving.core import Finished, ScheduleSource, ServingCore
from sim.serving.policies import DynamicBatching, NoBatching
from sim.serving.records import RequestTable
from sim.serving.routing import LeastWork


def trace(tmp_path: Path, rows: list[tuple[float, int]]) -> str:
    path = tmp_path / "t.csv"
    path.write_text("ts,n\n" + "".join(f"{t},{n}\n" for t, n in rows))
    return str(path)


def test_the_core_is_one_event_loop_with_the_whole_log() -> None:
    # two requests, dynamic batching (max 2, 10 ms): the driver only reports time and finishes
    table = RequestTable(np.array([0.0, 0.004]), np.array([1, 1]), np.zeros(2, np.int8))
    core = ServingCore(table, ScheduleSource(table),
                       [DynamicBatching(max_batch_size=2, max_wait_ms=10)])
    log = []
    # the first arrival: the policy would wait until 10 ms, but the next arrival is due
    actions = core.step(0.0)
    log.append(("t=0", [b.request_ids for b in actions.start], actions.wake_s))
    assert core.wake_at_s == [pytest.approx(0.01)]
    actions = core.step(actions.wake_s)  # the second: the batch is full
    log.append(("t=4ms", [b.request_ids for b in actions.start], actions.wake_s))
    batch = actions.start[0]
    actions = core.step(0.009, [Finished(batch, 0.009, 0.005)])
    log.append(("t=9ms done", [b.request_ids for b in actions.start], actions.wake_s))
    assert log == [("t=0", [], 0.004), ("t=4ms", [(0, 1)], math.inf),
                   ("t=9ms done", [], math.inf)]
    assert core.check_invariants()["ok"] == 2


def test_routers_see_the_loads_of_the_arrivals_own_time(tmp_path) -> None:
    # r0 (10 s of work) on replica 0, r1 (1 s) on replica 1; r2 and r3 arrive while both are
    # busy. At r2's time both replicas hold 1: JSQ picks 0; then r3 sees 2 vs 1 and picks 1.
    # Routed only after r1 finished (the old lazy admission), r2 went to replica 1.
    result = sim.run({
        "seed": 1, "service": {"kind": "linear", "base_ms": 0, "per_item_ms": 1000,
                               "deterministic": True},
        "workload": {"kind": "trace", "path": trace(tmp_path, [(0, 10), (0.1, 1), (0.5, 1),
                                                               (0.6, 1)]),
                     "timestamp_column": "ts", "size_column": "n"},
        "policy": {"kind": "none"}, "replicas": 2, "routing": "jsq"})
    assert result.requests.sort_values("id")["replica"].tolist() == [0, 1, 0, 1]


def test_timer_first_restarts_once_its_request_has_gone() -> None:
    # shared queue, two replicas: both start a clock for r0; replica 0 sends it. Replica 1's
    # clock must not survive: r1, arriving at 1 s, waits its full 10 ms.
    result = sim.run({
        "seed": 1, "service": {"kind": "constant", "ms": 1},
        "workload": {"kind": "constant", "rate_rps": 1.0, "n_requests": 2},
        "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 10,
                   "timer": "first"}, "replicas": 2})
    req = result.requests.sort_values("id")
    assert (req["start_s"] - req["arrival_s"]).tolist() == pytest.approx([0.01, 0.01])


def test_least_work_counts_batches_in_requests_not_items() -> None:
    # 4 queued requests of 3 items each, max batch 4 requests: one batch of 12 items
    table = RequestTable(np.zeros(4), np.full(4, 3), np.zeros(4, np.int8))
    core = ServingCore(table, ScheduleSource(table), [NoBatching(), NoBatching()],
                       router=LeastWork(), estimate_s=lambda items: 0.010 + 0.001 * items)
    for p in core.dispatcher.policies:
        p.max_batch_size = 4
    core.dispatcher._max_batch = 4
    queue = core.queues[0]
    for rid in range(4):
        queue.push(rid)
    work = core.loads(0.0)[0].outstanding_work_s
    assert work == pytest.approx(0.010 + 0.012)  # not 3 batches of 4 items (0.042)


def test_edf_differs_from_fifo_with_request_classes() -> None:
    base = {"seed": 4, "service": {"kind": "exponential", "mean_ms": 10},
            "workload": {"kind": "poisson", "rate_rps": 92, "duration_s": 120},
            "policy": {"kind": "none"}, "warmup_s": 5,
            "classes": [{"name": "interactive", "share": 0.3, "slo_ms": 40},
                        {"name": "batch", "share": 0.7, "slo_ms": 2000}]}
    fifo = sim.run(base).summary["classes"]
    edf = sim.run({**base, "queue": {"discipline": "edf"}}).summary["classes"]
    assert set(fifo) == {"interactive", "batch"}
    # EDF serves the tight class first: its tail and goodput improve, the loose class pays
    assert edf["interactive"]["latency_ms"]["p99"] < 0.5 * fifo["interactive"]["latency_ms"][
        "p99"]
    assert edf["interactive"]["goodput_rps"] > fifo["interactive"]["goodput_rps"]
    assert edf["batch"]["latency_ms"]["p99"] > fifo["batch"]["latency_ms"]["p99"]


def test_priority_classes_make_starvation_visible() -> None:
    s = sim.run({"seed": 2, "service": {"kind": "exponential", "mean_ms": 10},
                 "workload": {"kind": "poisson", "rate_rps": 98, "duration_s": 60},
                 "policy": {"kind": "none"}, "queue": {"discipline": "priority"},
                 "warmup_s": 5, "slo_ms": 200,
                 "classes": [{"name": "gold", "share": 0.5, "priority": 0},
                             {"name": "bronze", "share": 0.5, "priority": 1}]}).summary
    gold, bronze = s["classes"]["gold"], s["classes"]["bronze"]
    assert bronze["latency_ms"]["p99"] > 5 * gold["latency_ms"]["p99"]
    assert gold["goodput_rps"] > bronze["goodput_rps"]


def test_bad_classes_are_refused() -> None:
    with pytest.raises(sim.ScenarioError, match="shares must sum to 1"):
        sim.load_scenario({"workload": {"kind": "poisson", "rate_rps": 1, "duration_s": 1},
                           "policy": {"kind": "none"},
                           "classes": [{"name": "a", "share": 0.5}]})


def test_warmup_past_the_last_arrival_is_refused_for_n_requests() -> None:
    with pytest.raises(sim.ScenarioError, match="warmup_s: 10 s is past the last arrival"):
        sim.run({"service": {"kind": "constant", "ms": 1},
                 "workload": {"kind": "constant", "rate_rps": 10, "n_requests": 5},
                 "policy": {"kind": "none"}, "warmup_s": 10})


def test_capacity_reports_failed_runs_instead_of_a_missed_slo() -> None:
    from sim.experiments import ExperimentError
    from sim.experiments.capacity import capacity

    # batches beyond the profile's measured sizes fail, but only once the load forms them
    scn = {"seed": 1, "service": {"kind": "profile", "path": "builtin:mlp-cpu"},
           "workload": {"kind": "poisson", "rate_rps": 200, "duration_s": 5},
           "policy": {"kind": "greedy", "max_batch_size": 500}}
    with pytest.raises(ExperimentError, match=r"failed .not an SLO miss.*outside the measured"):
        capacity(scn, {"p99_ms": 1e6}, seeds=1, workers=1)


def test_goodput_slo_without_slo_ms_is_refused() -> None:
    from sim.experiments import ExperimentError
    from sim.experiments.capacity import capacity

    with pytest.raises(ExperimentError, match="needs slo_ms"):
        capacity({"service": {"kind": "constant", "ms": 1},
                  "workload": {"kind": "poisson", "rate_rps": 10, "duration_s": 2},
                  "policy": {"kind": "none"}}, {"goodput_frac": 0.9}, seeds=1, workers=1)


def test_an_internal_bug_is_not_dressed_up_as_a_user_error(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"service": {"kind": "constant", "ms": 1},
                                    "workload": {"kind": "poisson", "rate_rps": 10,
                                                 "n_requests": 5},
                                    "policy": {"kind": "none"}}))
    code = ("import sim.drivers.simulate, servelab.cli, sys\n"
            "def boom(*a, **k): raise ValueError('a bug, not a user error')\n"
            "sim.drivers.simulate.summarize = boom\n"
            f"sys.argv = ['servelab', 'simulate', {str(path)!r}]\n"
            "servelab.cli.main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "internal error" in proc.stderr and "Traceback" not in proc.stderr


def test_profile_errors_name_the_field(tmp_path) -> None:
    prof = tmp_path / "p.json"
    prof.write_text('{"schema_version": 1, "batch_sizes": [1.5], "samples_s": {"1.5": [0.1]}}')
    with pytest.raises(sim.ScenarioError.__mro__[1], match=r"^service\.path: "):
        sim.run({"service": {"kind": "profile", "path": str(prof)},
                 "workload": {"kind": "poisson", "rate_rps": 10, "n_requests": 5},
                 "policy": {"kind": "none"}})
