"""The sim-vs-live comparison skeleton both kinds of scenario share (``compare`` for
request-level scenarios, ``compare_llm`` for LLM ones): the argument checks, the repeat loop
(probe the device, run live, write ``live-K/``, probe again and predict on the rescaled
profile), the errors table (:func:`compare_rows`) and ``compare.json``.

What differs by kind is passed in: how a live run is made, how the device is probed, and how
a repeat's prediction is made from its two probes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from sim.errors import UserError
from sim.metrics.rundir import write_json

METRICS: list[tuple[str, str]] = [
    ("throughput_rps", "throughput (req/s)"),
    ("goodput_rps", "goodput (req/s)"),
    ("latency_ms.mean", "latency mean (ms)"),
    ("latency_ms.p50", "latency p50 (ms)"),
    ("latency_ms.p90", "latency p90 (ms)"),
    ("latency_ms.p95", "latency p95 (ms)"),
    ("latency_ms.p99", "latency p99 (ms)"),
    ("queue_ms.mean", "queue wait mean (ms)"),
    ("mean_batch_size", "mean batch size"),
    ("utilization", "utilisation"),
    ("error_rate", "error rate"),
]
FLEET_METRICS: list[tuple[str, str]] = [
    ("replica_seconds", "replica-seconds"),
    ("replicas.mean", "replicas (mean)"),
    ("cold_starts", "cold starts"),
    ("cold_start_s.p50", "cold start p50 (s)"),
    ("cold_start_waits", "requests that waited on a cold start"),
    ("cost_per_million_usd", "cost per million (USD)"),
]

ProbeT = TypeVar("ProbeT")


class LiveRun(Protocol):
    """A finished live run of either kind: its summary, and a run directory it can write."""

    summary: dict[str, Any]

    def write(self, out_dir: str | Path) -> Path:
        """Write the run directory and return its path."""


def check_compare_args(repeats: int, probe_mode: str, modes: Sequence[str],
                       modes_for: str = "") -> None:
    """Reject a bad repeat count or probe mode in one line (``modes_for``: which scenarios
    the allowed modes are for, when that narrows them).
    """
    if repeats < 1:
        raise UserError(f"--repeats {repeats}: must be >= 1")
    if probe_mode not in modes:
        where = f" for {modes_for}" if modes_for else ""
        raise UserError(f"--probe {probe_mode!r}: allowed{where}: {', '.join(modes)}")


def metric(summary: dict[str, Any], key: str) -> float:
    """A (possibly dotted) metric from a summary."""
    value: Any = summary
    for part in key.split("."):
        value = value.get(part, math.nan) if isinstance(value, dict) else math.nan
    return float(value) if value is not None else math.nan


def _rel(value: float, reference: float) -> float:
    if reference != 0 and math.isfinite(reference):
        return (value - reference) / abs(reference)
    return 0.0 if value == reference else math.nan


def compare_rows(sim_summaries: dict[str, Any] | Sequence[dict[str, Any]],
                 live_summaries: Sequence[dict[str, Any]],
                 stored_summary: dict[str, Any] | None = None,
                 metrics: Sequence[tuple[str, str]] = METRICS) -> list[dict[str, Any]]:
    """Per-metric comparison rows (the errors table).

    Args:
        sim_summaries: The simulated summary, or one per live repeat (probed runs); their
            median is the prediction.
        live_summaries: One summary per live repeat.
        stored_summary: With probing, the prediction from the stored (unprobed) profile; its
            value and error are kept as ``sim_stored`` / ``rel_error_stored``.
        metrics: (dotted key, label) pairs to compare (default: the request-level ones).
    """
    sims = [sim_summaries] if isinstance(sim_summaries, dict) else list(sim_summaries)
    rho = float(np.median([metric(x, "utilization") for x in sims]))
    rows = []
    for key, label in metrics:
        if key == "goodput_rps" and all(x.get(key) is None for x in sims):
            continue  # no SLO set: there is no goodput to compare
        s = float(np.median([metric(x, key) for x in sims]))
        lv = np.array([metric(x, key) for x in live_summaries], dtype=float)
        med = float(np.median(lv)) if lv.size else math.nan
        lo, hi = (float(lv.min()), float(lv.max())) if lv.size else (math.nan, math.nan)
        spread = (hi - lo) / abs(med) if med and math.isfinite(med) else math.nan
        row: dict[str, Any] = {
            "metric": key, "label": label, "sim": s, "live_median": med,
            "rel_error": _rel(s, med), "live_min": lo, "live_max": hi,
            "live_spread_rel": spread, "within_spread": bool(lo <= s <= hi), "rho": rho}
        if len(sims) == len(live_summaries) and len(sims) > 1:
            row["paired_rel_errors"] = [_rel(metric(a, key), metric(b, key))
                                        for a, b in zip(sims, live_summaries, strict=True)]
        if stored_summary is not None:
            stored = metric(stored_summary, key)
            row["sim_stored"] = stored
            row["rel_error_stored"] = _rel(stored, med)
        rows.append(row)
    return rows


@dataclass
class Probing(Generic[ProbeT]):
    """How a kind of scenario probes the device around a live run and predicts from it.

    Attributes:
        probe: Re-time the device before (``after=False``) or after a repeat: the repeat's
            number and the side in, a probe result out.
        predict: One repeat's prediction from its probes: (repeat, before, after, the live
            run's directory) in, (the prediction's summary, the probe record kept for
            ``compare.json``) out; it writes what it keeps (``sim-K/``, ``probe.json``).
        announce: Said before the first probe of each repeat (e.g. progress).
    """

    probe: Callable[[int, bool], ProbeT]
    predict: Callable[[int, ProbeT, ProbeT, Path], tuple[dict[str, Any], dict[str, Any]]]
    announce: Callable[[int], None] = lambda _i: None


@dataclass
class Repeats:
    """What the repeat loop gathered: the live runs, and with probing one prediction and one
    probe record per repeat.
    """

    lives: list[LiveRun] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)

    def rows(self, stored: dict[str, Any],
             metrics: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        """The errors table: the probed predictions against the live runs (with the stored
        profile's prediction kept alongside), else the stored prediction alone.
        """
        lives = [r.summary for r in self.lives]
        if self.predictions:
            return compare_rows(self.predictions, lives, stored_summary=stored,
                                metrics=metrics)
        return compare_rows(stored, lives, metrics=metrics)


def run_repeats(repeats: int, out: Path, live: Callable[[], LiveRun],
                probing: Probing[Any] | None, *,
                before_repeat: Callable[[int], None] = lambda _i: None,
                say: Callable[[str], None] = lambda _msg: None) -> Repeats:
    """Run live ``repeats`` times into ``out/live-K/``, each bracketed by two probes and
    predicted on them when ``probing`` is given.

    Args:
        repeats: Live runs to make.
        out: The comparison's directory.
        live: Make one live run.
        probing: How to probe and predict (None: compare with the stored prediction).
        before_repeat: Called first in each repeat (its number), e.g. a progress estimate.
        say: Progress messages.
    """
    done = Repeats()
    for i in range(1, repeats + 1):
        before_repeat(i)
        before = None
        if probing is not None:
            probing.announce(i)
            before = probing.probe(i, False)
        say(f"live run {i}/{repeats}")
        result = live()
        run_dir = result.write(out / f"live-{i}")
        done.lives.append(result)
        if probing is not None:
            after = probing.probe(i, True)
            prediction, record = probing.predict(i, before, after, run_dir)
            done.predictions.append(prediction)
            done.probes.append(record)
    return done


def write_compare(out: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Write ``compare.json`` and return its data."""
    write_json(out / "compare.json", data)
    return data
