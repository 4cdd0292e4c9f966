"""Step-time models: how long one engine step takes, from its composition
(:class:`sim.serving.llm.step_model.Composition`). The LLM counterpart of
:mod:`sim.scenario.service`: a hand-set linear model, a measured step profile, or the roofline model
(:mod:`sim.scenario.roofline`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from calibration.step_profile import StepProfile
from sim.serving.llm.step_model import Composition


@dataclass(frozen=True)
class LinearStepModel:
    """``base + per_prefill_token × prefill + per_decode_seq × decodes + per_kv_token × kv
    + per_prefill_context × prefill_context + per_prefill_sq × prefill_sq
    + per_prefill_seq × prefill chunks`` (milliseconds; BLIS-style coefficients),
    deterministic: hand-checkable cases.

    The last three price a prefill chunk's attention and its fixed cost: ``prefill_context``
    (Σ chunk tokens × start) is its attention to the prefix already in the cache, which a
    prefix-cache hit makes large; ``prefill_sq`` (Σ chunk tokens²) its causal attention within
    itself (``n²/2`` query-key pairs: ``per_prefill_sq = per_prefill_context / 2`` when both
    come from one per-pair cost). Without the square term a per-token cost fitted on fresh
    prompts carries their attention, and a short chunk after a long cached prefix pays for
    attention twice (measured on vLLM's CPU build: +17% to +70%,
    ``benchmarks/results/prefix_prefill_grid-diag.md``).
    """

    base_ms: float
    per_prefill_token_ms: float = 0.0
    per_decode_seq_ms: float = 0.0
    per_kv_token_ms: float = 0.0
    per_prefill_context_ms: float = 0.0
    per_prefill_sq_ms: float = 0.0
    per_prefill_seq_ms: float = 0.0

    def step_s(self, comp: Composition) -> float:
        """Seconds one step of this composition takes."""
        ms = (self.base_ms + self.per_prefill_token_ms * comp.prefill_tokens
              + self.per_decode_seq_ms * comp.decode_seqs
              + self.per_kv_token_ms * comp.kv_tokens)
        # (golden outputs: no term where its cost is 0, not even + 0.0)
        if self.per_prefill_context_ms:
            ms += self.per_prefill_context_ms * comp.prefill_context
        if self.per_prefill_sq_ms:
            ms += self.per_prefill_sq_ms * comp.prefill_sq
        if self.per_prefill_seq_ms:
            ms += self.per_prefill_seq_ms * comp.prefill_seqs
        return ms / 1e3


class ProfileStepModel:
    """A measured step profile (:class:`calibration.step_profile.StepProfile`): interpolated
    medians inside its grid, its linear fit outside (counted in :attr:`extrapolated`).
    """

    def __init__(self, profile: StepProfile, source: str = "") -> None:
        self.profile = profile
        self.source = source
        self.extrapolated = 0

    def __repr__(self) -> str:
        return f"ProfileStepModel({self.source!r})"

    def step_s(self, comp: Composition) -> float:
        """Seconds one step of this composition takes."""
        p, d, kv = comp.prefill_tokens, comp.decode_seqs, comp.kv_tokens
        ctx = kv / d if d else 0.0
        if not self.profile.inside(p, d, ctx if d else self.profile.context_tokens[0]):
            self.extrapolated += 1
        return self.profile.step_s(p, d, kv, comp.prefill_context)


class StepModel(Protocol):
    """What the engines need of a step-time model (linear, measured profile, roofline)."""

    def step_s(self, comp: Composition) -> float:
        """Seconds one step of this composition takes."""
        ...


class ReplayStepModel:
    """Measured step times handed out in the order the steps start: a live run's own steps
    fed back into the simulator (see :class:`sim.scenario.service.ReplayService`).

    Args:
        durations_s: One time per step, in start order (for a live run: from each step's
            start to the next step's start while the engine stays busy, so the simulated
            clock keeps the live one's pace, engine overhead between steps included).
        model: Times the steps past the measured ones.
    """

    def __init__(self, durations_s: list[float] | np.ndarray, model: StepModel) -> None:
        values = [float(v) for v in durations_s]
        for i, v in enumerate(values):
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"durations_s[{i}]: must be a finite time >= 0, got {v!r}")
        self.durations_s = values
        self.model = model
        self.replayed = 0  # steps given a measured time so far

    def __repr__(self) -> str:
        return f"ReplayStepModel(steps={len(self.durations_s)}, model={self.model!r})"

    def step_s(self, comp: Composition) -> float:
        """The next measured time; past the last one, the model's."""
        if self.replayed < len(self.durations_s):
            self.replayed += 1
            return self.durations_s[self.replayed - 1]
        return self.model.step_s(comp)
