"""Autoscaling policies: how many replicas the fleet should have, as pure, clock-less objects.

Like the batching policies they import neither simpy nor torch and take the time as an
argument, so the simulator and the live executor consult the very same objects. The core
asks :meth:`Autoscaler.desired` on every control period (``control_period_s``) and when a
request arrives to an empty fleet (no replica ready or starting); the answer is clipped to
``[min_replicas, max_replicas]`` by the policy itself.

* :class:`TargetOngoing` follows Ray Serve's default policy: the mean (or, as Ray's
  ``aggregation_function`` says, the largest or smallest) number of ongoing requests
  (queued + running) sampled over ``look_back_period_s`` divided by
  ``target_ongoing_requests``; the change from the running count is multiplied by
  ``upscaling_factor``/``downscaling_factor``; a decision to go up (down) must hold for
  ``upscale_delay_s`` (``downscale_delay_s``) before it is acted on; with no replica
  running and requests waiting it launches one at once (see the class for Ray's details).
* :class:`Concurrency` follows Knative's KPA: the mean concurrency over ``stable_window_s``
  over ``target_concurrency``; when the mean over ``panic_window_s`` reaches
  ``panic_threshold`` times what the ready replicas are meant to carry it panics (scales on
  the short window and never down) until a stable window passes without that; with
  ``min_replicas: 0`` the last replica goes only after ``scale_to_zero_grace_s`` without any
  request; an arrival to zero replicas scales up at once (the activator).
* :class:`Schedule` sets the count by time of day (``steps`` of ``[start_s, replicas]``,
  repeating every ``period_s``), for comparison.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class FleetView:
    """What an autoscaler sees.

    Attributes:
        now_s: The time.
        ready: Replicas serving.
        starting: Replicas launched and still in their cold start.
        queued: Requests waiting in the queues.
        running: Requests in running batches.
    """

    now_s: float
    ready: int
    starting: int
    queued: int
    running: int

    @property
    def replicas(self) -> int:
        """Replicas ready or starting (the count a decision changes)."""
        return self.ready + self.starting

    @property
    def ongoing(self) -> int:
        """Requests queued or running."""
        return self.queued + self.running


class Autoscaler(Protocol):
    """A replica-count policy."""

    min_replicas: int
    max_replicas: int
    initial_replicas: int

    def desired(self, view: FleetView) -> int:
        """The replica count wanted now (within the bounds)."""
        ...


class _Bounded:
    def __init__(self, min_replicas: int, max_replicas: int,
                 initial_replicas: int | None) -> None:
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.initial_replicas = min_replicas if initial_replicas is None else initial_replicas

    def _clip(self, n: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, n))


AGGREGATIONS = ("mean", "max", "min")


class _Window:
    """Samples of the ongoing-request count; means (or extremes) over trailing windows."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now_s: float, value: int) -> None:
        self._samples.append((now_s, value))
        while self._samples and self._samples[0][0] < now_s - self.keep_s:
            self._samples.popleft()

    def mean(self, now_s: float, window_s: float) -> float:
        return self.aggregate(now_s, window_s, "mean")

    def aggregate(self, now_s: float, window_s: float, how: str) -> float:
        """The samples since ``now_s - window_s`` reduced by ``how`` (mean, max or min;
        0 without samples).
        """
        values = [v for t, v in self._samples if t >= now_s - window_s]
        if not values:
            return 0.0
        if how == "max":
            return float(max(values))
        if how == "min":
            return float(min(values))
        return sum(values) / len(values)


class TargetOngoing(_Bounded):
    """Ray Serve's ``target_ongoing_requests`` policy, as Ray 2.60 computes it
    (``autoscaling_policy.py``: ``_core_replica_queue_length_policy``,
    ``_apply_scaling_factors``, ``_apply_delay_logic``, ``_get_cold_start_scale_up_replicas``;
    the bounds applied last, ``autoscaling_state.apply_bounds``).

    * The total: the ongoing samples over ``look_back_period_s`` reduced by
      ``aggregation_function``. Desired = total / ``target_ongoing_requests``.
    * The change from the **running** (ready) count is multiplied by ``upscaling_factor``
      (``downscaling_factor``) and rounded up; a scale-down that the factor rounds to no
      change goes down by one.
    * That count is compared with the **target** count (ready + starting): a rise (fall)
      is acted on once it has held ``upscale_delay_s`` (``downscale_delay_s``; from 1 to 0
      ``downscale_to_zero_delay_s`` when given). A fall from more than one replica stops at
      one: only 1 → 0 reaches zero.
    * No replica running and requests counted: at once (no delay) the larger of
      ceil(``upscaling_factor``) and the target count, so from zero it launches one replica
      (with the default factor) and holds while replicas start; no replica running and no
      requests: the count is kept.
    """

    _DELAY_EPS_S = 1e-6  # Ray's _DELAY_ELAPSED_EPS_S: a delay counts as held this early

    def __init__(self, *, min_replicas: int = 1, max_replicas: int = 1,
                 initial_replicas: int | None = None, target_ongoing_requests: float = 2.0,
                 upscale_delay_s: float = 30.0, downscale_delay_s: float = 600.0,
                 look_back_period_s: float = 30.0, upscaling_factor: float = 1.0,
                 downscaling_factor: float = 1.0, aggregation_function: str = "mean",
                 downscale_to_zero_delay_s: float | None = None) -> None:
        if aggregation_function not in AGGREGATIONS:
            raise ValueError(f"autoscaling.aggregation_function: {aggregation_function!r}; "
                             f"one of {', '.join(AGGREGATIONS)}")
        super().__init__(min_replicas, max_replicas, initial_replicas)
        self.target = target_ongoing_requests
        self.upscale_delay_s, self.downscale_delay_s = upscale_delay_s, downscale_delay_s
        self.downscale_to_zero_delay_s = downscale_to_zero_delay_s
        self.look_back_period_s = look_back_period_s
        self.upscaling_factor, self.downscaling_factor = upscaling_factor, downscaling_factor
        # Ray's reduction of the ongoing total over the look-back window (its
        # ``aggregate_timeseries``: a time-weighted mean, or the largest / smallest point in
        # the window); here of the samples, one per control period
        self.aggregation_function = aggregation_function
        self._window = _Window(look_back_period_s)
        self._up_since_s: float | None = None
        self._down_since_s: float | None = None

    def __repr__(self) -> str:
        return (f"TargetOngoing(target_ongoing_requests={self.target:g}, "
                f"replicas {self.min_replicas}..{self.max_replicas})")

    def desired(self, view: FleetView) -> int:
        """The count Ray's rule gives now (a change acted on only after its delay)."""
        now, running, current = view.now_s, view.ready, view.replicas
        self._window.add(now, view.ongoing)
        total = self._window.aggregate(now, self.look_back_period_s, self.aggregation_function)
        if running == 0:
            if total > 0:  # the cold-start fast path: no delay, the timers untouched
                return self._clip(max(math.ceil(self.upscaling_factor), current))
            if current > 0:  # replicas starting, nothing counted: kept, timers untouched
                return self._clip(current)
            self._up_since_s = self._down_since_s = None
            return self._clip(0)
        wanted = running * (total / (self.target * running))  # Ray's expression, float
        delta = wanted - running
        factor = self.upscaling_factor if delta > 0 else self.downscaling_factor
        scaled = math.ceil(running + factor * delta)
        if math.ceil(wanted) < running and scaled == running:
            scaled -= 1  # a factor's rounding never holds a scale-down at no change
        if scaled > current:
            self._down_since_s = None
            self._up_since_s = now if self._up_since_s is None else self._up_since_s
            if now - self._up_since_s + self._DELAY_EPS_S >= self.upscale_delay_s:
                self._up_since_s = None
                return self._clip(scaled)
        elif scaled < current:
            self._up_since_s = None
            delay_s = self.downscale_delay_s
            if current == 1 and self.downscale_to_zero_delay_s is not None:
                delay_s = self.downscale_to_zero_delay_s
            if current > 1:
                scaled = max(1, scaled)  # only 1 -> 0 reaches zero
            self._down_since_s = now if self._down_since_s is None else self._down_since_s
            if now - self._down_since_s + self._DELAY_EPS_S >= delay_s:
                self._down_since_s = None
                return self._clip(scaled)
        else:
            self._up_since_s = self._down_since_s = None
        return self._clip(current)


class Concurrency(_Bounded):
    """Knative's KPA on request concurrency (see the module docstring)."""

    def __init__(self, *, min_replicas: int = 0, max_replicas: int = 1,
                 initial_replicas: int | None = None, target_concurrency: float = 1.0,
                 stable_window_s: float = 60.0, panic_window_s: float = 6.0,
                 panic_threshold: float = 2.0, scale_to_zero_grace_s: float = 30.0) -> None:
        super().__init__(min_replicas, max_replicas, initial_replicas)
        self.target = target_concurrency
        self.stable_window_s, self.panic_window_s = stable_window_s, panic_window_s
        self.panic_threshold = panic_threshold
        self.scale_to_zero_grace_s = scale_to_zero_grace_s
        self._window = _Window(stable_window_s)
        self._panic_since_s: float | None = None
        self._panic_floor = 0
        self._last_busy_s = -math.inf

    def __repr__(self) -> str:
        return (f"Concurrency(target_concurrency={self.target:g}, "
                f"replicas {self.min_replicas}..{self.max_replicas})")

    @property
    def panicking(self) -> bool:
        """Whether the policy is in panic mode."""
        return self._panic_since_s is not None

    def desired(self, view: FleetView) -> int:
        """The KPA's count now."""
        now = view.now_s
        self._window.add(now, view.ongoing)
        if view.ongoing:
            self._last_busy_s = now
        if view.replicas == 0:  # the activator: an arrival to zero replicas scales up now
            return self._clip(max(1, math.ceil(view.ongoing / self.target))) \
                if view.ongoing else self._clip(0)
        stable = math.ceil(self._window.mean(now, self.stable_window_s) / self.target - 1e-9)
        panic = math.ceil(self._window.mean(now, self.panic_window_s) / self.target - 1e-9)
        ready = max(view.ready, 1)
        if self._window.mean(now, self.panic_window_s) >= \
                self.panic_threshold * ready * self.target:
            if self._panic_since_s is None:
                self._panic_floor = view.replicas
            self._panic_since_s = now  # (re)armed: stays until a quiet stable window
        elif self._panic_since_s is not None and \
                now - self._panic_since_s >= self.stable_window_s:
            self._panic_since_s = None
        if self._panic_since_s is not None:
            self._panic_floor = max(self._panic_floor, panic)
            return self._clip(self._panic_floor)  # no scale-down while panicking
        if stable == 0 and now - self._last_busy_s < self.scale_to_zero_grace_s:
            stable = 1  # keep the last replica through the grace period
        return self._clip(stable)


class Schedule(_Bounded):
    """Replica counts by time of day: ``steps`` of ``(start_s, replicas)``, repeating every
    ``period_s`` (None: once).
    """

    def __init__(self, *, steps: Sequence[tuple[float, int]], period_s: float | None = None,
                 min_replicas: int = 0, max_replicas: int | None = None,
                 initial_replicas: int | None = None) -> None:
        counts = [int(n) for _, n in steps]
        top = max(counts) if max_replicas is None else max_replicas
        first = counts[0] if steps and steps[0][0] <= 0 else min_replicas
        super().__init__(min_replicas, top,
                         first if initial_replicas is None else initial_replicas)
        self.starts_s = [float(t) for t, _ in steps]
        self.counts = counts
        self.period_s = period_s

    def __repr__(self) -> str:
        return f"Schedule({len(self.counts)} steps, period_s={self.period_s})"

    def desired(self, view: FleetView) -> int:
        """The count of the step the time of day falls in."""
        t = view.now_s % self.period_s if self.period_s else view.now_s
        k = bisect.bisect_right(self.starts_s, t) - 1
        if k < 0:  # before the first step: the day's last step still holds (or the start)
            return self._clip(self.counts[-1] if self.period_s else self.initial_replicas)
        return self._clip(self.counts[k])
