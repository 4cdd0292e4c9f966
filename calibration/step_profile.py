"""Step-time profiles of an LLM decoder: one engine step's time over its composition.

A profile holds, for each point of a grid of (prefill tokens P, decode sequences D, context
per decode L), every timed sample of one step with that composition, and a fitted linear
model ``a + b·P + c·D + d·K`` (K = D·L, the KV tokens the decodes attend to; BLIS-style
coefficients) for reporting and for extrapolation from the grid's edge, which is flagged as
such.
:class:`StepProfile` predicts other compositions by trilinear interpolation of the medians on
the grid. This module has no torch import: the simulator loads profiles without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calibration.profile import Scale, scale_at
from sim.builtin import PROFILES, shipped
from sim.errors import UserError

SCHEMA_VERSION = 1


class StepProfileError(UserError):
    """A step profile cannot be read or used."""


def _axis_weights(axis: np.ndarray, value: float) -> tuple[int, int, float]:
    """Neighbouring indices on ``axis`` and the weight of the upper one (clamped)."""
    if value <= axis[0]:
        return 0, 0, 0.0
    if value >= axis[-1]:
        last = axis.size - 1
        return last, last, 0.0
    hi = int(np.searchsorted(axis, value))
    lo = hi - 1
    return lo, hi, float((value - axis[lo]) / (axis[hi] - axis[lo]))


@dataclass
class StepProfile:
    """Measured step times on a (P, D, L) grid, with the fitted linear model.

    Attributes:
        prefill_tokens: Grid of P (ascending, starting at 0).
        decode_seqs: Grid of D (ascending, starting at 0).
        context_tokens: Grid of L (ascending).
        samples_s: ``"P,D,L"`` -> every timed sample (seconds); D = 0 points are stored once
            at the first L.
        fit: The linear model's coefficients (ms) and R²; with ``prefill_context_s``
            also ``e_ms_per_prefill_context`` (ms per chunk token × start position).
        meta: Model, device, dtype, threads, method, versions.
        prefill_context_s: ``"n,start"`` -> samples of one prefill chunk of ``n`` tokens
            starting at ``start`` (its attention to the cached prefix); the extra time over
            ``start`` = 0 fits ``e × n × start``.
    """

    prefill_tokens: list[int]
    decode_seqs: list[int]
    context_tokens: list[int]
    samples_s: dict[str, list[float]]
    fit: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    prefill_context_s: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._p = np.asarray(self.prefill_tokens, float)
        self._d = np.asarray(self.decode_seqs, float)
        self._l = np.asarray(self.context_tokens, float)
        grid = np.full((self._p.size, self._d.size, self._l.size), np.nan)
        for key, values in self.samples_s.items():
            p, d, ctx = (int(v) for v in key.split(","))
            i, j = self.prefill_tokens.index(p), self.decode_seqs.index(d)
            median = float(np.median(values))
            if d == 0:
                grid[i, j, :] = median
            else:
                grid[i, j, self.context_tokens.index(ctx)] = median
        if self._p.size >= 3 and np.isnan(grid[0, 0, 0]):
            # an empty step never runs: extend the prefill-only line to P = 0 so that short
            # prefill-only steps interpolate between measured neighbours
            g1, g2 = grid[1, 0, 0], grid[2, 0, 0]
            slope = (g2 - g1) / (self._p[2] - self._p[1])
            grid[0, 0, :] = max(g1 - slope * self._p[1], 0.5 * g1)
        self._grid = grid
        if not self.fit:
            self.fit = fit_linear(self.samples_s)
        if self.prefill_context_s and "e_ms_per_prefill_context" not in self.fit:
            self.fit["e_ms_per_prefill_context"] = fit_prefill_context(self.prefill_context_s)

    @staticmethod
    def key(p: int, d: int, ctx: int) -> str:
        """The samples key of a grid point."""
        return f"{p},{d},{ctx}"

    def inside(self, p: float, d: float, ctx: float) -> bool:
        """Whether a composition lies within the measured grid (contexts shorter than the
        grid's shortest count as that one: attention over them costs no more).
        """
        return p <= self._p[-1] and d <= self._d[-1] and (d == 0 or ctx <= self._l[-1])

    def step_s(self, p: float, d: float, kv_tokens: float,
               prefill_context: float = 0.0) -> float:
        """Predicted seconds of a step with ``p`` prefill tokens and ``d`` decodes attending
        to ``kv_tokens`` in all: trilinear interpolation inside the grid, the linear model
        outside it; plus the prefill chunks' attention to their cached prefix
        (``prefill_context`` = Σ tokens × start) where the profile measured it.
        """
        extra = self.fit.get("e_ms_per_prefill_context", 0.0) * prefill_context / 1e3
        ctx = kv_tokens / d if d else float(self._l[0])
        if not self.inside(p, d, ctx):
            return self.extended_s(p, d, kv_tokens) + extra
        return self._grid_s(p, d, ctx) + extra

    def extended_s(self, p: float, d: float, kv_tokens: float) -> float:
        """Seconds of a step outside the grid: the grid's value at the nearest point inside
        (P, D and the context clamped to the grid) plus the fitted linear model's slopes
        (each at least 0) times how far the step lies beyond it. Continuous at the grid's
        edge and never below it; the linear model alone (its intercept pulled negative by
        curved prefill times) priced a long-context decode below the grid's own value, down
        to 0 for one sequence past the probes' longest context.
        """
        f = self.fit
        pc, dc = min(p, float(self._p[-1])), min(d, float(self._d[-1]))
        ctx = kv_tokens / d if d else float(self._l[0])
        ctx_c = min(max(ctx, float(self._l[0])), float(self._l[-1]))
        kv_c = dc * ctx_c if d else 0.0
        beyond_ms = (max(f["b_ms_per_prefill_token"], 0.0) * (p - pc)
                     + max(f["c_ms_per_decode_seq"], 0.0) * (d - dc)
                     + max(f["d_ms_per_kv_token"], 0.0) * max(kv_tokens - kv_c, 0.0))
        return self._grid_s(pc, dc, ctx_c) + beyond_ms / 1e3

    def _grid_s(self, p: float, d: float, ctx: float) -> float:
        """Trilinear interpolation of the medians at a point inside the grid."""
        ctx = min(max(ctx, self._l[0]), self._l[-1])
        (i0, i1, wi), (j0, j1, wj), (k0, k1, wk) = (
            _axis_weights(self._p, p), _axis_weights(self._d, d), _axis_weights(self._l, ctx))
        g = self._grid
        total = 0.0
        for i, a in ((i0, 1 - wi), (i1, wi)):
            for j, b in ((j0, 1 - wj), (j1, wj)):
                for k, c in ((k0, 1 - wk), (k1, wk)):
                    w = a * b * c
                    if w:
                        total += w * g[i, j, k]
        return float(total)

    def linear_s(self, p: float, d: float, kv_tokens: float) -> float:
        """The fitted linear model's seconds (for extrapolation)."""
        f = self.fit
        return max(0.0, (f["a_ms"] + f["b_ms_per_prefill_token"] * p + f["c_ms_per_decode_seq"]
                         * d + f["d_ms_per_kv_token"] * kv_tokens) / 1e3)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"schema_version": SCHEMA_VERSION, "kind": "llm_step_profile",
                "prefill_tokens": self.prefill_tokens, "decode_seqs": self.decode_seqs,
                "context_tokens": self.context_tokens, "samples_s": self.samples_s,
                "fit": self.fit, "meta": self.meta,
                "prefill_context_s": self.prefill_context_s}

    def rescaled(self, prefill_scale: Scale, decode_scale: Scale) -> StepProfile:
        """The profile with each grid point's samples scaled by its prefill share (from the fitted
        linear model) times the prefill scale plus the rest times the decode scale.

        A scale is one number, or a mapping from step size (prefill tokens; decoding sequences)
        to the scale measured there: the device's drift need not touch a one-sequence decode and
        a sixteen-sequence one alike (on this CPU they differ by up to 25%).
        """
        fit = self.fit
        samples = {}
        for key, values in self.samples_s.items():
            p, d, ctx = (int(v) for v in key.split(","))
            prefill = fit["b_ms_per_prefill_token"] * p
            total = fit["a_ms"] + prefill + fit["c_ms_per_decode_seq"] * d \
                + fit["d_ms_per_kv_token"] * d * ctx
            share = min(max(prefill / total, 0.0), 1.0) if total > 0 else 0.0
            factor = share * scale_at(prefill_scale, p) + (1 - share) * scale_at(decode_scale, d)
            samples[key] = [v * factor for v in values]

        def plain(scale: Scale) -> Any:
            return {str(k): v for k, v in scale.items()} if isinstance(scale, Mapping) else scale

        meta = {**self.meta, "rescaled": {"prefill_scale": plain(prefill_scale),
                                          "decode_scale": plain(decode_scale)}}
        context = {k: [v * scale_at(prefill_scale, int(k.split(",")[0])) for v in values]
                   for k, values in self.prefill_context_s.items()}
        return StepProfile(self.prefill_tokens, self.decode_seqs, self.context_tokens,
                           samples, meta=meta, prefill_context_s=context)

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return out


def fit_linear(samples_s: dict[str, list[float]]) -> dict[str, float]:
    """Least squares of the medians (ms) on ``1, P, D, K = D·L``, with R²."""
    rows, ys = [], []
    for key, values in samples_s.items():
        p, d, ctx = (int(v) for v in key.split(","))
        rows.append([1.0, p, d, d * ctx])
        ys.append(float(np.median(values)) * 1e3)
    x, y = np.asarray(rows), np.asarray(ys)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    sst = float(np.sum((y - y.mean()) ** 2)) or 1e-30
    return {"a_ms": float(coef[0]), "b_ms_per_prefill_token": float(coef[1]),
            "c_ms_per_decode_seq": float(coef[2]), "d_ms_per_kv_token": float(coef[3]),
            "r2": 1 - float(np.sum((y - pred) ** 2)) / sst}


def fit_prefill_context(samples_s: dict[str, list[float]]) -> float:
    """``e`` (ms per chunk token × start) from chunks timed at several starts: least squares
    through the origin of (median − the same chunk's median at start 0) on ``n × start``.
    """
    medians = {tuple(int(v) for v in k.split(",")): float(np.median(v)) * 1e3
               for k, v in samples_s.items()}
    xs, ys = [], []
    for (n, start), t in medians.items():
        if start and (n, 0) in medians:
            xs.append(n * start)
            ys.append(t - medians[(n, 0)])
    if not xs:
        return 0.0
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    return max(0.0, float(np.sum(x * y) / np.sum(x * x)))


def builtin_step_profiles() -> list[str]:
    """Names of the shipped step profiles."""
    return shipped(PROFILES, lambda name: name.startswith("llm-"))


def load_step_profile(ref: str | Path) -> StepProfile:
    """Load a step profile from a path or ``builtin:NAME``.

    Raises:
        StepProfileError: missing file, bad JSON or fields (named).
    """
    from calibration.profile import read_profile_json

    text = str(ref)
    data = read_profile_json(ref, builtin_step_profiles(), "step profile", StepProfileError)
    if not isinstance(data, dict) or data.get("kind") != "llm_step_profile":
        raise StepProfileError(f"service.path: {text!r} is not an LLM step profile (kind "
                               "'llm_step_profile'; request-level profiles go with "
                               "service.kind 'profile')")
    try:
        profile = StepProfile(
            prefill_tokens=[int(v) for v in data["prefill_tokens"]],
            decode_seqs=[int(v) for v in data["decode_seqs"]],
            context_tokens=[int(v) for v in data["context_tokens"]],
            samples_s={str(k): [float(x) for x in v] for k, v in data["samples_s"].items()},
            fit=dict(data.get("fit") or {}), meta=dict(data.get("meta") or {}),
            prefill_context_s={str(k): [float(x) for x in v]
                               for k, v in (data.get("prefill_context_s") or {}).items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise StepProfileError(f"service.path: {text!r}: bad or missing field ({exc})") \
            from None
    if not (profile.prefill_tokens[0] == 0 and profile.decode_seqs[0] == 0):
        raise StepProfileError(f"service.path: {text!r}: the grid must start at 0 prefill "
                               "tokens and 0 decodes")
    if np.isnan(profile._grid).any():
        raise StepProfileError(f"service.path: {text!r}: the grid has unmeasured points")
    return profile


def relative_errors(predicted_s: np.ndarray, measured_s: np.ndarray) -> dict[str, float]:
    """Median and p90 of |predicted − measured| / measured."""
    err = np.abs(predicted_s - measured_s) / measured_s
    return {"median": float(np.median(err)), "p90": float(np.percentile(err, 90)),
            "max": float(err.max()), "n": int(err.size)}


__all__ = ["StepProfile", "StepProfileError", "builtin_step_profiles", "fit_linear",
           "load_step_profile", "relative_errors"]
