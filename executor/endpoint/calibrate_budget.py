"""Keeping ``calibrate --endpoint``'s time budget while it probes
(:mod:`executor.endpoint.calibrate`).

The plan is sized once, from a first look at the server's speed (one long prefill's TTFT,
one stream's ITL); on a loaded machine the larger decode batches and the extras can take far
longer than that look predicts. So every probe step is timed, and before each one the time
the rest of the plan takes is re-estimated: each remaining step's planned estimate times the
ratio of measured to estimated time of the steps done so far of its kind (else of its family:
prefills, with the chunked and cached-prefix probes, which take the longest prefill point's
ratio, whose estimate is the first look's own measurement; decodes, with the mixed check;
else 1).
Where the rest would end past the budget, work is shed in this order, one piece at a time,
until it fits:

1. cached-prefix cells, the dearest first (all of them once too few would be left to fit);
2. the chunked-prefill probe;
3. the mixed step check;
4. the small batches' extra samples, down to none, then repetitions, down to ``MIN_REPS``;
5. the decode cells of the largest batch size still to probe, while three sizes or more
   remain (the grid stays rectangular: a size goes at every context).

No step starts once the budget is spent: the probing then stops and writes the points
measured, as a stop signal does (``meta.partial.stopped_by`` ``"budget"``). So the wall time
is at most the budget plus the last step's time plus the fit's (``meta.budget``: every
step's start, estimate and time, what was shed and why).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from executor.endpoint import prefix_probe
from executor.endpoint.calibrate_plan import (
    MIN_REPS,
    chunked_s,
    decode_cell_s,
    mixed_s,
    prefill_point_s,
)
from executor.endpoint.probes import ProbingStopped

# what goes first when the rest of the plan would overrun the budget (shed_one)
SHED_ORDER = ("cached_cells", "chunked_probe", "mixed_check", "small_batch_reps", "reps",
              "decode_size")
FAMILY = {"prefill": "prefill", "chunked": "prefill", "cached": "prefill",
          "decode": "decode", "mixed": "decode"}


@dataclass
class Speeds:
    """What the first look measured: the estimates' inputs."""

    ttft_s: float  # the longest prefill point's TTFT
    itl_s: float  # one stream's ITL
    long_tokens: int  # the longest prefill point's prompt


@dataclass
class Rest:
    """The plan still to run (the probe loops take their steps from it)."""

    prefill: list[int]
    decode: list[tuple[int, int]]  # (prompt tokens, sequences), in probe order
    reps: int
    small: int
    chunked: list[int]  # [chunk tokens, chunks]; empty: none (or shed)
    cells: list[list[int]]  # cached-prefix cells [new, cached] still to probe
    mixed: bool
    cells_done: list[list[int]] = field(default_factory=list)


def step_estimate_s(kind: str, rest: Rest, speeds: Speeds, arg: Any = None) -> float:
    """The planned seconds of one step of ``kind`` (``arg``: its prompt tokens, its
    ``(prompt, sequences)`` cell or its ``[new, cached]`` cell).
    """
    if kind == "prefill":
        return prefill_point_s(int(arg), rest.reps, speeds.ttft_s, speeds.itl_s,
                               speeds.long_tokens)
    if kind == "decode":
        prompt, seqs = arg
        return decode_cell_s(seqs, prompt, rest.reps, speeds.ttft_s, speeds.itl_s,
                             speeds.long_tokens, rest.small)
    if kind == "chunked":
        return chunked_s(rest.chunked, rest.reps, speeds.ttft_s)
    if kind == "cached":
        return prefix_probe.estimate_s([arg], rest.reps, speeds.ttft_s / speeds.long_tokens)
    return mixed_s(speeds.itl_s)


def rest_steps(rest: Rest) -> list[tuple[str, Any]]:
    """Every step still to run, as ``(kind, arg)``."""
    return ([("prefill", p) for p in rest.prefill] + [("decode", c) for c in rest.decode]
            + ([("chunked", None)] if rest.chunked else [])
            + [("cached", c) for c in rest.cells] + ([("mixed", None)] if rest.mixed else []))


def fittable(cells: list[list[int]]) -> bool:
    """Whether the cached-prefix fit has what it needs: two fresh lengths and a cached
    prefix (:func:`prefix_probe.trimmed`'s rule).
    """
    return len({n for n, k in cells if k == 0}) >= 2 and any(k for _, k in cells)


def shed_one(rest: Rest, decode_seqs: list[int]) -> tuple[str, str] | None:
    """Shed the next piece of work in the stated order (``decode_seqs``: the grid's sizes,
    shortened in place when a size goes); its kind (one of :data:`SHED_ORDER`) and what it
    was, or None when nothing is left to shed.
    """
    if rest.cells:
        dearest = max(rest.cells, key=lambda c: c[1] + 2 * c[0])
        left = [c for c in rest.cells if c != dearest]
        if fittable(rest.cells_done + left):
            rest.cells = left
            return "cached_cells", f"cached-prefix cell {dearest}"
        gone, rest.cells = rest.cells, []
        return "cached_cells", f"cached-prefix cells {gone}"
    if rest.chunked:
        rest.chunked = []
        return "chunked_probe", "the chunked-prefill probe"
    if rest.mixed:
        rest.mixed = False
        return "mixed_check", "the mixed step check"
    if rest.small > 1:
        rest.small -= 1
        return "small_batch_reps", f"samples of 1-4 sequences to {rest.small} × --reps"
    if rest.reps > MIN_REPS:
        rest.reps -= 1
        return "reps", f"repetitions to {rest.reps}"
    sizes = {d for _, d in rest.decode} - {decode_seqs[0]}
    if len(decode_seqs) > 2 and sizes:
        size = max(sizes)
        decode_seqs.remove(size)
        rest.decode = [c for c in rest.decode if c[1] != size]
        return "decode_size", f"decode cells of {size} sequences"
    return None


def probing_end_s(record: dict[str, Any]) -> float:
    """Seconds from the calibration's start to the end of the last step ``record`` (a
    :attr:`Keeper.record`) holds.
    """
    steps = record["steps"]
    return float(steps[-1]["start_s"] + steps[-1]["took_s"]) if steps else 0.0


class Keeper:
    """Times the probe steps and sheds work so that the rest fits the budget."""

    def __init__(self, budget_s: float, t_start: float, speeds: Speeds,
                 say: Callable[[str], None]) -> None:
        self.budget_s, self.t_start, self.speeds, self.say = budget_s, t_start, speeds, say
        # meta.budget: shared with the caller's meta, so a stopped run keeps it too
        self.record: dict[str, Any] = {"budget_s": budget_s, "steps": [], "shed": []}

    def elapsed_s(self) -> float:
        """Seconds since the calibration began."""
        return time.perf_counter() - self.t_start

    def ratio(self, kind: str) -> float:
        """Measured over estimated seconds of the steps done of ``kind`` (else of its
        family, else 1).
        """
        steps: list[dict[str, Any]] = self.record["steps"]
        if FAMILY[kind] == "prefill":
            # a prefill point's estimate leaves out the fixed part of a TTFT (the request's
            # path, one step), so short prompts read several times their estimate on an idle
            # server; only the longest point's estimate is the first look itself, and its
            # ratio is how far the server's speed moved since (the points run shortest
            # first, so until the longest, the longest done so far)
            longest = max((s["tokens"] for s in steps if s["kind"] == "prefill"), default=0)
            steps = [s for s in steps if s["kind"] != "prefill" or s["tokens"] == longest]
        for same in (lambda k: k == kind, lambda k: FAMILY[k] == FAMILY[kind]):
            done = [s for s in steps if same(s["kind"])]
            if done:
                return float(sum(s["took_s"] for s in done)) / max(
                    float(sum(s["estimate_s"] for s in done)), 1e-9)
        return 1.0

    def projected_s(self, rest: Rest) -> float:
        """Seconds the rest of the plan is expected to take."""
        return sum(step_estimate_s(kind, rest, self.speeds, arg) * self.ratio(kind)
                   for kind, arg in rest_steps(rest))

    def fit(self, rest: Rest, decode_seqs: list[int]) -> None:
        """Shed work (:func:`shed_one`) until the rest is expected to end within the
        budget, or nothing is left to shed; say each piece shed and why.
        """
        while (need_s := self.projected_s(rest)) > (
                left_s := self.budget_s - self.elapsed_s()):
            shed = shed_one(rest, decode_seqs)
            if shed is None:
                return
            kind, what = shed
            ratios = {k: round(self.ratio(k), 3) for k in ("prefill", "decode")}
            self.record["shed"].append({"shed": kind, "what": what,
                                        "at_s": round(self.elapsed_s(), 3),
                                        "projected_s": need_s, "left_s": left_s,
                                        "ratios": ratios})
            self.say(f"budget: the rest would take about {need_s:.0f} s of "
                     f"{max(left_s, 0):.0f} "
                     f"s left (steps so far took {ratios['prefill']:.2f} × (prefill), "
                     f"{ratios['decode']:.2f} × (decode) their estimates): shedding {what}")

    @contextmanager
    def step(self, name: str, kind: str, rest: Rest, arg: Any = None) -> Iterator[None]:
        """Time one probe step (recorded in ``meta.budget.steps``).

        Raises:
            ProbingStopped: the budget is spent before the step starts (``"budget"``).
        """
        start = self.elapsed_s()
        if start >= self.budget_s:
            self.record["stopped_at_s"] = start
            self.say(f"budget: {self.budget_s:g} s spent before {name}; stopping")
            raise ProbingStopped("budget")
        estimate = step_estimate_s(kind, rest, self.speeds, arg)
        yield
        self.record["steps"].append({"step": name, "kind": kind, "start_s": start,
                                     "estimate_s": estimate,
                                     "took_s": self.elapsed_s() - start,
                                     "tokens": int(arg) if kind == "prefill" else None})
