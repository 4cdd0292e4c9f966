"""Service-time models: how long one batch takes, in seconds.

Each model is a small object with ``sample_s(items)``, ``median_s(items)``, ``mean_s(items)``
and a repr showing its parameters; parameters are validated in the constructor. Random draws
come from the generator given at construction, pre-drawn in blocks (the simulator's hot path
takes one float from a list). ``deterministic=True`` makes every sample the median.

Kinds: ``profile`` (bootstrap from a measured :class:`LatencyProfile`), ``linear``
(``base_ms + per_item_ms * items`` with optional gamma noise of coefficient of variation ``cv``),
and the textbook ``constant``, ``exponential`` and ``gamma`` (independent of batch size).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from calibration.profile import LatencyProfile
from sim.errors import UserError

if TYPE_CHECKING:
    from sim.serving.dispatch import Batch

_BLOCK = 8192


class ServiceModel(Protocol):
    """What the simulator needs from a service-time model."""

    def sample_s(self, items: int, idle_s: float = 0.0) -> float:
        """One service time for a batch of ``items`` items, in seconds; ``idle_s`` is how
        long the replica was idle before this batch (0 when it follows another at once).
        """
        ...

    def median_s(self, items: int) -> float:
        """Median service time in seconds."""
        ...

    def mean_s(self, items: int) -> float:
        """Mean service time in seconds."""
        ...


class _Stream:
    """Pre-drawn random numbers handed out one at a time (same order as single draws)."""

    __slots__ = ("_buf", "_draw", "_i")

    def __init__(self, draw: Callable[[int], np.ndarray]) -> None:
        self._draw = draw
        self._buf: list[float] = []
        self._i = 0

    def next(self, items: int = 1, idle_s: float = 0.0) -> float:
        """The next draw (``items`` and ``idle_s`` are ignored: with them it can stand in
        for ``ServiceModel.sample_s`` of a model whose draws do not depend on the batch).
        """
        if self._i >= len(self._buf):
            self._buf = self._draw(_BLOCK).tolist()
            self._i = 0
        value = self._buf[self._i]
        self._i += 1
        return value


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise UserError(f"service.{name}: must be {bound}, got {value!r}")
    return float(value)


class ConstantService:
    """Every batch takes ``ms`` milliseconds (M/D/c queues)."""

    def __init__(self, ms: float) -> None:
        self.s = _positive("ms", ms) / 1e3

    def __repr__(self) -> str:
        return f"ConstantService(ms={self.s * 1e3:g})"

    def sample_s(self, items: int, idle_s: float = 0.0) -> float:
        """The constant."""
        return self.s

    def median_s(self, items: int) -> float:
        """The constant."""
        return self.s

    def mean_s(self, items: int) -> float:
        """The constant."""
        return self.s


class GammaService:
    """Gamma-distributed batch time with mean ``mean_ms`` and coefficient of variation ``cv``
    (``cv = 1`` is exponential: M/M/c queues).
    """

    def __init__(self, mean_ms: float, cv: float = 1.0, rng: np.random.Generator | None = None,
                 deterministic: bool = False) -> None:
        self.mean_s_ = _positive("mean_ms", mean_ms) / 1e3
        self.cv = _positive("cv", cv)
        shape = 1.0 / self.cv**2
        self._shape = shape
        self.deterministic = deterministic
        gen = rng if rng is not None else np.random.default_rng(0)
        scale = self.mean_s_ / shape
        if self.cv == 1.0:
            self._stream = _Stream(lambda n: gen.standard_exponential(n) * self.mean_s_)
        else:
            self._stream = _Stream(lambda n: gen.standard_gamma(shape, n) * scale)
        self._median_s = self._compute_median()
        if not deterministic:
            self.sample_s = self._stream.next  # type: ignore[method-assign]

    def _compute_median(self) -> float:
        if self.cv == 1.0:
            return self.mean_s_ * math.log(2.0)
        probe = np.random.default_rng(12345).standard_gamma(self._shape, 200_000)
        return float(np.median(probe)) * self.mean_s_ / self._shape

    def __repr__(self) -> str:
        return f"GammaService(mean_ms={self.mean_s_ * 1e3:g}, cv={self.cv:g})"

    def sample_s(self, items: int, idle_s: float = 0.0) -> float:
        """One draw (independent of the batch size)."""
        return self._median_s if self.deterministic else self._stream.next()

    def median_s(self, items: int) -> float:
        """Median of the distribution."""
        return self._median_s

    def mean_s(self, items: int) -> float:
        """Mean of the distribution."""
        return self.mean_s_


def exponential_service(mean_ms: float, rng: np.random.Generator | None = None,
                        deterministic: bool = False) -> GammaService:
    """Exponential batch time with the given mean (a gamma with cv = 1)."""
    return GammaService(mean_ms, 1.0, rng, deterministic)


class LinearService:
    """``base_ms + per_item_ms * items`` per batch, times gamma noise of mean 1 and CV ``cv``."""

    def __init__(self, base_ms: float, per_item_ms: float, cv: float = 0.0,
                 rng: np.random.Generator | None = None, deterministic: bool = False) -> None:
        self.base_s = _positive("base_ms", base_ms, allow_zero=True) / 1e3
        self.per_item_s = _positive("per_item_ms", per_item_ms, allow_zero=True) / 1e3
        if self.base_s + self.per_item_s <= 0:
            raise UserError("service.base_ms: base_ms + per_item_ms must be > 0")
        self.cv = _positive("cv", cv, allow_zero=True)
        self.deterministic = deterministic or self.cv == 0.0
        gen = rng if rng is not None else np.random.default_rng(0)
        if self.cv > 0:
            shape = 1.0 / self.cv**2
            self._noise = _Stream(lambda n: gen.standard_gamma(shape, n) / shape)
            probe = np.random.default_rng(12345).standard_gamma(shape, 200_000) / shape
            self._median_factor = float(np.median(probe))
        else:
            self._median_factor = 1.0

    def __repr__(self) -> str:
        return (f"LinearService(base_ms={self.base_s * 1e3:g}, "
                f"per_item_ms={self.per_item_s * 1e3:g}, cv={self.cv:g})")

    def mean_s(self, items: int) -> float:
        """Mean batch time."""
        return self.base_s + self.per_item_s * items

    def median_s(self, items: int) -> float:
        """Median batch time."""
        return self.mean_s(items) * self._median_factor

    def sample_s(self, items: int, idle_s: float = 0.0) -> float:
        """One draw."""
        if self.deterministic:
            return self.median_s(items)
        return (self.base_s + self.per_item_s * items) * self._noise.next()


class ProfileService:
    """Bootstrap from a measured profile (interpolated between measured batch sizes)."""

    def __init__(self, profile: LatencyProfile, rng: np.random.Generator | None = None,
                 deterministic: bool = False) -> None:
        self.profile = profile
        self.deterministic = deterministic
        gen = rng if rng is not None else np.random.default_rng(0)
        self._uniform = _Stream(gen.random)
        self._samples: dict[int, list[float]] = {}
        self._cold: dict[int, list[float]] = {}
        self.cold_after_s = profile.cold_after_s

    def __repr__(self) -> str:
        return f"ProfileService(profile={self.profile.name!r})"

    def _table(self, items: int) -> list[float]:
        table = self._samples.get(items)
        if table is None:
            table = self.profile.scaled_samples_s(items).tolist()
            self._samples[items] = table
        return table

    def sample_s(self, items: int, idle_s: float = 0.0) -> float:
        """One bootstrap draw; from the cold samples when the replica idled at least the
        profile's ``cold_after_s`` before this batch (profiles measured with idle gaps).
        """
        if self.deterministic:
            return self.profile.median_s(items)
        if idle_s >= self.cold_after_s:
            table = self._cold.get(items)
            if table is None:
                table = self._cold[items] = self.profile.scaled_samples_s(items, cold=True).tolist()
        else:
            table = self._table(items)
        return table[int(self._uniform.next() * len(table))]

    def median_s(self, items: int) -> float:
        """Median from the profile."""
        return self.profile.median_s(items)

    def mean_s(self, items: int) -> float:
        """Mean from the profile."""
        return self.profile.mean_s(items)


class ReplayService:
    """Measured service times handed out in dispatch order: a live run's own batch times fed
    back into the simulator, so a comparison differs from the live run only in what the
    executor adds (timers, hand-off), not in how fast the machine happened to be.

    With ``replicas`` each replica replays its own batches in its own order, so two
    replicas that dispatch at nearly the same moment in a different order than the live run
    still get their own times (the simulator's driver calls :meth:`sample_batch_s`).

    Args:
        durations_s: One measured time per batch, in the order the batches were dispatched.
        model: Gives the medians and means the policies plan with, and the draws for any
            batch past the measured ones (a simulation that dispatched more batches).
        replicas: The replica of each measured batch (None: one sequence for all).
    """

    def __init__(self, durations_s: Sequence[float] | np.ndarray, model: ServiceModel,
                 replicas: Sequence[int] | np.ndarray | None = None) -> None:
        values = [float(v) for v in durations_s]
        for i, v in enumerate(values):
            if not (v >= 0 and math.isfinite(v)):
                raise UserError(f"durations_s[{i}]: must be a finite time >= 0, got {v!r}")
        owners = [0] * len(values) if replicas is None else [int(r) for r in replicas]
        if len(owners) != len(values):
            raise UserError(f"replicas: one per duration ({len(values)}), got {len(owners)}")
        self.by_replica = replicas is not None
        self._queues: dict[int, list[float]] = {}
        for owner, value in zip(owners, values, strict=True):
            self._queues.setdefault(owner, []).append(value)
        self._next: dict[int, int] = dict.fromkeys(self._queues, 0)
        self.model = model
        self.replayed = 0  # batches given a measured time so far

    def __repr__(self) -> str:
        n = sum(len(q) for q in self._queues.values())
        return f"ReplayService(batches={n}, by_replica={self.by_replica}, model={self.model!r})"

    def _take(self, owner: int, items: int, idle_s: float) -> float:
        queue, i = self._queues.get(owner, []), self._next.get(owner, 0)
        if i < len(queue):
            self._next[owner] = i + 1
            self.replayed += 1
            return queue[i]
        return self.model.sample_s(items, idle_s)

    def sample_s(self, items: int, idle_s: float = 0.0) -> float:
        """The next measured time (of replica 0 with ``replicas``); past the last, a draw
        from ``model``.
        """
        return self._take(0, items, idle_s)

    def sample_batch_s(self, batch: Batch) -> float:
        """The next measured time of this batch's replica (or of all, without ``replicas``)."""
        return self._take(batch.replica if self.by_replica else 0, batch.items, batch.idle_s)

    def median_s(self, items: int) -> float:
        """The model's median."""
        return self.model.median_s(items)

    def mean_s(self, items: int) -> float:
        """The model's mean."""
        return self.model.mean_s(items)
