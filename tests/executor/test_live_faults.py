"""The live executor's fault paths, Ctrl-C through the real signal, and the live cases that the
parity test does not cover (several replicas, closed loop, queue bounds and timeouts).

Every live run here is guarded by a thread join with a timeout: a hang fails the test instead
of the suite.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import sim
from executor.live_requests import live
from executor.request_driver import _POLL_S
from executor.testing import SleepRunner
from sim.scenario.build import Streams
from sim.scenario.workloads import ThinkSampler

ROOT = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "seed": 3,
    "service": {"kind": "linear", "base_ms": 3, "per_item_ms": 1, "deterministic": True},
    "workload": {"kind": "constant", "rate_rps": 100, "n_requests": 30},
    "policy": {"kind": "greedy", "max_batch_size": 4},
    "model": {"name": "sleep"},
}


def linear_s(n: int) -> float:
    return 0.003 + 0.001 * n


def run_guarded(cfg: dict[str, Any], runners: list[Any], timeout_s: float = 30.0,
                **kwargs: Any) -> sim.Result:
    """``live(...)`` on a thread; fail (instead of hanging the suite) if it does not return."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = live(cfg, runners=runners, **kwargs)
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the live run hung for more than {timeout_s} s"
    if "error" in box:
        raise box["error"]
    result: sim.Result = box["result"]
    return result


def _max_s(health: dict[str, Any], name: str) -> float:
    """The largest ``<name>_ms`` this run measured, in seconds (0 when none was)."""
    return float(np.nan_to_num(health[name + "_ms"]["max"])) / 1e3


class PayloadFailure(SleepRunner):
    """``payloads()`` raises for the given call numbers."""

    def __init__(self, fail_on_call: set[int]) -> None:
        super().__init__(linear_s)
        self.fail_on_call = fail_on_call
        self.payload_calls = 0

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        index = self.payload_calls
        self.payload_calls += 1
        if index in self.fail_on_call:
            raise ValueError("tokenizer exploded")
        return [None] * n


class PrepareFailure(SleepRunner):
    raised_perf = float("nan")  # when prepare_thread raised (perf_counter)

    def prepare_thread(self) -> None:
        self.raised_perf = time.perf_counter()
        raise RuntimeError("CUDA out of memory")


class DescribeFailure(SleepRunner):
    def describe(self) -> dict[str, Any]:
        raise KeyError("device")


def test_a_payloads_failure_fails_that_batch_only() -> None:
    result = run_guarded(BASE, [PayloadFailure({1})])
    req = result.requests
    failed = req[req["status"] == "failed"]
    assert failed["batch_id"].nunique() == 1
    assert set(failed["reason"]) == {"payloads: ValueError: tokenizer exploded"}
    assert (req["status"].isin(["ok", "failed"])).all()
    assert result.summary["ok"] == len(req) - len(failed) > 0
    assert result.meta["fatal_error"] is None


def test_a_worker_that_cannot_start_stops_the_run_with_its_reason() -> None:
    cfg = {**BASE, "workload": {"kind": "constant", "rate_rps": 100, "duration_s": 20}}
    t0 = time.perf_counter()
    runner, drivers = PrepareFailure(linear_s), []
    result = run_guarded(cfg, [runner], on_driver=drivers.append)
    assert time.perf_counter() - t0 < 5  # not the 20 s schedule, and no hang
    assert result.meta["fatal_error"].startswith(
        "replica 0: replica could not start (prepare_thread/stream): RuntimeError: CUDA out")
    assert result.meta["stopped_early"] is True
    counts = result.meta["status_counts"]
    assert sum(counts.values()) == len(result.requests)
    assert counts.get("ok", 0) == 0
    # the run stopped at the worker's failure: never before prepare_thread raised, and at
    # the start of the loop's next iteration after the report woke it, so at most one step
    # of the core and one wait of the loop later (its planned length, at most the 50 ms
    # poll, plus the worst lateness this run measured for a wait and for a core step).
    # Every arrival due by the stop (100 req/s from t = 0) was admitted, none after, up to
    # one on the boundary (float rounding). A run that went on after the failure (the old
    # bound here allowed a second of it) stops later than that
    stop_s = result.meta["stopped_s"]
    raised_s = runner.raised_perf - drivers[0].start_perf
    health = result.summary["executor_health"]
    late_s = _max_s(health, "loop_lateness") + _max_s(health, "dispatch_overhead")
    assert 0 <= stop_s - raised_s <= _POLL_S + late_s, (stop_s, raised_s, late_s)
    assert abs(len(result.requests) - (math.floor(stop_s * 100) + 1)) <= 1


def test_the_cli_exits_1_after_writing_what_a_fatal_run_recorded(tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "run"
    code = textwrap.dedent(f"""
        import sys, executor.live_requests, servelab.cli
        from executor.testing import SleepRunner
        class Broken(SleepRunner):
            def prepare_thread(self): raise RuntimeError("no device")
        executor.live_requests.default_runners = lambda scn: [Broken(lambda n: 0.001)]
        sys.argv = ["servelab", "live", {str(scenario)!r}, "--out", {str(out)!r}, "--force"]
        servelab.cli.main()
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the live run stopped: replica 0" in proc.stderr and "Traceback" not in proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert "no device" in meta["fatal_error"]
    assert (out / "requests.parquet").exists()


def test_describe_raising_after_the_run_keeps_the_results() -> None:
    result = run_guarded(BASE, [DescribeFailure(linear_s)])
    assert result.summary["ok"] == 30
    assert result.meta["describe_error"] == "describe() failed: KeyError: 'device'"


SIGINT_SCRIPT = """
import json, sys
from executor.live_requests import live
from executor.testing import SleepRunner
cfg = {"seed": 4, "service": {"kind": "constant", "ms": 8, "deterministic": True},
       "workload": {"kind": "constant", "rate_rps": 400, "duration_s": 20},
       "policy": {"kind": "greedy", "max_batch_size": 2}, "queue": {"timeout_ms": 150},
       "warmup_s": 0.1, "model": {"name": "sleep"}}
print("ready", flush=True)
drivers = []
r = live(cfg, runners=[SleepRunner(lambda n: 0.008)], handle_sigint=True,
         stop_mode=sys.argv[1], drain_timeout_s=5.0, on_driver=drivers.append)
req, health = r.requests, r.summary["executor_health"]
took = r.batches["finish_s"] - r.batches["start_s"]
print(json.dumps({"meta": {k: r.meta[k] for k in ("stopped_early", "stopped_s", "end_s")},
                  "start_perf": drivers[0].start_perf,
                  "late_ms": {k: health[k + "_lateness_ms"]["max"]
                              for k in ("loop", "notice", "wake", "arrival")},
                  "dispatch_overhead_ms": health["dispatch_overhead_ms"]["max"],
                  "batch_max_s": float(took.max()),
                  "window_s": r.summary["window_s"], "requests": len(req),
                  "last_arrival_s": float(req["arrival_s"].max()),
                  "status": req["status"].value_counts().to_dict(),
                  "timed_out_after_stop": int(((req["status"] == "timed_out")
                                               & (req["finish_s"] > r.meta["stopped_s"])).sum()),
                  "completions": r.summary["completions"],
                  "throughput_rps": r.summary["throughput_rps"]}), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("mode", ["drain", "abandon"])
def test_ctrl_c_through_the_real_signal_stops_at_the_stop_time(mode: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_SCRIPT, mode], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # imports are done; the run has started within milliseconds of "ready"
    sent_perf = time.perf_counter()  # CLOCK_MONOTONIC: the child's perf_counter clock too
    os.kill(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    data = json.loads(stdout.strip().splitlines()[-1])
    stop_s = data["meta"]["stopped_s"]
    late_ms = data["late_ms"]
    loop_late_s = late_ms["loop"] / 1e3
    # the stop is the signal's time: never before it was sent; noted at the top of the
    # loop's next iteration, at most one wait later (its planned length, at most the 50 ms
    # poll, plus the worst lateness this run measured for a wait) and one step of the core
    # (the longest this run measured). Stamping the stop elsewhere (the end of the drain, a
    # later check of the flag) moves it by at least one 8 ms batch or the 150 ms drain
    sent_s = sent_perf - data["start_perf"]
    assert data["meta"]["stopped_early"] is True and sent_s > 0.1  # after the warm-up
    bound_s = _POLL_S + loop_late_s + data["dispatch_overhead_ms"] / 1e3
    assert 0 <= stop_s - sent_s <= bound_s, (stop_s, sent_s, bound_s)
    # arrivals due by the stop were admitted (400 req/s, one every 2.5 ms from t = 0), none
    # after it: the stop takes in every arrival due by its time before closing the schedule
    # (``admit_until``), so the count is the schedule's, up to an arrival on the boundary
    # (float rounding); one dropped late arrival, or one admitted after the stop, shows
    assert data["last_arrival_s"] <= stop_s
    assert abs(data["requests"] - (math.floor(stop_s * 400) + 1)) <= 1
    # the window ends at the stop: throughput counts completions up to then
    assert data["window_s"] == pytest.approx(stop_s - 0.1, abs=1e-9)
    assert data["throughput_rps"] == pytest.approx(data["completions"] / data["window_s"])
    # capacity 250 req/s (pairs in 8 ms) against 400 offered: a queue at the stop
    if mode == "drain":
        assert data["status"].get("in_flight", 0) == 0
        assert data["timed_out_after_stop"] > 0  # queued requests kept expiring
        # the 150 ms timeout bounds the drain: every queued request arrived by the stop, so
        # the queue is empty 150 ms after it, seen at most one wait late (the 50 ms poll or
        # the longest batch, whichever the loop waited on) plus the worst lateness this run
        # measured for a wait, a batch end or a timer. Draining the whole queue instead
        # (about 150 requests at 250 req/s) takes about 0.6 s
        late_s = max(late_ms["loop"], late_ms["notice"], late_ms["wake"]) / 1e3
        bound_s = 0.150 + max(_POLL_S, data["batch_max_s"]) + late_s
        assert data["meta"]["end_s"] - stop_s <= bound_s, (data["meta"], bound_s)
    else:
        assert data["status"].get("in_flight", 0) > 0
        # abandon ends the loop in the iteration that notes the stop, with no wait in
        # between (only the core's step): allowed one wait of the loop (the 50 ms poll) plus
        # its worst lateness. Draining instead takes the ~150 ms until the last queued
        # request expires
        bound_s = _POLL_S + loop_late_s
        assert data["meta"]["end_s"] - stop_s <= bound_s, (data["meta"], bound_s)


CHECK_SCRIPT = """
import sys, executor.live_requests, executor.compare, servelab.cli
import sim.serving.core, sim.serving.invariants
from sim.serving.policies.simple import NoBatching
from sim.serving.types import Decision
from executor.testing import SleepRunner
runners = lambda scn: [SleepRunner(lambda n: 0.001) for _ in range(scn.replicas)]
executor.live_requests.default_runners = executor.compare.default_runners = runners
if sys.argv[1] == "policy":
    NoBatching.decide = lambda self, now, queue, replica: Decision(dispatch=(10**9,))
else:
    def broken(*args, **kwargs):
        raise sim.serving.invariants.InvariantError("status counts do not add up (injected)")
    sim.serving.core.check_invariants = broken
sys.argv = ["servelab", *sys.argv[2:]]
servelab.cli.main()
"""


@pytest.mark.parametrize("error", ["policy", "invariant"])
@pytest.mark.parametrize("command", ["simulate", "live", "compare"])
def test_policy_and_invariant_errors_exit_3_in_one_line_from_every_driver(
        command: str, error: str, tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**BASE, "policy": {"kind": "none"}}))
    args = {"simulate": ["simulate", str(scenario)],
            "live": ["live", str(scenario), "--force"],
            "compare": ["compare", str(scenario), "--out", str(tmp_path / "cmp"),
                        "--repeats", "1", "--probe", "off"]}[command]
    # plain Python even with a compiled build present: the check is injected by patching a
    # module global, which compiled code does not look up
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, error, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SERVELAB_PURE_PYTHON": "1"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: internal check failed"), proc.stderr
    assert ("not waiting" if error == "policy" else "injected") in lines[0]


def test_several_replicas_live_dispatch_like_the_simulator() -> None:
    cfg = {**BASE, "replicas": 2, "routing": "round_robin",
           "workload": {"kind": "constant", "rate_rps": 400, "n_requests": 60}}
    simulated = sim.run(cfg)
    measured = run_guarded(cfg, [SleepRunner(linear_s), SleepRunner(linear_s)])
    assert measured.summary["ok"] == 60
    req = measured.requests.sort_values("id")
    # routing is the simulator's: the same requests on each replica
    assert (req["replica"].to_numpy()
            == simulated.requests.sort_values("id")["replica"].to_numpy()).all()
    # Which requests batch together depends on how long each batch really took (a busy
    # machine oversleeps), so the batches are checked against the simulator's greedy rule
    # at the times this run measured: a replica starts a batch as soon as it is free and a
    # request waits (never before), with the first (up to) 4 requests of its queue that had
    # arrived by then; it is late only by how late the loop took in the batch end or the
    # arrival that made it due, which the executor measured (a batch with other members, or
    # started later than the executor accounts for, fails here).
    health = measured.summary["executor_health"]
    late_s = float(np.nanmax([health["notice_lateness_ms"]["max"],
                              health["arrival_lateness_ms"]["max"]])) / 1e3
    for replica, batches in measured.batches.groupby("replica"):
        mine = req[req["replica"] == replica].sort_values("arrival_s")
        pending = list(zip(mine["arrival_s"], mine["id"], strict=True))
        free_s = -np.inf
        for _, batch in batches.sort_values("start_s").iterrows():
            start_s = float(batch["start_s"])
            due_s = max(free_s, pending[0][0])
            assert due_s - 1e-9 <= start_s <= due_s + late_s + 1e-9, (replica, batch)
            arrived = [i for a, i in pending if a <= start_s][:4]
            ids = sorted(req.loc[req["batch_id"] == batch["batch_id"], "id"])
            assert ids == sorted(arrived), (replica, batch["batch_id"])
            pending = pending[len(arrived):]
            free_s = float(batch["finish_s"])
        assert not pending


def test_a_closed_loop_runs_live_with_each_client_waiting_for_its_answer() -> None:
    cfg = {**BASE, "workload": {"kind": "closed", "clients": 4, "think_ms": 5,
                                "duration_s": 1.0}}
    result = run_guarded(cfg, [SleepRunner(linear_s)])
    req = result.requests.sort_values("arrival_s")
    assert result.summary["ok"] == len(req) > 0
    # how many requests a client sends depends on how long each answer took (a busy machine
    # answers later); which ones it sends does not: the seeded think times, drawn in the
    # order the clients were armed (each once at the start, then at each answer, in the
    # order the answers ended), put each send one think time after the previous answer, and
    # every client kept sending until its next send fell past the 1 s duration. A client
    # that stopped early (or sent again without waiting) breaks this at its first request
    think = ThinkSampler(0.005, 1.0, Streams.from_seed(cfg["seed"]).think)
    answered = req.sort_values(["finish_s", "id"])
    armed = [(c, 0.0) for c in range(4)] + list(zip(answered["client"].astype(int),
                                                     answered["finish_s"], strict=True))
    sends: dict[int, list[float]] = {c: [] for c in range(4)}
    for client, after_s in armed:
        at_s = after_s + think()
        if at_s < cfg["workload"]["duration_s"]:
            sends[client].append(at_s)
    for client, mine in req.groupby("client"):
        np.testing.assert_allclose(np.sort(mine["arrival_s"].to_numpy()), sends[int(client)],
                                   rtol=0, atol=1e-9)
    assert sum(len(v) for v in sends.values()) == len(req)
    # a client sends again only after its previous request finished (plus thinking)
    for _, mine in req.groupby("client"):
        mine = mine.sort_values("arrival_s")
        assert (mine["arrival_s"].to_numpy()[1:]
                >= mine["finish_s"].to_numpy()[:-1] - 1e-9).all()
    assert result.summary["stability"]["verdict"] != "unstable"
    # never more than 4 requests in the system
    assert result.requests["batch_id"].groupby(result.requests["batch_id"]).size().max() <= 4


def test_queue_bounds_and_timeouts_shed_load_live_as_in_the_simulator() -> None:
    cfg = {**BASE, "service": {"kind": "constant", "ms": 10, "deterministic": True},
           "policy": {"kind": "none"}, "queue": {"max_len": 5, "timeout_ms": 40},
           "workload": {"kind": "constant", "rate_rps": 300, "n_requests": 150}}
    simulated = sim.run(cfg)
    measured = run_guarded(cfg, [SleepRunner(lambda n: 0.010)])
    for name in ("rejected", "timed_out", "ok"):
        assert measured.summary[name] > 0 and simulated.summary[name] > 0
    reasons = set(measured.requests.loc[measured.requests["status"] != "ok", "reason"])
    assert reasons == {"queue_full", "queue_timeout"}
    assert measured.summary["stability"]["verdict"] == "saturated"
    # how many of each outcome depends on how long each 10 ms sleep really took (on a busy
    # machine, several ms more); the rules that decide each outcome do not, and they are the
    # simulator's: a rejected request found the queue full, a timed-out one left the queue
    # exactly at its 40 ms bound, and none that ran had waited longer
    req, queue = measured.requests, measured.queue.sort_values("time_s", kind="stable")
    for arrival in req.loc[req["status"] == "rejected", "arrival_s"]:
        before = queue.loc[queue["time_s"] <= arrival, "length"]
        assert int(before.iloc[-1]) == 5
    expired = req[req["status"] == "timed_out"]
    np.testing.assert_allclose(expired["finish_s"] - expired["arrival_s"], 0.040, atol=1e-9)
    ran = req[req["status"] == "ok"]
    assert ((ran["start_s"] - ran["arrival_s"]) <= 0.040 + 1e-9).all()
    assert (queue["length"] <= 5).all()
