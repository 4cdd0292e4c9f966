"""Workloads: seeded arrival schedules (open loop) and closed-loop client populations.

An open-loop workload turns a ``numpy.random.Generator`` into an :class:`ArrivalSchedule`,
the table that both the simulator and the live executor replay: the same seed gives the same
schedule. Each workload is a small object that validates its parameters and shows them in
its repr. Bounds: ``duration_s`` (arrivals in ``[0, duration_s)``) and/or ``n_requests``
(the first n arrivals); at least one must be given.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.builtin import DATA, builtin_name, shipped, shipped_path
from sim.errors import UserError

_CHUNK = 65536


class WorkloadError(UserError):
    """A workload parameter or input file is invalid."""


def data_path(path: str | Path, field: str = "workload.path") -> Path:
    """A data file's path: ``builtin:NAME`` is a file shipped in ``servelab/data``.

    Raises:
        WorkloadError: ``builtin:NAME`` that is not one of the shipped traces (a name with a
            folder in it, such as ``builtin:../../x``, would read outside the data folder).
    """
    name = builtin_name(path)
    if name is None:
        return Path(str(path))
    names = shipped(DATA, lambda n: n.endswith((".csv", ".jsonl")))
    if name not in names:
        raise WorkloadError(f"{field}: {str(path)!r} is not a shipped data file; available: "
                            + ", ".join(f"builtin:{n}" for n in names))
    return shipped_path(DATA, name)


_COLUMN_NAME = re.compile(r"[A-Za-z_][\w .()/-]{0,63}")


def columns_text(columns: object) -> str:
    """The columns of a CSV for an error message, or a note that its first line is not a
    header of column names (the message must not echo the first line of any file given).
    """
    names = [str(c) for c in columns]  # type: ignore[attr-defined]
    if len(names) <= 64 and all(_COLUMN_NAME.fullmatch(n) for n in names):
        return "columns: " + ", ".join(names)
    return f"its first line is not a header of column names ({len(names)} fields)"


@dataclass(frozen=True)
class ArrivalSchedule:
    """Arrival times (s, ascending), sizes (items) and priorities of an open-loop run.

    ``rows``: for a trace, the data row (0-based) each arrival replays, so other columns of
    the trace (an LLM request's prompt and output tokens) can follow it.
    """

    arrival_s: np.ndarray
    size: np.ndarray
    priority: np.ndarray
    klass: list[str] | None = field(default=None)
    rows: np.ndarray | None = field(default=None)

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def to_frame(self) -> pd.DataFrame:
        """The schedule as a table (``id, arrival_s, size, priority``)."""
        frame = pd.DataFrame({"id": np.arange(len(self)), "arrival_s": self.arrival_s,
                              "size": self.size, "priority": self.priority})
        if self.klass is not None:
            frame["klass"] = self.klass
        return frame


def _check(name: str, value: float, *, low: float = 0.0, strict: bool = True) -> float:
    ok = value > low if strict else value >= low
    if not (ok and math.isfinite(value)):
        sign = ">" if strict else ">="
        raise WorkloadError(f"workload.{name}: must be {sign} {low:g}, got {value!r}")
    return float(value)


class OpenLoop:
    """Common bounds and request attributes of open-loop workloads."""

    needs_bound = True  # a trace is finite by itself

    def __init__(self, duration_s: float | None = None, n_requests: int | None = None,
                 size: int = 1, priority_mix: list[float] | None = None) -> None:
        if duration_s is None and n_requests is None and self.needs_bound:
            raise WorkloadError("workload.duration_s: give duration_s or n_requests")
        self.duration_s = None if duration_s is None else _check("duration_s", duration_s)
        if n_requests is not None and (int(n_requests) != n_requests or n_requests < 1):
            raise WorkloadError(f"workload.n_requests: must be an integer >= 1, got {n_requests!r}")
        self.n_requests = None if n_requests is None else int(n_requests)
        if int(size) != size or size < 1:
            raise WorkloadError(f"workload.size: must be an integer >= 1, got {size!r}")
        self.size = int(size)
        if priority_mix is not None:
            mix = np.asarray(priority_mix, dtype=float)
            if mix.ndim != 1 or mix.size == 0 or np.any(mix < 0) or not np.isclose(mix.sum(), 1):
                raise WorkloadError("workload.priority_mix: must be probabilities per priority "
                                    f"level (0 first) summing to 1, got {priority_mix!r}")
        self.priority_mix = priority_mix

    def _times(self, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def _bounded(self, last_s: float, count: int) -> bool:
        """Whether enough arrivals were generated to satisfy the bounds."""
        if self.n_requests is not None and count >= self.n_requests:
            return True
        return self.duration_s is not None and last_s >= self.duration_s

    def _clip(self, times: np.ndarray) -> np.ndarray:
        if self.duration_s is not None:
            times = times[times < self.duration_s]
        if self.n_requests is not None:
            times = times[: self.n_requests]
        return times

    def schedule(self, rng: np.random.Generator) -> ArrivalSchedule:
        """Draw the arrival schedule from ``rng``."""
        times = self._clip(self._times(rng))
        # one value for every request: a read-only broadcast (no memory per request), which
        # the request table copies only where it keeps a size column
        size = np.broadcast_to(np.int64(self.size), times.shape)
        return ArrivalSchedule(times, size, self._priorities(rng, times.size))

    def _priorities(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.priority_mix is None:
            return np.zeros(n, dtype=np.int8)
        mix = np.asarray(self.priority_mix, dtype=float)
        return rng.choice(mix.size, size=n, p=mix / mix.sum()).astype(np.int8)

    def _renewal(self, rng: np.random.Generator, draw: object) -> np.ndarray:
        """Cumulative sums of inter-arrival gaps drawn in chunks until the bounds hold."""
        chunks: list[np.ndarray] = []
        last, count = 0.0, 0
        while not self._bounded(last, count):
            gaps = draw(_CHUNK)  # type: ignore[operator]
            times = last + np.cumsum(gaps)
            chunks.append(times)
            last, count = float(times[-1]), count + times.size
        return np.concatenate(chunks) if chunks else np.empty(0)


class Poisson(OpenLoop):
    """Poisson arrivals at ``rate_rps``."""

    def __init__(self, rate_rps: float, **bounds: object) -> None:
        self.rate_rps = _check("rate_rps", rate_rps)
        super().__init__(**bounds)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Poisson(rate_rps={self.rate_rps:g})"

    def _times(self, rng: np.random.Generator) -> np.ndarray:
        return self._renewal(rng, lambda n: rng.standard_exponential(n) / self.rate_rps)


class Constant(OpenLoop):
    """Evenly spaced arrivals at ``rate_rps`` (the first at ``1 / rate_rps``)."""

    def __init__(self, rate_rps: float, **bounds: object) -> None:
        self.rate_rps = _check("rate_rps", rate_rps)
        super().__init__(**bounds)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Constant(rate_rps={self.rate_rps:g})"

    def _times(self, rng: np.random.Generator) -> np.ndarray:
        n = self.n_requests if self.n_requests is not None else math.ceil(
            (self.duration_s or 0) * self.rate_rps) + 1
        return np.arange(1, n + 1, dtype=float) / self.rate_rps


class GammaArrivals(OpenLoop):
    """Renewal arrivals with gamma gaps: mean rate ``rate_rps``, burstiness ``cv``
    (coefficient of variation of the gaps; 1 is Poisson, above 1 is bursty).
    """

    def __init__(self, rate_rps: float, cv: float = 1.0, **bounds: object) -> None:
        self.rate_rps = _check("rate_rps", rate_rps)
        self.cv = _check("cv", cv)
        super().__init__(**bounds)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"GammaArrivals(rate_rps={self.rate_rps:g}, cv={self.cv:g})"

    def _times(self, rng: np.random.Generator) -> np.ndarray:
        shape = 1.0 / self.cv**2
        scale = 1.0 / (self.rate_rps * shape)
        return self._renewal(rng, lambda n: rng.standard_gamma(shape, n) * scale)


class Mmpp(OpenLoop):
    """Markov-modulated Poisson process: state ``i`` emits at ``rates_rps[i]`` for an
    exponential dwell of mean ``mean_dwell_s[i]``, then moves to state ``(i + 1) mod k``
    (two states: on/off bursts).
    """

    def __init__(self, rates_rps: list[float], mean_dwell_s: list[float] | float,
                 **bounds: object) -> None:
        if len(rates_rps) < 2:
            raise WorkloadError("workload.rates_rps: need at least 2 states")
        self.rates_rps = [_check("rates_rps", r, strict=False) for r in rates_rps]
        if not any(r > 0 for r in self.rates_rps):
            raise WorkloadError("workload.rates_rps: at least one state needs a rate > 0")
        dwell = mean_dwell_s if isinstance(mean_dwell_s, list) else [mean_dwell_s] * len(rates_rps)
        if len(dwell) != len(rates_rps):
            raise WorkloadError("workload.mean_dwell_s: give one dwell per state "
                                f"({len(rates_rps)}), got {len(dwell)}")
        self.mean_dwell_s = [_check("mean_dwell_s", d) for d in dwell]
        super().__init__(**bounds)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Mmpp(rates_rps={self.rates_rps}, mean_dwell_s={self.mean_dwell_s})"

    def _times(self, rng: np.random.Generator) -> np.ndarray:
        chunks: list[np.ndarray] = []
        t, state, count = 0.0, 0, 0
        while not self._bounded(t, count):
            dwell = rng.exponential(self.mean_dwell_s[state])
            rate = self.rates_rps[state]
            if rate > 0:
                n = rng.poisson(rate * dwell)
                times = np.sort(t + rng.random(n) * dwell)
                if n:  # short dwells emit nothing most of the time: keep no empty arrays
                    chunks.append(times)
                count += n
            t += dwell
            state = (state + 1) % len(self.rates_rps)
        return np.concatenate(chunks) if chunks else np.empty(0)


class Sinusoid(OpenLoop):
    """Poisson arrivals with rate ``rate_rps * (1 + amplitude * sin(2 pi t / period_s))``
    (``amplitude`` is relative, in [0, 1]); drawn by thinning.
    """

    def __init__(self, rate_rps: float, amplitude: float = 0.5, period_s: float = 60.0,
                 **bounds: object) -> None:
        self.rate_rps = _check("rate_rps", rate_rps)
        if not 0 <= amplitude <= 1:
            raise WorkloadError(f"workload.amplitude: must lie in [0, 1], got {amplitude!r}")
        self.amplitude = float(amplitude)
        self.period_s = _check("period_s", period_s)
        super().__init__(**bounds)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (f"Sinusoid(rate_rps={self.rate_rps:g}, amplitude={self.amplitude:g}, "
                f"period_s={self.period_s:g})")

    def _times(self, rng: np.random.Generator) -> np.ndarray:
        peak = self.rate_rps * (1 + self.amplitude)
        chunks: list[np.ndarray] = []
        last, count = 0.0, 0
        while not self._bounded(last, count):
            cand = last + np.cumsum(rng.standard_exponential(_CHUNK) / peak)
            rate = self.rate_rps * (1 + self.amplitude * np.sin(2 * np.pi * cand / self.period_s))
            keep = cand[rng.random(cand.size) * peak < rate]
            chunks.append(keep)
            last, count = float(cand[-1]), count + keep.size
        return np.concatenate(chunks) if chunks else np.empty(0)


class Trace(OpenLoop):
    """Replay arrivals from a CSV file (the whole trace unless bounded).

    Times come from ``timestamp_column`` (datetimes, or numbers in seconds), shifted to start
    at 0 and multiplied by ``time_scale`` (2 = twice as slow); ``start_s`` (in the trace's own
    seconds) drops the rows before it, so a slice starts there. ``rate_scale`` keeps the timing
    pattern and changes the rate: below 1 each request is kept with that probability, above 1
    each request is sent ``floor(rate_scale)`` times plus once more with the fractional
    probability. Sizes from ``size_column`` if given.
    """

    needs_bound = False

    def __init__(self, path: str, timestamp_column: str = "TIMESTAMP", time_scale: float = 1.0,
                 rate_scale: float = 1.0, size_column: str | None = None, start_s: float = 0.0,
                 **bounds: object) -> None:
        self.path = data_path(path)
        if not (math.isfinite(start_s) and start_s >= 0):
            raise WorkloadError(f"workload.start_s: {start_s!r} must be a finite number >= 0")
        self.start_s = float(start_s)
        self.timestamp_column = timestamp_column
        self.time_scale = _check("time_scale", time_scale)
        self.rate_scale = _check("rate_scale", rate_scale)
        self.size_column = size_column
        if not self.path.is_file():
            raise WorkloadError(f"workload.path: trace file {str(self.path)!r} not found")
        super().__init__(**bounds)  # type: ignore[arg-type]
        self._times_s, self._sizes = self._load()

    def __repr__(self) -> str:
        return (f"Trace(path={str(self.path)!r}, time_scale={self.time_scale:g}, "
                f"rate_scale={self.rate_scale:g}, start_s={self.start_s:g})")

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        try:
            frame = pd.read_csv(self.path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"workload.path: {str(self.path)!r} is not a readable CSV "
                                f"({str(exc).splitlines()[0]})") from None
        if self.timestamp_column not in frame.columns:
            raise WorkloadError(f"workload.timestamp_column: {self.timestamp_column!r} not in "
                                f"{str(self.path)!r}; {columns_text(frame.columns)}")
        if frame.empty:
            raise WorkloadError(f"workload.path: {str(self.path)!r} has no rows")
        raw = frame[self.timestamp_column]
        if pd.api.types.is_numeric_dtype(raw):
            seconds = raw.to_numpy(float)
        else:
            try:
                parsed = pd.to_datetime(raw, errors="coerce", format="mixed")
            except (ValueError, TypeError, OverflowError) as exc:  # e.g. mixed time zones
                why = "mixed time zones" if "timezone" in str(exc).lower() else \
                    str(exc).splitlines()[0][:120]
                raise WorkloadError(f"workload.timestamp_column: {self.timestamp_column!r} "
                                    f"cannot be read as datetimes ({why}); give every "
                                    "timestamp the same time zone (or none), or seconds"
                                    ) from None
            if parsed.isna().any():
                bad = raw[parsed.isna()].iloc[0]
                raise WorkloadError(f"workload.timestamp_column: cannot parse {bad!r} as a "
                                    "datetime or a number of seconds")
            seconds = (parsed - parsed.min()).dt.total_seconds().to_numpy(float)
        if not np.all(np.isfinite(seconds)):
            raise WorkloadError(f"workload.timestamp_column: {self.timestamp_column!r} has "
                                "missing or non-finite values")
        sizes = np.ones(seconds.size, dtype=np.int64)
        if self.size_column is not None:
            if self.size_column not in frame.columns:
                raise WorkloadError(f"workload.size_column: {self.size_column!r} not in "
                                    f"{str(self.path)!r}; {columns_text(frame.columns)}")
            sizes = count_column(frame[self.size_column], f"workload.size_column: "
                                 f"{self.size_column!r}")
        back = np.flatnonzero(np.diff(seconds) < 0)
        if back.size:
            row = int(back[0]) + 1  # 0-based data row that goes back in time
            raise WorkloadError(f"workload.timestamp_column: {self.timestamp_column!r} must "
                                f"not go back in time (data row {row + 1}: {raw.iloc[row]} "
                                f"after {raw.iloc[row - 1]}); sort the trace by it first")
        seconds = seconds - seconds[0]
        first = int(np.searchsorted(seconds, self.start_s))
        if first == seconds.size:
            raise WorkloadError(f"workload.start_s: {self.start_s:g} s is past the trace's "
                                f"last row ({seconds[-1]:g} s)")
        self._first_row = first
        with np.errstate(over="ignore"):
            scaled = (seconds[first:] - self.start_s) * self.time_scale
        if not np.all(np.isfinite(scaled)):
            row = first + int(np.flatnonzero(~np.isfinite(scaled))[0])
            raise WorkloadError(f"workload.time_scale: {self.time_scale:g} turns data row "
                                f"{row + 1} ({seconds[row]:g} s) into an infinite time; "
                                "lower it")
        spread = seconds[first:] > seconds[first]
        if spread.any() and not np.any(scaled[spread] > scaled[0]):
            raise WorkloadError(f"workload.time_scale: {self.time_scale:g} collapses the "
                                f"trace's {seconds[-1] - seconds[first]:g} s onto one instant; "
                                "raise it")
        return scaled, sizes[first:]

    def schedule(self, rng: np.random.Generator) -> ArrivalSchedule:
        """The (rate-scaled, bounded) trace."""
        times, sizes = self._times_s, self._sizes
        rows = np.arange(self._first_row, self._first_row + times.size)
        if self.rate_scale != 1.0:
            whole = math.floor(self.rate_scale)
            copies = whole + (rng.random(times.size) < self.rate_scale - whole)
            # only the copies the bounds keep are made (n_requests 10 at rate_scale 1e9
            # repeats the first row 10 times, not 1e9 times each row)
            copies = self._bounded_copies(times, copies)
            times, sizes = np.repeat(times, copies), np.repeat(sizes, copies)
            rows = np.repeat(rows, copies)
        keep = self._clip(times).size
        return ArrivalSchedule(times[:keep].astype(float), sizes[:keep].astype(np.int64),
                               self._priorities(rng, keep), rows=rows[:keep])


    def _bounded_copies(self, times: np.ndarray, copies: np.ndarray) -> np.ndarray:
        """Copies per row, cut where ``duration_s`` or ``n_requests`` ends the schedule."""
        copies = copies.astype(np.int64)
        if self.duration_s is not None:
            copies = np.where(times < self.duration_s, copies, 0)
        if self.n_requests is not None:
            before = np.cumsum(copies) - copies  # arrivals before each row's copies
            copies = np.clip(self.n_requests - before, 0, copies)
        return copies


def count_column(column: pd.Series, field: str) -> np.ndarray:
    """A CSV column of counts (sizes, tokens) as int64, or an error naming ``field``.

    Fractions are refused rather than truncated (2.9 is not 2), and so are counts above
    :data:`sim.scenario.schema.MAX_COUNT` (they would wrap around in int64).
    """
    from sim.scenario.schema import MAX_COUNT

    values = pd.to_numeric(column, errors="coerce").to_numpy(float)
    bad = np.isnan(values) | (values < 1) | (values != np.floor(values)) | (values > MAX_COUNT)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise WorkloadError(f"{field} must hold whole numbers in [1, {MAX_COUNT}] (data row "
                            f"{i + 1}: {str(column.iloc[i])[:40]})")
    return values.astype(np.int64)


class ClosedLoop:
    """``clients`` clients; each sends, waits for its answer, thinks, sends again.

    Think times are gamma distributed with mean ``think_ms`` and coefficient of variation
    ``think_cv`` (1 = exponential, 0 = constant). Each client starts after one think time.
    Clients stop sending at ``duration_s`` or once ``n_requests`` were sent in total.
    """

    def __init__(self, clients: int, think_ms: float = 0.0, think_cv: float = 1.0,
                 duration_s: float | None = None, n_requests: int | None = None,
                 size: int = 1) -> None:
        if int(clients) != clients or clients < 1:
            raise WorkloadError(f"workload.clients: must be an integer >= 1, got {clients!r}")
        self.clients = int(clients)
        self.think_s = _check("think_ms", think_ms, strict=False) / 1e3
        self.think_cv = _check("think_cv", think_cv, strict=False)
        if duration_s is None and n_requests is None:
            raise WorkloadError("workload.duration_s: give duration_s or n_requests")
        self.duration_s = math.inf if duration_s is None else _check("duration_s", duration_s)
        self.n_requests = None if n_requests is None else int(n_requests)
        self.size = int(size)

    def __repr__(self) -> str:
        return (f"ClosedLoop(clients={self.clients}, think_ms={self.think_s * 1e3:g}, "
                f"think_cv={self.think_cv:g})")

    def think_sampler(self, rng: np.random.Generator) -> ThinkSampler:
        """A callable drawing think times (s) from ``rng``."""
        return ThinkSampler(self.think_s, self.think_cv, rng)


class ThinkSampler:
    """Gamma think times with the given mean (s) and CV (0 = constant)."""

    def __init__(self, mean_s: float, cv: float, rng: np.random.Generator) -> None:
        self.mean_s, self.cv, self.rng = mean_s, cv, rng

    def __call__(self) -> float:
        """One think time in seconds."""
        if self.mean_s == 0 or self.cv == 0:
            return self.mean_s
        shape = 1.0 / self.cv**2
        return float(self.rng.standard_gamma(shape)) * self.mean_s / shape
