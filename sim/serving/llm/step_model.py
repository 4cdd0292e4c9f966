"""Step-time models: how long one engine step takes, from its composition.

A step's composition is what the device computes: ``prefill_tokens`` (prompt chunks and
recomputation), ``decode_seqs`` (sequences computing one token; static batching's padding
rows included), ``kv_tokens`` (the context the decodes attend to) and ``prefill_context``
(Σ over prefill chunks of tokens × the chunk's start position: a later chunk of a long prompt
also attends to the prefix already in the cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from calibration.step_profile import StepProfile
from sim.serving.llm.schedulers import StepPlan


@dataclass(frozen=True)
class Composition:
    """What one step computes."""

    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    prefill_context: int = 0  # Σ chunk tokens × the chunk's start: its attention to the prefix
    prefill_seqs: int = 0  # prefill chunks (sequences) in the step
    prefill_sq: int = 0  # Σ chunk tokens²: causal attention within each chunk

    @property
    def batched_tokens(self) -> int:
        """Tokens computed in the step (prefill tokens + one per decode)."""
        return self.prefill_tokens + self.decode_seqs


def composition(plan: StepPlan) -> Composition:
    """The composition of a plan (before the step advances its sequences)."""
    prefill = decode = kv = context = chunks = square = 0
    for seq, n in plan.entries:
        if n == 1 and seq.decoding:
            decode += 1
            kv += seq.computed
        else:
            prefill += n
            context += n * seq.computed
            chunks += 1
            square += n * n
    return Composition(prefill, decode + plan.padding_seqs, kv + plan.padding_kv_tokens,
                       context, chunks, square)


@dataclass(frozen=True)
class LinearStepModel:
    """``base + per_prefill_token × prefill + per_decode_seq × decodes + per_kv_token × kv``
    (milliseconds; BLIS-style coefficients), deterministic: hand-checkable cases.
    """

    base_ms: float
    per_prefill_token_ms: float = 0.0
    per_decode_seq_ms: float = 0.0
    per_kv_token_ms: float = 0.0

    def step_s(self, comp: Composition) -> float:
        """Seconds one step of this composition takes."""
        return (self.base_ms + self.per_prefill_token_ms * comp.prefill_tokens
                + self.per_decode_seq_ms * comp.decode_seqs
                + self.per_kv_token_ms * comp.kv_tokens) / 1e3


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
