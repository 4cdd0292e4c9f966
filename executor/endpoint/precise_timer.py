"""Sub-millisecond sleeps on an asyncio event loop, for the open-loop sender's send times.

asyncio's and uvloop's timers have a 1 ms grain (epoll's and libuv's timeouts are whole
milliseconds), so a sender that sleeps on them leaves up to 1 ms late and, at 2,000
requests/s, sends its requests in bursts of two or three; the server then queues the later
ones of each burst behind the first, which the client overhead benchmark counts as latency
the client added (benchmarks/results/bench_client.md). A Linux ``timerfd`` armed at the
absolute send time (``CLOCK_MONOTONIC``, the clock of ``time.perf_counter``) wakes the loop's
poll to the kernel's timer slack (50 µs) instead, at the cost of one read per wake and no
busy core. ``timerfd`` is reached through ``ctypes`` (``os.timerfd_create`` is Python 3.13's);
where it is missing (not Linux), :func:`open_timer` gives the loop's own timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time
from typing import Protocol

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class Timer(Protocol):
    """Sleeps until a ``time.perf_counter`` time."""

    precise: bool

    async def sleep_until(self, when_s: float) -> None:
        """Return at ``when_s`` or just after, never before."""

    def close(self) -> None:
        """Release the timer."""


class LoopTimer:
    """The loop's own timers (1 ms grain): naps, then yields until the time has come."""

    precise = False

    async def sleep_until(self, when_s: float) -> None:
        """Return at ``when_s`` or up to about 1 ms after, never before."""
        wait = when_s - time.perf_counter()
        while wait > 0:
            await asyncio.sleep(max(wait, 0.001))
            wait = when_s - time.perf_counter()

    def close(self) -> None:
        """Nothing to release."""


class TimerFd:
    """A ``timerfd`` watched by the loop; one sleeper at a time.

    Args:
        loop: The running loop (asyncio's or uvloop's: both watch any readable fd).
        libc: The C library with ``timerfd_create`` and ``timerfd_settime``.
    """

    precise = True

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL) -> None:
        self._loop = loop
        self._settime = libc.timerfd_settime
        self._settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                  ctypes.c_void_p)
        self._settime.restype = ctypes.c_int
        fd = int(libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._fd = fd
        self._spec = _Itimerspec()
        self._waiter: asyncio.Future[None] | None = None
        loop.add_reader(fd, self._fired)

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a wake for a timer re-armed since
            os.read(self._fd, 8)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def sleep_until(self, when_s: float) -> None:
        """Return at ``when_s`` or just after (the kernel's timer slack), never before."""
        if when_s <= time.perf_counter():
            return
        sec = int(when_s)
        self._spec.it_value.tv_sec = sec
        self._spec.it_value.tv_nsec = max(int((when_s - sec) * 1e9), 1)  # 0 would disarm
        if self._settime(self._fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        while time.perf_counter() < when_s:  # the clocks agree; this only guards the rounding
            await asyncio.sleep(0)

    def close(self) -> None:
        """Stop watching and close the fd."""
        self._loop.remove_reader(self._fd)
        os.close(self._fd)


def open_timer(loop: asyncio.AbstractEventLoop | None = None, precise: bool = True) -> Timer:
    """A :class:`TimerFd` on ``loop`` (default: the running one) when the system has
    ``timerfd`` and ``precise``, else a :class:`LoopTimer`.
    """
    if precise and time.get_clock_info("perf_counter").implementation.endswith(
            "(CLOCK_MONOTONIC)"):
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            if hasattr(libc, "timerfd_create"):
                return TimerFd(loop or asyncio.get_running_loop(), libc)
        except OSError:
            pass
    return LoopTimer()
