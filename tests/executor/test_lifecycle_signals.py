"""``stop_on_signals``: the handler calls the driver from no lock the main thread may hold.
Python runs a handler in the main thread between any two bytecodes: inside the first
signal's ``stop()`` (a second signal), or inside ``queue.Queue.get`` or ``Event.set`` of the
driver's own loop. Called from there, a ``stop()`` or ``hurry()`` taking the same lock would
wait on it for ever; the handler only queues the signal and a thread acts on it in order.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest

from executor.lifecycle import stop_on_signals


class _Driver:
    """Records its calls; its ``stop`` delivers more signals in the middle of itself."""

    def __init__(self, nested: list[int]) -> None:
        self.stopped_by: str | None = None
        self.calls: list[tuple[str, str]] = []  # (call, enter|leave)
        self.nested = nested
        self.inside = False
        self.lock = threading.Lock()  # as Event.set holds its condition's lock
        self.handler: Any = None  # the installed handler, as a signal would run it

    def _enter(self, name: str) -> None:
        assert not self.inside, f"{name}() ran inside another call: {self.calls}"
        self.inside = True
        self.calls.append((name, "enter"))

    def _leave(self, name: str) -> None:
        self.calls.append((name, "leave"))
        self.inside = False

    def stop(self, mode: str = "drain") -> None:
        self._enter("stop")
        acquired = self.lock.acquire(timeout=2.0)  # from the main thread holding it: for ever
        assert acquired, "stop() waited on a lock the main thread holds"
        while self.nested:  # a signal arrives while the lock is held
            self.handler(self.nested.pop(0), None)
        self.lock.release()
        self._leave("stop")

    def hurry(self) -> None:
        self._enter("hurry")
        acquired = self.lock.acquire(timeout=1.0)  # nested, this would wait for ever
        assert acquired, "hurry() waited on the lock stop() holds"
        self.lock.release()
        self._leave("hurry")

    def wait_for(self, n_calls: int) -> None:
        """Until ``n_calls`` calls returned (the signals are acted on by another thread)."""
        deadline_s = time.monotonic() + 5.0
        while (sum(e == "leave" for _, e in self.calls) < n_calls
               and time.monotonic() < deadline_s):
            time.sleep(0.002)


@pytest.mark.parametrize("n_nested", [1, 2])
def test_a_signal_during_the_first_ones_stop_escalates_after_it_not_inside_it(
        n_nested: int) -> None:
    driver = _Driver(nested=[signal.SIGTERM] * n_nested)
    with stop_on_signals(driver, "drain"):
        driver.handler = signal.getsignal(signal.SIGINT)
        driver.handler(signal.SIGINT, None)
        driver.wait_for(1 + n_nested)
    assert driver.stopped_by == "SIGINT"
    assert driver.calls == [("stop", "enter"), ("stop", "leave")] + [
        ("hurry", "enter"), ("hurry", "leave")] * n_nested


def test_the_handler_takes_later_signals_after_a_nested_one() -> None:
    driver = _Driver(nested=[signal.SIGINT])
    with stop_on_signals(driver, "abandon"):
        driver.handler = signal.getsignal(signal.SIGTERM)
        driver.handler(signal.SIGTERM, None)
        driver.handler(signal.SIGTERM, None)  # not lost behind the nested one
        driver.wait_for(3)
    assert driver.stopped_by == "SIGTERM"
    assert [c for c, e in driver.calls if e == "enter"] == ["stop", "hurry", "hurry"]


def test_a_signal_while_the_main_thread_holds_the_drivers_lock_is_acted_on_after_it() -> None:
    driver = _Driver(nested=[])
    with stop_on_signals(driver, "drain"):
        with driver.lock:  # as the loop inside Queue.get holds the queue's mutex
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # type: ignore[operator]
            time.sleep(0.05)  # the handler has returned; stop() waits for the lock
        driver.wait_for(1)
    assert driver.calls == [("stop", "enter"), ("stop", "leave")]
    assert driver.stopped_by == "SIGINT"


def test_a_real_signal_stops_the_driver_and_the_previous_handler_comes_back() -> None:
    driver = _Driver(nested=[])
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals(driver, "drain"):
        signal.raise_signal(signal.SIGTERM)
    assert driver.stopped_by == "SIGTERM" and driver.calls == [("stop", "enter"),
                                                               ("stop", "leave")]
    assert signal.getsignal(signal.SIGTERM) is before
