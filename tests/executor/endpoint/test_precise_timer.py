"""The open-loop sender's timer (:mod:`executor.endpoint.precise_timer`): never early, and on
Linux finer than the event loop's own 1 ms timers, on asyncio's loop and on uvloop's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest

from executor.endpoint.precise_timer import LoopTimer, TimerFd, open_timer


def _loops() -> list[Callable[[], asyncio.AbstractEventLoop]]:
    makers: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
    try:
        import uvloop
    except ImportError:
        return makers
    return [*makers, uvloop.new_event_loop]


@pytest.mark.parametrize("make_loop", _loops(), ids=lambda m: m.__module__)
def test_sleeps_end_at_their_time_never_before(
        make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def lateness(precise: bool) -> list[float]:
        timer = open_timer(precise=precise)
        late = []
        start = time.perf_counter()
        try:
            for k in range(1, 101):
                due = start + k * 0.0003
                await timer.sleep_until(due)
                late.append(time.perf_counter() - due)
            await timer.sleep_until(start)  # a time gone by: at once
        finally:
            timer.close()
        return late

    loop = make_loop()
    try:
        for precise in (True, False):
            assert min(loop.run_until_complete(lateness(precise))) >= 0.0
    finally:
        loop.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
@pytest.mark.parametrize("make_loop", _loops(), ids=lambda m: m.__module__)
def test_the_timerfd_is_finer_than_the_loops_timers_in_the_same_run(
        make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    # the two timers take turns, so a busy machine delays both alike; the loop's timers
    # round every wait to whole milliseconds, the timerfd to the kernel's timer slack
    async def both() -> tuple[list[float], list[float]]:
        fine, coarse = open_timer(), LoopTimer()
        assert isinstance(fine, TimerFd)
        late: tuple[list[float], list[float]] = ([], [])
        try:
            for k in range(200):
                timer = (fine, coarse)[k % 2]
                due = time.perf_counter() + 0.0003
                await timer.sleep_until(due)
                late[k % 2].append(time.perf_counter() - due)
        finally:
            fine.close()
        return late

    loop = make_loop()
    try:
        fine_s, coarse_s = loop.run_until_complete(both())
    finally:
        loop.close()
    assert np.median(fine_s) < np.median(coarse_s)


def test_without_timerfd_the_loops_timers_stand_in() -> None:
    async def kind() -> str:
        timer = open_timer(precise=False)
        timer.close()
        return type(timer).__name__

    assert asyncio.run(kind()) == "LoopTimer"
