"""Sweep worker processes die with the process that started them.

A local sweep runs its tasks in a process pool. If the parent is killed from outside
(SIGTERM, SIGKILL, the OOM killer) the pool's own shutdown never runs, and its workers would
go on computing for nobody, orphaned to PID 1. :func:`die_with_parent` is the pool's worker
initializer and closes that gap twice:

- on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the worker the moment the
  thread that forked it ends (the pool forks its workers from the thread that submits the
  tasks, which waits for them);
- everywhere, a daemon thread that checks every :data:`WATCH_PERIOD_S` whether the parent is
  still the worker's parent, and ends the worker when it is not (the fallback where ``prctl``
  is missing, and for a parent that died before the worker could ask).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

WATCH_PERIOD_S = 0.5
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _set_death_signal() -> bool:
    """Ask the Linux kernel to SIGKILL this process when its parent ends; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)  # the parent is gone: nobody will read what this worker computes
        time.sleep(WATCH_PERIOD_S)


def die_with_parent(parent_pid: int) -> None:
    """Worker initializer: end this process when ``parent_pid`` (its parent) ends."""
    _set_death_signal()
    if os.getppid() != parent_pid:  # the parent died before the death signal was set
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="parent-watch",
                     daemon=True).start()
