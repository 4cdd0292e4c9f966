"""Sim vs live: run a scenario in the simulator and live (repeated), compare the metrics.

``compare`` writes ``DIR/sim/``, ``DIR/live-1/`` ... (ordinary run directories),
``DIR/compare.json`` and ``DIR/report.html``. For each metric: the simulated value, the median
of the live repeats, the relative error (sim − live) / live, the live min and max (run-to-run
spread) and ρ (simulated device utilisation). A prediction error inside the live spread is as
good as can be measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sim
from calibration.runners import ModelRunner
from executor.run import default_runners, live
from sim.rundir import write_json
from sim.scenario import Scenario, load_scenario

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


def metric(summary: dict[str, Any], key: str) -> float:
    """A (possibly dotted) metric from a summary."""
    value: Any = summary
    for part in key.split("."):
        value = value.get(part, math.nan) if isinstance(value, dict) else math.nan
    return float(value) if value is not None else math.nan


def compare_rows(sim_summary: dict[str, Any], live_summaries: Sequence[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Per-metric comparison rows."""
    rho = metric(sim_summary, "utilization")
    rows = []
    for key, label in METRICS:
        s = metric(sim_summary, key)
        lv = np.array([metric(x, key) for x in live_summaries], dtype=float)
        med = float(np.median(lv)) if lv.size else math.nan
        if med != 0 and math.isfinite(med):
            rel = (s - med) / abs(med)
        else:
            rel = 0.0 if s == med else math.nan
        lo, hi = (float(lv.min()), float(lv.max())) if lv.size else (math.nan, math.nan)
        spread = (hi - lo) / abs(med) if med and math.isfinite(med) else math.nan
        rows.append({"metric": key, "label": label, "sim": s, "live_median": med,
                     "rel_error": rel, "live_min": lo, "live_max": hi,
                     "live_spread_rel": spread, "within_spread": bool(lo <= s <= hi),
                     "rho": rho})
    return rows


def compare(scenario: Scenario | dict[str, Any] | str | Path, out_dir: str | Path, *,
            repeats: int = 3, overrides: list[str] | dict[str, Any] | None = None,
            runners: Sequence[ModelRunner] | None = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Simulate the scenario and run it live ``repeats`` times; write and return the comparison.

    Runners are built once (from the profile's model) and reused by every live repeat.
    """
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: must be >= 1")
    scn = load_scenario(scenario, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _msg: None)
    say("simulating")
    simulated = sim.run(scn)
    simulated.write(out / "sim")
    runner_list = list(runners) if runners is not None else default_runners(scn)
    lives = []
    for i in range(1, repeats + 1):
        say(f"live run {i}/{repeats}")
        result = live(scn, runners=runner_list)
        result.write(out / f"live-{i}")
        lives.append(result)
    rows = compare_rows(simulated.summary, [r.summary for r in lives])
    data = {"scenario": scn.name, "repeats": repeats, "rho": simulated.summary["utilization"],
            "rows": rows, "live_health": [r.summary.get("executor_health") for r in lives],
            "calibration_warnings": lives[0].meta.get("calibration_warnings", [])}
    write_json(out / "compare.json", data)
    from executor.report import write_compare_report

    write_compare_report(out / "report.html", simulated, lives, rows)
    return data


def rate_for_utilization(scenario: Scenario, rho: float, *, tol: float = 0.01,
                         n_requests: int = 20_000) -> float:
    """The arrival rate (scaled from ``workload.rate_rps``) at which the simulator predicts
    device utilisation ``rho`` for this scenario (bisection on the simulator).
    """
    if not 0 < rho < 1:
        raise ValueError(f"--sweep rho={rho}: must lie in (0, 1)")
    base = getattr(scenario.workload, "rate_rps", None)
    if base is None:
        raise ValueError("--sweep: needs a workload with rate_rps (poisson, constant, gamma, "
                         "sinusoid)")

    def util(rate: float) -> float:
        s = sim.run(scenario, overrides={"workload.rate_rps": rate, "workload.duration_s": None,
                                         "workload.n_requests": n_requests, "warmup_s": 0})
        return float(s.summary["utilization"])

    lo, hi = base / 64, base
    while util(hi) < rho and hi < base * 1e4:
        lo, hi = hi, hi * 2
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        if util(mid) < rho:
            lo = mid
        else:
            hi = mid
        if hi / lo - 1 < tol:
            break
    return math.sqrt(lo * hi)


def sweep(scenario: Scenario | dict[str, Any] | str | Path, out_dir: str | Path,
          rhos: Sequence[float], *, repeats: int = 3,
          overrides: list[str] | dict[str, Any] | None = None,
          runners: Sequence[ModelRunner] | None = None,
          progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """``compare`` at each target utilisation; writes ``fidelity.csv`` and returns it."""
    scn = load_scenario(scenario, overrides)
    runner_list = list(runners) if runners is not None else default_runners(scn)
    rows = []
    for rho in rhos:
        rate = rate_for_utilization(scn, rho)
        if progress:
            progress(f"rho={rho}: {rate:.1f} req/s")
        sub = load_scenario(scn, {"workload.rate_rps": rate})
        data = compare(sub, Path(out_dir) / f"rho-{rho:g}", repeats=repeats, runners=runner_list,
                       progress=progress)
        for row in data["rows"]:
            rows.append({"target_rho": rho, "rate_rps": rate, **row})
    frame = pd.DataFrame(rows)
    frame.to_csv(Path(out_dir) / "fidelity.csv", index=False)
    (Path(out_dir) / "fidelity.json").write_text(json.dumps(rows, indent=1, default=str))
    return frame
