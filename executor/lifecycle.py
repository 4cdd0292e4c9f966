"""What every live run shares around its driver: the refusal up front, the bounds check, the
drain deadline and the stop.

* :class:`LiveError`: the scenario cannot be run live as given;
* :func:`check_bounds`: refuse a live run the simulator predicts unstable or too long (one
  rule for request-level and LLM runs);
* :func:`default_drain_s` (from :mod:`sim.metrics.window`): the default drain timeout;
* :func:`run_stoppable`: run a driver with Ctrl-C (SIGINT) calling its ``stop(mode)``, the
  previous handler restored after.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol, TypeVar

from sim.errors import UserError
from sim.metrics.window import default_drain_s

__all__ = ["LiveError", "Stoppable", "check_bounds", "default_drain_s", "run_stoppable"]

T = TypeVar("T")


class LiveError(UserError):
    """The scenario cannot be run live as given (no model to run, mismatched settings)."""


class Stoppable(Protocol):
    """A live driver: ``stop(mode)`` stops admitting and drains or abandons."""

    def stop(self, mode: str = "drain") -> None:
        """Stop the run (``drain`` or ``abandon``)."""


def run_stoppable(driver: Stoppable, run: Callable[[], T], *, handle_sigint: bool,
                  stop_mode: str) -> T:
    """``run()``; with ``handle_sigint`` (on the main thread only) Ctrl-C calls
    ``driver.stop(stop_mode)`` meanwhile, and the previous handler is restored after.
    """
    previous: Any = None
    if handle_sigint and threading.current_thread() is threading.main_thread():
        def _on_sigint(signum: int, frame: FrameType | None) -> None:
            driver.stop(stop_mode)
        previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        return run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


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
