"""LatencyProfile: measured service-time samples per batch size, and its JSON format.

A profile answers "how long does one batch of ``b`` items take on this device?" from
measurements. The simulator samples from it (bootstrap); the calibration tools write it.
Everything inside is in seconds. This module imports neither torch nor simpy.

Interpolation: between two measured batch sizes the median is interpolated linearly and a
sample is a bootstrap draw from the nearer measured size, scaled by the ratio of medians.
Beyond the measured range a :class:`ProfileError` is raised unless the profile was opened with
``extrapolate=True``; then a straight line through the last two measured medians is used and a
warning is logged once per size.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.builtin import PROFILES, builtin_name, read_shipped, shipped
from sim.errors import UserError

SCHEMA_VERSION = 1
_LOG = logging.getLogger(__name__)


class ProfileError(UserError):
    """A profile file is missing, malformed, or asked for a batch size it cannot answer."""


@dataclass(frozen=True)
class LatencyProfile:
    """Measured batch service times for one model on one device.

    Attributes:
        samples_s: Measured service times in seconds, keyed by batch size (items).
        model: Model name and runner parameters (``{"name": ..., ...}``).
        device: Device description (``{"kind": "cpu"|"cuda", "name": ...}``).
        meta: Everything else recorded with the measurement (dtype, threads, versions, host,
            created_at, synthetic flag, ...).
        extrapolate: Allow (logged) linear extrapolation beyond the measured sizes.
        load_samples_s: Measured cold starts in seconds: building the runner, loading the
            weights, moving them to the device and the first forward (``servelab calibrate
            --load-reps``); the simulator draws a new replica's cold start from them. Not
            the cold-idle samples, which time batches after an idle gap.
    """

    samples_s: dict[int, np.ndarray]
    model: dict[str, Any] = field(default_factory=dict)
    cold_samples_s: dict[int, np.ndarray] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    extrapolate: bool = False
    load_samples_s: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __post_init__(self) -> None:
        if not self.samples_s:
            raise ProfileError("profile.batch_sizes: no batch sizes measured (need at least one)")
        for size, samples in self.samples_s.items():
            if int(size) < 1:
                raise ProfileError(f"profile.batch_sizes: batch size {size} must be >= 1")
            arr = np.asarray(samples, dtype=float)
            if arr.ndim != 1 or arr.size == 0:
                raise ProfileError(f"profile.samples[{size}]: needs a non-empty list of seconds")
            if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
                raise ProfileError(f"profile.samples[{size}]: samples must be finite and > 0 s")
        ordered = {int(b): np.sort(np.asarray(s, dtype=float)) for b, s in self.samples_s.items()}
        object.__setattr__(self, "samples_s", dict(sorted(ordered.items())))
        cold = {int(b): np.sort(np.asarray(s, dtype=float))
                for b, s in self.cold_samples_s.items() if len(s)}
        for size, arr in cold.items():
            if size not in ordered or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
                raise ProfileError(f"profile.cold_samples_s[{size}]: needs positive samples at a "
                                   "batch size that also has warm samples")
        object.__setattr__(self, "cold_samples_s", dict(sorted(cold.items())))
        load = np.sort(np.asarray(self.load_samples_s, dtype=float).ravel())
        if not np.all(np.isfinite(load)) or np.any(load <= 0):
            raise ProfileError("profile.load_samples_s: cold starts must be finite and > 0 s")
        object.__setattr__(self, "load_samples_s", load)
        sizes = np.array(list(self.samples_s), dtype=float)
        medians = np.array([float(np.median(s)) for s in self.samples_s.values()])
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_medians", medians)
        object.__setattr__(self, "_warned", set())

    # -- queries -----------------------------------------------------------------------------
    @property
    def batch_sizes(self) -> list[int]:
        """Measured batch sizes, ascending."""
        return list(self.samples_s)

    @property
    def max_batch_size(self) -> int:
        """Largest measured batch size."""
        return int(self._sizes[-1])  # type: ignore[attr-defined]

    @property
    def name(self) -> str:
        """A short label: model name and device kind."""
        device = self.device.get("name", self.device.get("kind", "?"))
        return f"{self.model.get('name', 'model')}@{device}"

    def median_s(self, batch_size: float) -> float:
        """Median service time of one batch of ``batch_size`` items, in seconds."""
        sizes: np.ndarray = self._sizes  # type: ignore[attr-defined]
        medians: np.ndarray = self._medians  # type: ignore[attr-defined]
        b = float(batch_size)
        if sizes[0] <= b <= sizes[-1]:
            return float(np.interp(b, sizes, medians))
        return self._extrapolated_median_s(b)

    def mean_s(self, batch_size: float) -> float:
        """Mean service time at ``batch_size`` in seconds (scaled from the nearest size)."""
        base, scale = self._nearest(batch_size)
        return float(np.mean(self.samples_s[base])) * scale

    def sample_s(self, batch_size: float, rng: np.random.Generator) -> float:
        """One bootstrap draw of the service time at ``batch_size``, in seconds."""
        base, scale = self._nearest(batch_size)
        samples = self.samples_s[base]
        return float(samples[int(rng.integers(samples.size))]) * scale

    def scaled_samples_s(self, batch_size: float, cold: bool = False) -> np.ndarray:
        """The sorted samples used for ``batch_size`` (nearest measured size, scaled).

        With ``cold=True`` and cold samples in the profile (measured after an idle gap, see
        ``cold_after_s``), the nearest size measured cold, scaled by the warm medians' ratio.
        """
        if cold and self.cold_samples_s:
            sizes = np.array(list(self.cold_samples_s), dtype=float)
            base = int(sizes[int(np.argmin(np.abs(sizes - float(batch_size))))])
            return self.cold_samples_s[base] * (self.median_s(batch_size) / self.median_s(base))
        base, scale = self._nearest(batch_size)
        return self.samples_s[base] * scale

    @property
    def cold_after_s(self) -> float:
        """Idle time after which a batch counts as cold (inf when no cold samples)."""
        if not self.cold_samples_s:
            return math.inf
        return float((self.meta.get("cold") or {}).get("after_ms", 10.0)) / 1e3

    def rescaled(self, ratio_by_size: dict[int, float], note: dict[str, Any] | None = None,
                 add_s: float = 0.0, cold_ratio: float | None = None) -> LatencyProfile:
        """A copy with every sample at size ``b`` (warm and cold) multiplied by a ratio, plus
        ``add_s`` seconds (a per-batch overhead outside the model call). With ``cold_ratio``
        the cold samples are multiplied by it instead (cold runs re-measured on their own).

        Ratios are given at some batch sizes (a probe's measured / profiled medians); other
        sizes take the ratio interpolated linearly in log batch size, and the nearest given
        ratio beyond the given range. ``note`` is recorded under ``meta["rescaled"]``.

        Raises:
            ProfileError: no ratios, a ratio that is not finite and > 0, or ``add_s`` < 0.
        """
        if not ratio_by_size:
            raise ProfileError("rescaled: needs at least one batch size's ratio")
        if cold_ratio is not None and not (math.isfinite(cold_ratio) and cold_ratio > 0):
            raise ProfileError(f"rescaled: cold_ratio {cold_ratio!r} must be finite and > 0")
        if not (math.isfinite(add_s) and add_s >= 0):
            raise ProfileError(f"rescaled: add_s {add_s!r} must be finite and >= 0")
        for size, ratio in ratio_by_size.items():
            if not (math.isfinite(ratio) and ratio > 0):
                raise ProfileError(f"rescaled: ratio {ratio!r} at batch size {size} must be "
                                   "finite and > 0")
        def ratio_at(size: int) -> float:
            return scale_at(ratio_by_size, size)

        meta = dict(self.meta)
        meta["rescaled"] = {**(note or {}), "add_s": add_s, "cold_ratio": cold_ratio,
                            "ratio_by_size": {
            str(b): round(ratio_at(b), 6) for b in self.samples_s}}
        return LatencyProfile(
            samples_s={b: s * ratio_at(b) + add_s for b, s in self.samples_s.items()},
            model=dict(self.model),
            cold_samples_s={b: s * (ratio_at(b) if cold_ratio is None else cold_ratio) + add_s
                            for b, s in self.cold_samples_s.items()},
            device=dict(self.device), meta=meta, extrapolate=self.extrapolate,
            load_samples_s=self.load_samples_s)

    # -- internals ---------------------------------------------------------------------------
    def _nearest(self, batch_size: float) -> tuple[int, float]:
        b = float(batch_size)
        if b in self.samples_s:
            return int(b), 1.0
        sizes: np.ndarray = self._sizes  # type: ignore[attr-defined]
        idx = int(np.argmin(np.abs(sizes - b)))
        base = int(sizes[idx])
        medians: np.ndarray = self._medians  # type: ignore[attr-defined]
        return base, self.median_s(b) / float(medians[idx])

    def _extrapolated_median_s(self, b: float) -> float:
        sizes: np.ndarray = self._sizes  # type: ignore[attr-defined]
        medians: np.ndarray = self._medians  # type: ignore[attr-defined]
        if not self.extrapolate:
            raise ProfileError(
                f"batch size {b:g} is outside the measured range "
                f"{int(sizes[0])}..{int(sizes[-1])} of profile {self.name}; measure it, lower "
                "max_batch_size, or set service.extrapolate: true"
            )
        if b not in self._warned:  # type: ignore[attr-defined]
            self._warned.add(b)  # type: ignore[attr-defined]
            _LOG.warning("profile %s: extrapolating to batch size %g", self.name, b)
        if sizes.size == 1:
            return float(medians[0] * b / sizes[0])
        i0, i1 = (0, 1) if b < sizes[0] else (-2, -1)
        slope = (medians[i1] - medians[i0]) / (sizes[i1] - sizes[i0])
        value = float(medians[i1] + slope * (b - sizes[i1]))
        floor = float(medians[0]) * 0.05
        return max(value, floor)

    # -- files -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form of the profile (schema ``SCHEMA_VERSION``)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "device": self.device,
            **self.meta,
            "batch_sizes": self.batch_sizes,
            "samples_s": {str(b): [round(float(x), 9) for x in s]
                          for b, s in self.samples_s.items()},
            **({"cold_samples_s": {str(b): [round(float(x), 9) for x in s]
                                   for b, s in self.cold_samples_s.items()}}
               if self.cold_samples_s else {}),
            **({"load_samples_s": [round(float(x), 6) for x in self.load_samples_s]}
               if self.load_samples_s.size else {}),
        }

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON to ``path`` and return it."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "profile", extrapolate: bool = False
                  ) -> LatencyProfile:
        """Build a profile from its JSON form; errors name the offending field."""
        if not isinstance(data, dict):
            raise ProfileError(f"{source}: top level must be a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ProfileError(
                f"{source}: schema_version is {version!r}; this servelab reads {SCHEMA_VERSION}"
            )
        raw = data.get("samples_s")
        if not isinstance(raw, dict) or not raw:
            raise ProfileError(f"{source}: samples_s must map batch sizes to lists of seconds")
        samples: dict[int, np.ndarray] = {}
        for key, values in raw.items():
            try:
                size = int(key)
            except (TypeError, ValueError):
                raise ProfileError(f"{source}: samples_s key {key!r} is not a batch size") from None
            if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
                raise ProfileError(f"{source}: samples_s[{key}] must be a list of numbers")
            samples[size] = np.asarray(values, dtype=float)
        listed = data.get("batch_sizes")
        if listed is not None and sorted(int(b) for b in listed) != sorted(samples):
            missing = sorted({int(b) for b in listed} - set(samples))
            raise ProfileError(f"{source}: batch_sizes {missing} listed but have no samples_s")
        cold_raw = data.get("cold_samples_s") or {}
        if not isinstance(cold_raw, dict):
            raise ProfileError(f"{source}: cold_samples_s must map batch sizes to lists")
        cold: dict[int, np.ndarray] = {}
        for key, values in cold_raw.items():
            if not str(key).isdigit() or not isinstance(values, list):
                raise ProfileError(f"{source}: cold_samples_s[{key!r}] must be a list of seconds")
            cold[int(key)] = np.asarray(values, dtype=float)
        load_raw = data.get("load_samples_s") or []
        if not isinstance(load_raw, list) or not all(isinstance(v, int | float)
                                                     for v in load_raw):
            raise ProfileError(f"{source}: load_samples_s must be a list of seconds")
        meta = {k: v for k, v in data.items()
                if k not in {"schema_version", "model", "device", "batch_sizes", "samples_s",
                             "cold_samples_s", "load_samples_s"}}
        try:
            return cls(samples_s=samples, model=dict(data.get("model") or {}),
                       cold_samples_s=cold, device=dict(data.get("device") or {}), meta=meta,
                       extrapolate=extrapolate,
                       load_samples_s=np.asarray(load_raw, dtype=float))
        except ProfileError as exc:
            raise ProfileError(f"{source}: {exc}") from None


Scale = float | Mapping[int, float]
"""A speed scale: one number, or one per size (batch size, step size) where it was measured."""


def scale_at(scale: Scale, size: int) -> float:
    """A speed scale at a step size: the number itself, or interpolated (in log size,
    clamped at the ends) between the sizes a probe measured.
    """
    if not isinstance(scale, Mapping):
        return float(scale)
    keys = sorted(scale)
    return float(np.interp(math.log(max(size, 1)), np.log(keys), [scale[k] for k in keys]))


def builtin_profiles() -> list[str]:
    """Names of the request-level profiles shipped with servelab (usable as
    ``builtin:NAME``; LLM step profiles, ``llm-*``, are listed by
    :func:`calibration.step_profile.builtin_step_profiles`).
    """
    return shipped(PROFILES, lambda name: not name.startswith("llm-"))


def read_profile_json(ref: str | Path, names: list[str], what: str,
                      error: type[UserError]) -> Any:
    """The JSON of a shipped profile (``builtin:NAME``, one of ``names``) or of a file.

    Raises:
        ``error``: naming ``service.path``: an unknown builtin, a missing file, or bad JSON.
    """
    text_ref = str(ref)
    name = builtin_name(text_ref)
    if name is not None:
        text = read_shipped(PROFILES, name, names, lambda available: error(
            f"service.path: unknown builtin {what} {name!r}; available: {available}"))
    else:
        path = Path(text_ref)
        if not path.is_file():
            raise error(f"service.path: {what} file {text_ref!r} not found")
        text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"service.path: {text_ref!r} is not valid JSON ({exc.msg}, "
                    f"line {exc.lineno})") from None


def load_profile(ref: str | Path, *, extrapolate: bool = False) -> LatencyProfile:
    """Load a profile from a path or a ``builtin:NAME`` reference.

    Raises:
        ProfileError: the file is missing, is not JSON, or is not a valid profile.
    """
    data = read_profile_json(ref, builtin_profiles(), "profile", ProfileError)
    return LatencyProfile.from_dict(data, source=str(ref), extrapolate=extrapolate)


def profile_summary(profile: LatencyProfile) -> list[dict[str, float]]:
    """Robust per-size summary rows: median, p5, p95, p99 (ms) and CV."""
    rows = []
    for size, samples in profile.samples_s.items():
        mean = float(np.mean(samples))
        rows.append({
            "batch_size": size,
            "n": int(samples.size),
            "median_ms": float(np.median(samples)) * 1e3,
            "p5_ms": float(np.quantile(samples, 0.05)) * 1e3,
            "p95_ms": float(np.quantile(samples, 0.95)) * 1e3,
            "p99_ms": float(np.quantile(samples, 0.99)) * 1e3,
            "cv": float(np.std(samples) / mean) if mean > 0 else math.nan,
            # standard error of the median (normal approximation): how precise the median is
            "se_median_pct": float(1.2533 * np.std(samples, ddof=1) / math.sqrt(samples.size)
                                   / np.median(samples) * 100) if samples.size > 1 else math.nan,
        })
    return rows
