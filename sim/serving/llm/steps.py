"""The records of the LLM core's loop: what a driver runs and reports back, what each call of
:meth:`sim.serving.llm.core.LlmCore.step` returns, the per-step log, and the error a step
that breaks a limit raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from sim.serving.llm.schedulers import StepPlan
from sim.serving.llm.step_model import Composition

__all__ = ["LlmActions", "StepDone", "StepInvariantError", "StepLog", "StepStart"]


class StepInvariantError(RuntimeError):
    """A step broke a limit (sequences, token budget, KV blocks) or a token was lost or
    produced twice: a bug in a scheduler or the core.
    """


@dataclass
class StepLog:
    """Per-step columns (lists, converted to a table at the end)."""

    replica: list[int] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    prefill_context: list[int] = field(default_factory=list)
    decode_seqs: list[int] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)
    num_seqs: list[int] = field(default_factory=list)
    kv_blocks_used: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)


class StepStart(NamedTuple):
    """A step to run now on ``replica``: what the scheduler planned and what it computes."""

    replica: int
    plan: StepPlan
    comp: Composition


class StepDone(NamedTuple):
    """A step that ended: it ran on ``replica`` from ``start_s`` to ``end_s``; ``error``: it
    raised (its requests fail with that reason).
    """

    replica: int
    plan: StepPlan
    comp: Composition
    start_s: float
    end_s: float
    error: str | None = None


class LlmActions(NamedTuple):
    """What a driver does after :meth:`LlmCore.step`.

    Attributes:
        start: Steps to run now, one per engine at most, in replica order.
        wake_s: Call :meth:`LlmCore.step` again at this time if no step ends and no engine
            loads first (the next arrival, a scheduler's timer, the autoscaler's next control
            period; inf: never).
        launch: Engines to start (autoscaling): load the model, then report them ready.
        stop: Engines that finished their work after being retired: free the model.
        cancel: Launches to drop (a scale-down while they load): never report them ready,
            free what they loaded. A driver applies ``cancel``, then ``stop``, then
            ``launch`` (as :class:`sim.serving.core.CoreActions`).
    """

    start: list[StepStart]
    wake_s: float
    launch: tuple[int, ...] = ()
    stop: tuple[int, ...] = ()
    cancel: tuple[int, ...] = ()
