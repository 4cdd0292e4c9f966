"""Capacity planning: the highest load that holds an SLO, and the fewest replicas for a load.

Each candidate is judged on the mean over ``seeds`` independent replications. The search
brackets the answer (doubling or halving from the scenario's own value) and bisects
geometrically until the bracket is within ``tol``; the answer is the highest value that met
the SLO, reported with its bracket and every run behind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.experiments.sweep import ExperimentError, Progress, load_any, sweep
from sim.scenario.llm import LlmScenario
from sim.scenario.schema import Scenario

# SLO key -> (summary column, "max" = must not exceed, "min" = must reach)
SLO_KEYS: dict[str, tuple[str, str]] = {
    "mean_ms": ("latency_ms.mean", "max"),
    "p50_ms": ("latency_ms.p50", "max"),
    "p90_ms": ("latency_ms.p90", "max"),
    "p95_ms": ("latency_ms.p95", "max"),
    "p99_ms": ("latency_ms.p99", "max"),
    "p999_ms": ("latency_ms.p999", "max"),
    "error_rate": ("error_rate", "max"),
    "goodput_frac": ("goodput_frac", "min"),
    # LLM scenarios
    **{f"{metric}_{stat}_ms": (f"{metric}_ms.{stat}", "max")
       for metric in ("ttft", "tpot", "itl", "e2e")
       for stat in ("mean", "p50", "p90", "p95", "p99")},
}
LATENCY_COLUMNS = ("latency_ms", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class SearchStep:
    """One candidate judged by :func:`capacity` or :func:`replicas_needed` (for progress).

    Attributes:
        knob: The knob searched (``workload.rate_rps``, ``replicas``).
        value: The candidate's value.
        met: Whether its replications held the SLO.
        values: Their mean metrics, by SLO key.
        done: Candidates judged so far.
        left: Candidates still to judge at most (None while the answer is not yet bracketed).
    """

    knob: str
    value: float
    met: bool
    values: dict[str, float]
    done: int
    left: int | None


OnStep = Callable[[SearchStep], None]


def bisections_left(lo: float, hi: float, tol: float) -> int:
    """Geometric bisections until ``hi / lo - 1 <= tol`` (what :func:`capacity` still runs)."""
    if lo <= 0 or hi / lo - 1 <= tol:
        return 0
    return max(0, math.ceil(math.log2(math.log(hi / lo) / math.log1p(tol))))


def parse_slo(items: Sequence[str] | Mapping[str, float]) -> dict[str, float]:
    """``["p99_ms=100", "error_rate=0.01"]`` or a dict -> validated SLO dict."""
    pairs: list[tuple[str, Any]]
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            if "=" not in item:
                raise ExperimentError(f"--slo {item!r}: expected KEY=VALUE, e.g. p99_ms=100")
            key, value = item.split("=", 1)
            pairs.append((key.strip(), value))
    slo: dict[str, float] = {}
    for key, value in pairs:
        if key not in SLO_KEYS:
            raise ExperimentError(f"--slo {key!r}: allowed: {', '.join(SLO_KEYS)}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ExperimentError(f"--slo {key}={value!r}: must be a number") from None
        if not (math.isfinite(number) and number >= 0):
            raise ExperimentError(f"--slo {key}={value!r}: must be a finite number >= 0")
        if key in ("error_rate", "goodput_frac") and number > 1:
            raise ExperimentError(f"--slo {key}={value!r}: a fraction; allowed: 0 to 1")
        if key.endswith("_ms") and number == 0:
            raise ExperimentError(f"--slo {key}={value!r}: a latency objective must be > 0")
        slo[key] = number
    if not slo:
        raise ExperimentError("--slo: give at least one objective, e.g. p99_ms=100")
    return slo


def raise_failed(rows: pd.DataFrame, where: str) -> None:
    """A run that failed is not an SLO that was missed: stop the search and say why.

    Raises:
        ExperimentError: naming the candidate, how many runs failed and the first error.
    """
    failed = rows[rows["error"] != ""]
    if len(failed):
        raise ExperimentError(f"capacity: {len(failed)} of {len(rows)} runs at {where} failed "
                              f"(not an SLO miss): {failed['error'].iloc[0]}")


def unstable_runs(rows: pd.DataFrame) -> int:
    """How many of the runs the stability verdict calls unstable."""
    if "stability.verdict" not in rows:
        return 0
    return int((rows["stability.verdict"] == "unstable").sum())


def meets(rows: pd.DataFrame, slo: Mapping[str, float]) -> tuple[bool, dict[str, float]]:
    """Whether the replications' mean metrics hold every objective (failed runs: no).

    An unstable run has no steady-state latency (its percentiles only say how long it ran),
    so any latency objective fails when one of the replications is unstable.
    """
    if len(rows) == 0 or (rows["error"] != "").any():
        return False, {}
    values: dict[str, float] = {}
    ok = True
    unstable = unstable_runs(rows)
    if unstable:
        values["unstable_runs"] = float(unstable)
    for key, target in slo.items():
        column, sense = SLO_KEYS[key]
        if column == "goodput_frac":
            series = pd.to_numeric(rows["goodput_rps"], errors="coerce") / rows["offered_rps"]
        else:
            series = rows[column]
        value = float(series.mean())
        values[key] = value
        broken = (sense == "max" and value > target) or (sense == "min" and value < target)
        if broken or not math.isfinite(value) or (
                unstable and column.startswith(LATENCY_COLUMNS)):
            ok = False
    return ok, values


@dataclass
class CapacityResult:
    """The answer of :func:`capacity`.

    Attributes:
        over: The knob searched.
        max_value: Highest value that met the SLO (0 when none did).
        interval: (highest value that met, lowest value that failed).
        slo: The objectives.
        evaluations: One row per candidate: value, met, mean metrics.
        runs: Every simulation behind the answer.
    """

    over: str
    max_value: float
    interval: tuple[float, float]
    slo: dict[str, float]
    evaluations: pd.DataFrame
    runs: pd.DataFrame = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``capacity.json``)."""
        return {"over": self.over, "max_value": self.max_value,
                "max_rps": self.max_value if self.over == "workload.rate_rps" else None,
                "interval": list(self.interval), "slo": self.slo,
                "evaluations": self.evaluations.to_dict(orient="records")}


def check_objectives(scenario: Scenario | LlmScenario,
                     slo: Mapping[str, float] | Sequence[str]) -> dict[str, float]:
    """Parse ``slo`` and check that the scenario can judge it (before any run).

    Raises:
        ExperimentError: an unknown or impossible objective (named).
    """
    objectives = parse_slo(slo)
    _check_goodput_slo(scenario, objectives)
    return objectives


def _check_goodput_slo(scenario: Scenario | LlmScenario,
                       objectives: Mapping[str, float]) -> None:
    if "goodput_frac" not in objectives:
        return
    if isinstance(scenario, Scenario) and scenario.slo_ms is None:
        raise ExperimentError("--slo goodput_frac: needs slo_ms in the scenario (goodput "
                              "counts the requests within it); add --set slo_ms=...")
    if not isinstance(scenario, Scenario) and scenario.slo.ttft_ms is None \
            and scenario.slo.tpot_ms is None:
        raise ExperimentError("--slo goodput_frac: needs slo.ttft_ms or slo.tpot_ms in the "
                              "scenario; add --set slo.ttft_ms=...")


# Knobs that set the offered load (the search doubles and halves them). Other fields (the
# run's length, a batch size) are not a load: doubling n_requests only makes runs longer.
LOAD_KNOBS = ("workload.rate_rps", "workload.rate_scale", "workload.clients")


def _current(scenario: Scenario | LlmScenario, dotted: str) -> float:
    if dotted not in LOAD_KNOBS:
        raise ExperimentError(f"--over {dotted!r}: not a load knob; allowed: "
                              f"{', '.join(LOAD_KNOBS)}")
    node: Any = scenario.model_dump()
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ExperimentError(f"--over {dotted!r}: not a field of this scenario")
        node = node[part]
    if not isinstance(node, int | float) or isinstance(node, bool) or node <= 0:
        raise ExperimentError(f"--over {dotted!r}: needs a positive number in the scenario "
                              f"(found {node!r})")
    return float(node)


def capacity(scenario: Scenario | LlmScenario | dict[str, Any] | str | Path,
             slo: Mapping[str, float] | Sequence[str], *, over: str = "workload.rate_rps",
             seeds: int = 3, tol: float = 0.02, workers: int | None = None,
             dask: str | None = None, progress: Progress | None = None,
             max_steps: int = 40, on_step: OnStep | None = None,
             yes: bool = False) -> CapacityResult:
    """The highest value of ``over`` at which the scenario holds ``slo``.

    ``over`` is one of :data:`LOAD_KNOBS`. ``on_step`` is called after each candidate with a
    :class:`SearchStep` (progress). Each candidate is estimated before it runs
    (:mod:`sim.experiments.preflight`); beyond the budget the search stops with a
    :class:`sim.experiments.preflight.BudgetError` unless ``yes``.

    Raises:
        ExperimentError: bad arguments, a failed run, or no candidate holds the SLO.
    """
    base = load_any(scenario)
    objectives = parse_slo(slo)
    _check_goodput_slo(base, objectives)
    if not (isinstance(tol, int | float) and math.isfinite(tol) and 0 < tol < 1):
        raise ExperimentError(f"--tol {tol!r}: the bracket's relative width; allowed: a "
                              "number between 0 and 1 (exclusive), e.g. 0.02")
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ExperimentError(f"--seeds {seeds!r}: must be an integer >= 1")
    start = _current(base, over)
    evaluations: list[dict[str, Any]] = []
    runs: list[pd.DataFrame] = []
    cache: dict[float, bool] = {}
    bracket: list[float] = []  # [lo, hi] once the answer is bracketed

    def check(value: float) -> bool:
        if value in cache:
            return cache[value]
        if not yes:
            _check_candidate(base, over, value, seeds, workers, len(evaluations) == 0)
        rows = sweep(base, {over: [value]}, seeds, workers=workers, dask=dask, yes=True)
        raise_failed(rows, f"{over}={value:g}")
        ok, values = meets(rows, objectives)
        runs.append(rows)
        evaluations.append({"value": value, "met": ok, **values})
        cache[value] = ok
        if progress:
            progress(len(evaluations), len(evaluations))
        if on_step:
            left = None
            if bracket:  # bisecting: the candidate narrows the bracket
                bracket[:] = [value, bracket[1]] if ok else [bracket[0], value]
                left = bisections_left(bracket[0], bracket[1], tol)
            on_step(SearchStep(over, value, ok, values, len(evaluations), left))
        return ok

    steps = 0
    if check(start):
        lo, hi = start, start * 2
        while check(hi):
            lo, hi = hi, hi * 2
            steps += 1
            if steps > max_steps:
                raise ExperimentError(f"{over}: the SLO still holds at {hi:g}; is the load "
                                      "knob the right one?")
    else:
        lo, hi = start / 2, start
        while not check(lo):
            hi, lo = lo, lo / 2
            steps += 1
            if steps > max_steps or lo < start * 1e-6:
                best = _closest(evaluations, objectives)
                raise ExperimentError(f"capacity: no candidate holds {objectives} (tried "
                                      f"{over} down to {lo:.4g}, {len(evaluations)} "
                                      f"candidates; {best}); loosen the SLO or check the "
                                      "service times")
    while hi / lo - 1 > tol and steps < max_steps:
        mid = math.sqrt(lo * hi)
        if check(mid):
            lo = mid
        else:
            hi = mid
        steps += 1
    evals = pd.DataFrame(evaluations).sort_values("value").reset_index(drop=True)
    return CapacityResult(over, lo, (lo, hi), objectives, evals, pd.concat(runs))


def _closest(evaluations: list[dict[str, Any]], objectives: Mapping[str, float]) -> str:
    """The lowest candidate's measured value of each objective, in words."""
    if not evaluations:
        return "no candidate ran"
    low = min(evaluations, key=lambda e: e["value"])
    return "at the lowest: " + ", ".join(f"{k} {low.get(k, math.nan):.4g}" for k in objectives)


# A search evaluates about this many candidates (bracketing, then bisection to --tol).
TYPICAL_CANDIDATES = 12


def _check_candidate(base: Scenario | LlmScenario, over: str, value: float, seeds: int,
                     workers: int | None, first: bool) -> None:
    """The pre-flight check of one candidate (the whole search before the first one).

    Raises:
        BudgetError: beyond :data:`sim.experiments.preflight.BUDGET`, naming the candidate.
    """
    import os

    from sim.experiments.preflight import check, estimate_many, estimate_run

    one = estimate_run(load_any(base, {over: value}))
    n = workers or os.cpu_count() or 1
    if first:
        check(estimate_many([one] * seeds * TYPICAL_CANDIDATES, n,
                            f"runs (about {TYPICAL_CANDIDATES} candidates x {seeds} seeds)"),
              "capacity search")
    else:
        check(estimate_many([one] * seeds, n, f"runs at {over}={value:.4g}"),
              "capacity candidate")


def replicas_needed(scenario: Scenario | LlmScenario | dict[str, Any] | str | Path,
                    target_rps: float,
                    slo: Mapping[str, float] | Sequence[str], *, seeds: int = 3,
                    max_replicas: int = 256, workers: int | None = None,
                    dask: str | None = None, on_step: OnStep | None = None,
                    floor_gain: float = 0.05) -> dict[str, Any]:
    """The fewest replicas that hold ``slo`` at ``target_rps``, with cost per million.

    Counts double from 1 until the SLO holds, then bisect. When doubling the count lowers no
    missed latency objective by ``floor_gain`` (both counts stable), more replicas cannot
    help: the search stops with an error that names what sets the floor. ``on_step`` is
    called after each count with a :class:`SearchStep` (progress).
    """
    if not target_rps > 0:
        raise ExperimentError(f"--target-rps {target_rps}: must be > 0")
    base = load_any(scenario, {"workload.rate_rps": target_rps})
    objectives = parse_slo(slo)
    _check_goodput_slo(base, objectives)
    tried: dict[int, tuple[bool, pd.DataFrame]] = {}
    bracket: list[int] = []

    def check(n: int) -> bool:
        rows = sweep(base, {"replicas": [n]}, seeds, workers=workers, dask=dask)
        raise_failed(rows, f"replicas={n}")
        ok, values = meets(rows, objectives)
        tried[n] = (ok, rows)
        if on_step:
            left = None
            if bracket:
                bracket[:] = [bracket[0], n] if ok else [n, bracket[1]]
                left = max(0, math.ceil(math.log2(bracket[1] - bracket[0]))) \
                    if bracket[1] - bracket[0] > 1 else 0
            on_step(SearchStep("replicas", n, ok, values, len(tried), left))
        return ok

    lo, hi = 0, 1
    while not check(hi):
        if lo:
            _stop_at_floor(base, objectives, tried, lo, hi, floor_gain)
        lo, hi = hi, hi * 2
        if hi > max_replicas:
            raise ExperimentError(f"no replica count up to {max_replicas} holds the SLO at "
                                  f"{target_rps:g} req/s")
    bracket[:] = [lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(mid):
            hi = mid
        else:
            lo = mid
    ok, rows = tried[hi]
    price = base.price_per_replica_hour
    throughput = float(rows["throughput_rps"].mean())
    cost = price * hi / 3600 / throughput * 1e6 if price > 0 and throughput > 0 else None
    p99 = "latency_ms.p99" if "latency_ms.p99" in rows else "e2e_ms.p99"  # LLM: end to end
    return {"replicas": hi, "target_rps": target_rps, "slo": objectives,
            "met": ok, "throughput_rps": throughput,
            p99: float(rows[p99].mean()),
            "cost_per_million_usd": cost,
            "tried": {str(n): bool(v[0]) for n, v in sorted(tried.items())},
            "runs": pd.concat([v[1] for _, v in sorted(tried.items())], ignore_index=True)}


def _stop_at_floor(base: Scenario | LlmScenario, objectives: Mapping[str, float],
                   tried: Mapping[int, tuple[bool, pd.DataFrame]], lo: int, hi: int,
                   floor_gain: float) -> None:
    """Raise when going from ``lo`` to ``hi`` replicas (both stable, both missing the SLO)
    lowered no missed latency objective by ``floor_gain``: replicas do not set the floor.

    Raises:
        ExperimentError: naming the objective, its value at both counts, and what sets it.
    """
    rows_lo, rows_hi = tried[lo][1], tried[hi][1]
    if unstable_runs(rows_lo) or unstable_runs(rows_hi):
        return
    _, at_lo = meets(rows_lo, objectives)
    _, at_hi = meets(rows_hi, objectives)
    missed = [k for k, target in objectives.items()
              if SLO_KEYS[k][0].startswith(LATENCY_COLUMNS) and at_hi.get(k, 0.0) > target]
    if not missed or any(at_hi[k] < (1 - floor_gain) * at_lo[k] for k in missed):
        return
    key = missed[0]
    parts = []
    for label, column in (("queue wait", "queue_ms.p99"), ("service", "service_ms.p99")):
        if column in rows_hi:
            parts.append(f"{label} p99 {float(rows_hi[column].mean()):.1f} ms")
    wait = getattr(getattr(base, "policy", None), "max_wait_ms", None)
    if wait:
        parts.append(f"policy.max_wait_ms {wait:g}")
    raise ExperimentError(
        f"--slo {key}={objectives[key]:g}: more replicas do not lower it ({at_lo[key]:.1f} at "
        f"{lo}, {at_hi[key]:.1f} at {hi} replicas); the floor is set per request"
        + (f" ({', '.join(parts)})" if parts else "")
        + ": lower policy.max_wait_ms or the batch size, use a faster model or device, or "
          "loosen the SLO")
