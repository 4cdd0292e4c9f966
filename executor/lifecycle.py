"""What every live run shares around its driver: the refusal up front, the bounds check, the
drain deadline, and one stop path.

* :class:`LiveError`: the scenario cannot be run live as given;
* :func:`check_bounds`: refuse a live run the simulator predicts unstable or too long (one
  rule for request-level and LLM runs);
* :func:`default_drain_s` (from :mod:`sim.metrics.window`): the default drain timeout;
* :func:`stop_on_signals`: SIGINT and SIGTERM stop the run and keep what was measured.

Both live drivers (:class:`executor.request_driver.LiveDriver` and
:class:`executor.llm_driver.LiveLlmEngine`) have ``stop(mode)``. While a run is under
:func:`stop_on_signals`, the first SIGINT (Ctrl-C) or SIGTERM calls ``stop(mode)``: the run
stops admitting and drains (or abandons) as asked, and the caller gets the records so far. A
second signal escalates: ``stop("abandon")`` and ``hurry()`` — the run ends now, without
waiting for running model calls.

A model call that hangs cannot hold the process either: when the driver's loop ends (the
drain deadline, an abandon, the end of the schedule) its workers get at most
:data:`HUNG_GRACE_S` in all to return (:func:`join_within`), and any signal cuts that short.
A worker still inside the model then is a daemon thread: its batch stays in flight (censored)
and the process can exit.
"""

from __future__ import annotations

import math
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

from sim.errors import UserError
from sim.metrics.window import default_drain_s

__all__ = ["HUNG_GRACE_S", "LiveError", "Stoppable", "check_bounds", "check_drain_timeout_s",
           "check_stop_mode", "default_drain_s", "join_within", "stop_on_signals"]


class LiveError(UserError):
    """The scenario cannot be run live as given (no model to run, mismatched settings)."""


def check_bounds(stability: dict[str, Any], end_s: float, horizon_s: float, *,
                 max_wall_s: float, repeats: int = 1, extra_s_per_run: float = 0.0,
                 lower: str = "Lower the load", shorten: str = "the workload") -> float:
    """Refuse live runs the simulator predicts unstable or, ``repeats`` of them together,
    longer than ``max_wall_s``.

    Args:
        stability: The prediction's stability verdict (``summary["stability"]``).
        end_s: When the predicted run ended (horizon plus its drain).
        horizon_s: The end of the measurement window.
        max_wall_s: The most wall time allowed for all the live runs together.
        repeats: How many live runs will follow.
        extra_s_per_run: Extra wall time per run (probes).
        lower: The first way out of an unstable run (what to lower or bound).
        shorten: What to shorten when the runs take too long.

    Returns:
        The estimated wall time (s): repeats × (horizon + predicted drain + extra).

    Raises:
        LiveError: one line with the estimate and the way out.
    """
    estimate = repeats * (end_s + extra_s_per_run)
    parts = (f"horizon {horizon_s:,.0f} s + predicted drain {max(end_s - horizon_s, 0):,.0f} s"
             + (f" + probes {extra_s_per_run:.0f} s" if extra_s_per_run else ""))
    detail = (f"about {estimate:,.0f} s of wall time ("
              + (f"{repeats} runs × ({parts})" if repeats > 1 else parts) + ")")
    if stability["verdict"] == "unstable":
        raise LiveError(f"refusing to run live: the simulator predicts an unstable run "
                        f"({stability['reason']}); {detail}. {lower}, or pass --force (the "
                        "run then stops draining after --drain-timeout-s)")
    if estimate > max_wall_s:
        raise LiveError(f"refusing to run live: {detail} exceeds --max-wall-s {max_wall_s:g}. "
                        f"Shorten {shorten}, raise --max-wall-s, or pass --force")
    return estimate


HUNG_GRACE_S = 5.0
"""At most this long (s) after a live run's loop ends for model calls still running to
return; past it they are left behind in flight."""

STOP_SIGNALS = ("SIGINT", "SIGTERM")


class Stoppable(Protocol):
    """A live driver: stop admitting (drain or abandon) and stop waiting for workers."""

    stopped_by: str | None

    def stop(self, mode: str = "drain") -> None:
        """Stop admitting arrivals."""

    def hurry(self) -> None:
        """End now: abandon the queue and stop waiting for running model calls."""


def check_stop_mode(mode: str) -> None:
    """Raise ``ValueError`` naming the allowed stop modes."""
    if mode not in ("drain", "abandon"):
        raise ValueError(f"stop mode {mode!r}: allowed: drain, abandon")


@contextmanager
def stop_on_signals(driver: Stoppable, mode: str, enabled: bool = True) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM stop ``driver`` (the first with ``mode``, any
    later one with :meth:`Stoppable.hurry`); the previous handlers come back after it.

    Only the main thread can install signal handlers: elsewhere (or with ``enabled`` false)
    this does nothing and the signals keep their previous meaning.
    """
    check_stop_mode(mode)
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[str] = []

    def act(signum: int) -> None:
        name = signal.Signals(signum).name
        seen.append(name)
        if len(seen) == 1:
            driver.stopped_by = name
            driver.stop(mode)
        else:
            driver.hurry()

    inbox: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    acting = threading.Thread(target=_act_in_order, args=(inbox, act), daemon=True,
                              name="servelab-signals")
    acting.start()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        inbox.put(signum)  # SimpleQueue.put takes no Python lock: safe in a handler

    previous = {name: signal.signal(getattr(signal, name), on_signal)
                for name in STOP_SIGNALS if hasattr(signal, name)}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
        inbox.put(None)  # after the signals that came: act on them, then end
        acting.join(_ACT_JOIN_S)


_ACT_JOIN_S = 5.0  # at most this long for the signals' stop() and hurry() calls to return


def _act_in_order(inbox: queue.SimpleQueue[int | None], act: Callable[[int], None]) -> None:
    """Run ``act(signum)`` for each signal put in ``inbox``, one after another, until None.

    The signal handler only puts the signal here; this thread calls the driver. A handler
    runs in the main thread between any two bytecodes, possibly while that thread holds a
    lock ``stop()`` or ``hurry()`` needs (inside ``queue.Queue.get`` or ``Event.set``, or
    inside a first handler's own ``stop()``): called from the handler, they would wait on
    it for ever. From this thread they wait until the main thread lets it go.
    """
    while (signum := inbox.get()) is not None:
        act(signum)


JOIN_SLICE_S = 0.05  # join_within waits in slices of at most this long


def join_within(threads: Iterable[threading.Thread], bound_s: float,
                hurry: threading.Event) -> list[threading.Thread]:
    """Join ``threads`` for at most ``bound_s`` in all (less once ``hurry`` is set); return
    the ones still running.

    The join waits in short slices, so a signal handler runs promptly meanwhile and can set
    ``hurry`` to end the wait.
    """
    pending = list(threads)
    end = time.perf_counter() + bound_s
    for thread in pending:
        while thread.is_alive() and not hurry.is_set():
            left = end - time.perf_counter()
            if left <= 0:
                break
            thread.join(min(left, JOIN_SLICE_S))
    return [t for t in pending if t.is_alive()]


def check_drain_timeout_s(value: float, flag: str = "--drain-timeout-s") -> None:
    """A drain timeout is a number of seconds > 0 (``inf``: no deadline).

    Raises:
        UserError: naming ``flag``.
    """
    if math.isnan(value) or value <= 0:
        raise UserError(f"{flag} {value:g}: must be a number of seconds > 0 (inf: drain "
                         "everything)")


def check_batch_timeout_s(value: float | None, flag: str = "batch_timeout_s") -> None:
    """A batch timeout is a finite number of seconds > 0 (None: no timeout).

    Raises:
        UserError: naming ``flag``.
    """
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise UserError(f"{flag} {value:g}: must be a finite number > 0 (leave it out for "
                        "no batch timeout)")
