"""Run the dashboard's Streamlit server as a child that ends when ``servelab dashboard`` does.

The server runs in its own process group. SIGTERM, SIGINT and SIGHUP sent to the CLI are
forwarded to that group, and the CLI waits for the server to exit (killing the group after
a grace period), so ``kill <pid of servelab dashboard>`` no longer leaves an orphaned
server answering on its port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from types import FrameType

GRACE_S = 10.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_server(cmd: Sequence[str], grace_s: float = GRACE_S) -> int:
    """Run ``cmd`` in a new process group, forward termination signals to the group, and
    return its exit status (0 when it ended because it was asked to).

    Args:
        cmd: The server's command line.
        grace_s: How long to wait after forwarding a signal before killing the group.
    """
    proc = subprocess.Popen(list(cmd), start_new_session=True)
    asked: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        asked.append(signum)
        _signal_group(proc, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        while True:
            try:
                code = proc.wait(timeout=grace_s if asked else None)
                break
            except subprocess.TimeoutExpired:  # asked to stop and still running
                _signal_group(proc, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # an exception on our side: never leave the server behind
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    return 0 if asked else code


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signum)
