"""How long ``servelab calibrate --model llm`` will take, estimated before it starts.

Three pilot steps are timed (one decode at the shortest context, a prefill of at most 256
tokens, the most decodes at the longest context), once each after one untimed run, so the
pilot stays short next to the run it estimates; every step to measure is then costed by a
model linear in prefill tokens and in attended KV tokens, and the sum over its warm-up and
timed runs is the estimate. It is rough (± a factor of two where the grid bends), but it
says "42 minutes" before the 42 minutes start rather than after.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from calibration.step_measure import CONTEXT_CHUNKS, CONTEXT_STARTS, Grid, entries_for


@dataclass(frozen=True)
class Plan:
    """The estimate.

    Attributes:
        steps: Steps to run (warm-up and timed, grid, prefix chunks and held-out).
        estimate_s: Their estimated total time (s).
        pilot_s: What the pilot itself took (s).
    """

    steps: int
    estimate_s: float
    pilot_s: float


def plan(step: Callable[[Any], Any], grid: Grid, *, max_len: int, held_out: int, reps: int,
         warmup: int, timer: Callable[[Callable[[], Any]], float]) -> Plan:
    """Estimate the calibration's time by timing three pilot steps.

    Args:
        step: Runs one step from :func:`calibration.step_measure.entries_for` entries.
        grid: The grid to measure.
        max_len: The KV cache's tokens per sequence (bounds the prefix chunks).
        held_out: Held-out steps to measure as well (costed as an average grid step).
        reps: Timed runs per step.
        warmup: Untimed runs per step.
        timer: Times one call (device synchronised).
    """
    started = time.perf_counter()
    p_max, d_max, l_min, l_max = (grid.prefill_tokens[-1], grid.decode_seqs[-1],
                                  grid.context_tokens[0], grid.context_tokens[-1])

    def pilot(p: int, d: int, ctx: int) -> float:
        entries = entries_for(p, d, ctx)
        step(entries)  # warm
        return timer(lambda: step(entries))

    base_s = pilot(0, 1, l_min)
    p_pilot = max([p for p in grid.prefill_tokens if 0 < p <= 256] or [p_max])
    per_prefill_s = max(0.0, pilot(p_pilot, 0, l_min) - base_s) / p_pilot
    per_kv_s = max(0.0, pilot(0, d_max, l_max) - base_s) / (d_max * l_max)

    def cost(p: int, d: int, ctx: int) -> float:
        return base_s + per_prefill_s * p + per_kv_s * d * ctx

    points: Sequence[tuple[int, int, int]] = grid.points()
    chunks = [(n, 0, l_min) for n in CONTEXT_CHUNKS for s in CONTEXT_STARTS if s + n <= max_len]
    costs = [cost(*pt) for pt in [*points, *chunks]]
    mean_s = sum(costs) / len(costs)
    total = (sum(costs) + held_out * mean_s) * (reps + warmup)
    steps = (len(costs) + held_out) * (reps + warmup)
    return Plan(steps, total, time.perf_counter() - started)


def duration(seconds: float) -> str:
    """``95`` -> ``1 min 35 s``; ``4000`` -> ``1 h 7 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{int(minutes)} min {int(seconds % 60)} s"
    return f"{int(minutes // 60)} h {int(minutes % 60)} min"
