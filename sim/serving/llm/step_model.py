"""What one engine step computes (its composition), the input of every step-time model
(:mod:`sim.scenario.step_time`).

A step's composition is what the device computes: ``prefill_tokens`` (prompt chunks and
recomputation), ``decode_seqs`` (sequences computing one token; static batching's padding
rows included), ``kv_tokens`` (the context the decodes attend to) and ``prefill_context``
(Σ over prefill chunks of tokens × the chunk's start position: a later chunk of a long prompt
also attends to the prefix already in the cache).
"""

from __future__ import annotations

from dataclasses import dataclass

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
