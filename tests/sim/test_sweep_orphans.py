"""A sweep's worker processes die with their parent, however the parent ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc to find the workers")

SWEEP_SCRIPT = """
from servelab import sweep
base = {"seed": 1, "service": {"kind": "constant", "ms": 1},
        "workload": {"kind": "poisson", "rate_rps": 500, "n_requests": 400000},
        "policy": {"kind": "greedy", "max_batch_size": 4}}
print("ready", flush=True)
sweep(base, {"policy.max_batch_size": list(range(1, 41))}, seeds=1, workers=2)
print("finished", flush=True)
"""

WATCH_SCRIPT = """
import os, sys, time
from sim.experiments import orphans
parent = os.getpid()
child = os.fork()
if child == 0:  # the watchdog alone, without the kernel's death signal
    orphans._watch(parent)
print(child, flush=True)
time.sleep(600)
"""


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            found |= {int(x) for x in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (PID 1 in a container may never reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pids: set[int], within_s: float) -> set[int]:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        left = {p for p in pids if alive(p)}
        if not left:
            return left
        time.sleep(0.05)
    return {p for p in pids if alive(p)}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_a_sweep_leaves_no_worker_running(sig: signal.Signals, tmp_path) -> None:
    # stderr to a file: an orphaned worker would hold a pipe open and hang the test
    with (tmp_path / "stderr").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SWEEP_SCRIPT], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    workers: set[int] = set()
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        end = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < end:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()
            workers = children(proc.pid)
            time.sleep(0.05)
        assert len(workers) >= 2, "the sweep never started its two workers"
        time.sleep(0.5)  # the workers are inside their first simulations
        assert all(alive(p) for p in workers)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        # the kernel's death signal acts at once; the watchdog within its period
        assert wait_gone(workers, within_s=5.0) == set()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for pid in workers:  # a failed check leaves nothing behind either
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        assert proc.stdout is not None
        proc.stdout.close()


def test_the_watchdog_alone_ends_a_worker_whose_parent_died() -> None:
    from sim.experiments.orphans import WATCH_PERIOD_S

    proc = subprocess.Popen([sys.executable, "-c", WATCH_SCRIPT], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        assert alive(child)
        time.sleep(2 * WATCH_PERIOD_S)
        assert alive(child)  # the parent lives: the watchdog leaves the worker alone
        proc.kill()
        proc.wait(timeout=30)
        assert wait_gone({child}, within_s=WATCH_PERIOD_S + 5.0) == set()
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
        proc.communicate()
