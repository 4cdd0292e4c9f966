"""``stop_on_signals``: a signal that arrives while the handler is still acting on the one
before it (Python runs the handler again, nested, between the first one's bytecodes) is acted
on after it, not inside it. Nested, a ``hurry()`` setting the event whose ``set()`` the
outer ``stop()`` is inside would wait on that event's lock for ever.
"""

from __future__ import annotations

import signal
import threading

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

    def _enter(self, name: str) -> None:
        assert not self.inside, f"{name}() ran inside another call: {self.calls}"
        self.inside = True
        self.calls.append((name, "enter"))

    def _leave(self, name: str) -> None:
        self.calls.append((name, "leave"))
        self.inside = False

    def stop(self, mode: str = "drain") -> None:
        self._enter("stop")
        with self.lock:
            while self.nested:  # a signal arrives while the lock is held
                signal.getsignal(self.nested.pop(0))(signal.SIGINT, None)  # type: ignore[operator]
        self._leave("stop")

    def hurry(self) -> None:
        self._enter("hurry")
        acquired = self.lock.acquire(timeout=1.0)  # nested, this would wait for ever
        assert acquired, "hurry() waited on the lock stop() holds"
        self.lock.release()
        self._leave("hurry")


@pytest.mark.parametrize("n_nested", [1, 2])
def test_a_signal_during_the_first_ones_stop_escalates_after_it_not_inside_it(
        n_nested: int) -> None:
    driver = _Driver(nested=[signal.SIGTERM] * n_nested)
    with stop_on_signals(driver, "drain"):
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # type: ignore[operator]
    assert driver.stopped_by == "SIGINT"
    assert driver.calls == [("stop", "enter"), ("stop", "leave")] + [
        ("hurry", "enter"), ("hurry", "leave")] * n_nested


def test_the_handler_takes_later_signals_after_a_nested_one() -> None:
    driver = _Driver(nested=[signal.SIGINT])
    with stop_on_signals(driver, "abandon"):
        handler = signal.getsignal(signal.SIGTERM)
        handler(signal.SIGTERM, None)  # type: ignore[operator]
        handler(signal.SIGTERM, None)  # type: ignore[operator]  # not lost to a stuck flag
    assert driver.stopped_by == "SIGTERM"
    assert [c for c, e in driver.calls if e == "enter"] == ["stop", "hurry", "hurry"]
