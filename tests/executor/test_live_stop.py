"""The live stop path: SIGTERM like Ctrl-C, a hung model call, batch timeouts and the flags
that bound a live run.

A hung call is a model whose ``run_batch`` blocks on an event: in-process the test releases it
at the end; in a subprocess it never returns, and the process must end anyway.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from executor.lifecycle import HUNG_GRACE_S, JOIN_SLICE_S, join_within
from executor.live_requests import live
from executor.request_driver import _POLL_S
from executor.testing import SleepRunner
from sim.errors import UserError

ROOT = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "seed": 3,
    "service": {"kind": "constant", "ms": 4, "deterministic": True},
    "workload": {"kind": "constant", "rate_rps": 100, "n_requests": 20},
    "policy": {"kind": "greedy", "max_batch_size": 4},
    "model": {"name": "sleep"},
}


class HangRunner(SleepRunner):
    """Batch ``hang_on`` (0-based) blocks until ``release`` is set; the others take 4 ms."""

    def __init__(self, hang_on: int, release: threading.Event) -> None:
        super().__init__(lambda n: 0.004)
        self.hang_on, self.release = hang_on, release

    def run_batch(self, payloads: Any) -> Any:
        if self.calls == self.hang_on:
            self.calls += 1
            self.release.wait()
            return len(payloads)
        return super().run_batch(payloads)


def test_a_hung_model_holds_the_run_only_for_the_bounded_grace_after_the_deadline() -> None:
    release = threading.Event()
    drivers: list[Any] = []
    t0 = time.perf_counter()
    try:
        result = live(BASE, runners=[HangRunner(2, release)], drain_timeout_s=0.3,
                      on_driver=drivers.append)
        wall_s = time.perf_counter() - t0
    finally:
        release.set()
    driver = drivers[0]
    # the schedule's last arrival is at 0.19 s: the deadline is 0.49 s, seen at most one
    # wait late (a 50 ms poll or the longest batch, plus the worst lateness this run
    # measured); the hung call then gets HUNG_GRACE_S to return, no more
    took = result.batches["finish_s"] - result.batches["start_s"]
    lateness_s = result.summary["executor_health"]["loop_lateness_ms"]["max"] / 1e3
    late_s = max(0.05, float(took.max())) + lateness_s
    assert 0.49 - 1e-9 <= result.meta["end_s"] <= 0.49 + late_s
    # the end joins the hung worker in slices of at most JOIN_SLICE_S until HUNG_GRACE_S is
    # up, the last slice cut to what is left: it returns late only by a wake-up's lateness,
    # allowed here one slice plus the worst lateness this run measured for a wait (the
    # join comes after the run's waits). Waiting the drain (0.3 s) again, or a grace per
    # batch, shows
    assert HUNG_GRACE_S <= driver.join_wait_s <= HUNG_GRACE_S + JOIN_SLICE_S + lateness_s
    assert wall_s < result.meta["end_s"] + driver.join_wait_s + 5.0  # not 60 s
    hung = result.meta["unfinished_batches"]
    assert len(hung) == 1 and result.meta["drain_timed_out"] is True
    req = result.requests
    in_flight = req[req["status"] == "in_flight"]
    # censored: the hung batch's requests and those queued behind it (no batch yet)
    assert set(in_flight["batch_id"]) == {hung[0], -1}
    assert (req.loc[req["batch_id"] == hung[0], "status"] == "in_flight").all()
    assert set(req["status"]) == {"ok", "in_flight"}
    batch = result.batches.set_index("batch_id").loc[hung[0]]
    assert math.isnan(batch["finish_s"]) and not batch["failed"]  # still inside the model
    assert sum(result.meta["status_counts"].values()) == len(req)


def test_a_batch_timeout_marks_its_batch_failed_even_when_the_call_never_returns() -> None:
    release = threading.Event()
    try:
        result = live(BASE, runners=[HangRunner(2, release)], drain_timeout_s=0.3,
                      batch_timeout_s=0.1, on_driver=lambda d: setattr(d, "hung_grace_s", 0.2))
    finally:
        release.set()
    req = result.requests
    failed = req[req["reason"] == "batch_timeout"]
    assert len(failed) >= 1 and (failed["status"] == "failed").all()
    (bid,) = set(failed["batch_id"])
    assert result.meta["unfinished_batches"] == [bid]
    batch = result.batches.set_index("batch_id").loc[bid]
    # the row agrees with its requests: failed; finish_s NaN because the call never returned
    assert bool(batch["failed"]) and math.isnan(batch["finish_s"])
    assert (failed["finish_s"] - failed["start_s"]).to_numpy() == pytest.approx(0.1, abs=1e-9)
    assert set(req.loc[req["batch_id"] != bid, "status"]) == {"ok", "in_flight"}


def test_a_timed_out_batch_that_returns_later_is_failed_with_its_return_time() -> None:
    cfg = {**BASE, "workload": {"kind": "constant", "rate_rps": 50, "n_requests": 10}}
    result = live(cfg, runners=[SleepRunner(lambda n: 0.004, stall_on={1: 0.25})],
                  batch_timeout_s=0.05)
    slow = result.requests[result.requests["reason"] == "batch_timeout"]
    batch = result.batches.set_index("batch_id").loc[int(slow["batch_id"].iloc[0])]
    assert bool(batch["failed"]) and batch["finish_s"] - batch["start_s"] >= 0.25
    assert result.meta["unfinished_batches"] == []


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"batch_timeout_s": 0.0}, "batch_timeout_s 0: must be a finite number > 0"),
    ({"batch_timeout_s": -0.005}, "batch_timeout_s -0.005: must be"),
    ({"batch_timeout_s": math.nan}, "batch_timeout_s nan: must be"),
    ({"batch_timeout_s": math.inf}, "batch_timeout_s inf: must be"),
    ({"drain_timeout_s": math.nan}, "--drain-timeout-s nan: must be a number of seconds > 0"),
    ({"drain_timeout_s": -1.0}, "--drain-timeout-s -1: must be"),
    ({"max_wall_s": math.nan}, "--max-wall-s nan: must be"),
])
def test_live_refuses_bad_timeouts_naming_the_argument(kwargs: dict[str, float],
                                                       field: str) -> None:
    with pytest.raises(UserError, match=field.replace("(", r"\(")):
        live(BASE, runners=[SleepRunner(lambda n: 0.004)], **kwargs)


@pytest.mark.parametrize(("flags", "message"), [
    (["--batch-timeout-ms", "0"], "--batch-timeout-ms 0: must be a finite number of ms"),
    (["--batch-timeout-ms", "-5"], "--batch-timeout-ms -5: must be"),
    (["--batch-timeout-ms", "nan"], "--batch-timeout-ms nan: must be"),
    (["--drain-timeout-s", "nan"], "--drain-timeout-s nan: must be a number of seconds > 0"),
    (["--drain-timeout-s", "0"], "--drain-timeout-s 0: must be"),
])
def test_the_cli_refuses_bad_live_flags_in_one_line(flags: list[str], message: str,
                                                    tmp_path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    result = CliRunner().invoke(app, ["live", str(path), "--force", *flags])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert message.replace("of ms", "of milliseconds") in text and "Traceback" not in text


def test_the_cli_refuses_a_batch_timeout_for_an_llm_scenario() -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    result = CliRunner().invoke(app, ["live", "builtin:llm-demo", "--batch-timeout-ms", "100"])
    assert result.exit_code == 2 and "not supported for LLM scenarios" in result.output


def test_join_within_is_bounded_in_all_and_a_hurry_ends_it() -> None:
    gate = threading.Event()
    threads = [threading.Thread(target=gate.wait, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    # 0.3 s for all three, not 0.3 s each. The join's slices run to one absolute end, so a
    # correct join returns after the bound plus the lateness of its last timed wake only (an
    # earlier slice's lateness comes out of the next one). A join that gives each thread the
    # bound takes at least twice it for two threads or more: a timed join never ends early.
    # So twice the bound separates the two exactly; a correct join fails only if its one
    # last wake is a whole bound (0.3 s) late, far past the worst of the timed waits probed
    # after it (in the message)
    bound_s = 0.3
    t0 = time.perf_counter()
    left = join_within(threads, bound_s, threading.Event())
    waited_s = time.perf_counter() - t0
    lateness_s = _wake_lateness_s()
    assert len(left) == 3 and bound_s <= waited_s < 2 * bound_s, (waited_s, lateness_s)
    # a hurry ends the join at its next slice: a join ignoring it waits the whole 30 s. The
    # wake-up lateness allowed is the worst of the timed waits probed just above
    hurry = threading.Event()
    fired: list[float] = []

    def set_hurry() -> None:
        fired.append(time.perf_counter())
        hurry.set()

    # (fired mid-slice, 2.5 slices in: fired at a slice's start, the join's wake would
    # have no room beside the probe's worst lateness)
    threading.Timer(2.5 * JOIN_SLICE_S, set_hurry).start()
    join_within(threads, 30.0, hurry)
    returned = time.perf_counter()
    assert fired and returned - fired[0] <= JOIN_SLICE_S + lateness_s, (
        returned - fired[0], lateness_s)
    gate.set()
    assert join_within(threads, 5.0, threading.Event()) == []


def _wake_lateness_s(n: int = 50, wait_s: float = 0.002) -> float:
    """The worst overshoot of ``n`` timed waits of ``wait_s`` (a probe of how late this
    machine wakes a waiting thread now)."""
    event, worst = threading.Event(), 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        event.wait(wait_s)
        worst = max(worst, time.perf_counter() - t0 - wait_s)
    return worst


# -- through real signals, in a subprocess ------------------------------------------------

HUNG_SCRIPT = """
import json, sys, threading
from executor.live_requests import live
from executor.testing import SleepRunner
class Hang(SleepRunner):
    def run_batch(self, payloads):
        if self.calls == 5:
            self.calls += 1
            threading.Event().wait()  # never returns
        return super().run_batch(payloads)
cfg = {"seed": 4, "service": {"kind": "constant", "ms": 4, "deterministic": True},
       "workload": {"kind": "constant", "rate_rps": 100, "duration_s": 30},
       "policy": {"kind": "greedy", "max_batch_size": 4}, "model": {"name": "sleep"}}
print("ready", flush=True)
drivers = []
r = live(cfg, runners=[Hang(lambda n: 0.004)], handle_sigint=True, stop_mode="drain",
         drain_timeout_s=60.0, on_driver=drivers.append)
health = r.summary["executor_health"]
print(json.dumps({**{k: r.meta[k] for k in ("stopped_by", "stopped_s", "end_s",
                                             "unfinished_batches", "status_counts")},
                  "start_perf": drivers[0].start_perf,
                  "late_ms": health["loop_lateness_ms"]["max"],
                  "step_ms": health["dispatch_overhead_ms"]["max"]}), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("first", ["SIGINT", "SIGTERM"])
def test_signals_work_while_a_model_call_hangs_and_the_second_one_ends_the_run(
        first: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HUNG_SCRIPT], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # batch 5 (at about 0.05 s) hangs; arrivals queue behind it
    first_perf = time.perf_counter()  # CLOCK_MONOTONIC: the child's perf_counter clock too
    os.kill(proc.pid, getattr(signal, first))  # drain: would wait for the hung call 60 s
    time.sleep(0.5)
    sent = time.perf_counter()
    os.kill(proc.pid, signal.SIGTERM if first == "SIGINT" else signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    ended_s = time.perf_counter() - sent
    assert proc.returncode == 0, stderr
    data = json.loads(stdout.strip().splitlines()[-1])
    assert data["stopped_by"] == first
    # the summary and the interpreter's exit; not the 60 s drain (once, beside two hogs, this
    # took 29.9 s: the run went on to the schedule's end; what it printed is in the message)
    assert ended_s < 5.0, (ended_s, data, stderr[-3000:])
    # each signal took effect at the loop's next iteration: never before it was sent, and at
    # most one wait (at most the 50 ms poll) plus the worst lateness this run measured for
    # a wait or a core step later. The first stopped admitting; the second ended the loop,
    # which the drain would have held for the hung call (60 s)
    late_s = _POLL_S + float(np.nansum([data["late_ms"], data["step_ms"]])) / 1e3
    first_s, second_s = first_perf - data["start_perf"], sent - data["start_perf"]
    assert 0 <= data["stopped_s"] - first_s <= late_s, (data, first_s)
    assert 0 <= data["end_s"] - second_s <= late_s, (data, second_s)
    assert len(data["unfinished_batches"]) == 1
    assert data["status_counts"].get("in_flight", 0) > 0


CLI_SCRIPT = """
import sys, executor.live_requests, servelab.cli
from executor.testing import SleepRunner
def runners(scn):
    print("ready", flush=True)
    return [SleepRunner(lambda n: 0.004)]
executor.live_requests.default_runners = runners
sys.argv = ["servelab", "live", *sys.argv[1:]]
servelab.cli.main()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_on_the_cli_writes_the_run_directory(tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    cfg = {**BASE, "workload": {"kind": "poisson", "rate_rps": 100, "duration_s": 60},
           "warmup_s": 0.1}
    scenario.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", CLI_SCRIPT, str(scenario), "--out",
                             str(out), "--force"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "stopped early by SIGTERM" in " ".join(stdout.split())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stopped_by"] == "SIGTERM" and meta["stopped_early"] is True
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] > 0 and (out / "requests.parquet").exists()
    assert summary["window_s"] == pytest.approx(meta["stopped_s"] - 0.1, abs=1e-9)
    # the records hold exactly the seeded schedule's arrivals due by the stop (the stop takes
    # in every arrival due by its time, then closes the schedule): the simulator draws the
    # same schedule from the seed. An arrival lost at the stop, or one admitted after it,
    # shows
    import pandas as pd

    import sim

    due = sim.run(cfg).requests["arrival_s"].to_numpy()
    due = np.sort(due[due <= meta["stopped_s"]])
    recorded = np.sort(pd.read_parquet(out / "requests.parquet")["arrival_s"].to_numpy())
    assert due.size > 0
    np.testing.assert_allclose(recorded, due, rtol=0, atol=1e-9)
