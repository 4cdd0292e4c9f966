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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sim
from calibration.model_runners import ModelRunner
from calibration.profile import LatencyProfile
from executor.live_requests import (
    check_live_bounds,
    default_runners,
    live,
    replica_loader,
    scenario_profile,
)
from executor.probe import PROBE_MODES, drift, pooled_scale, probe, probe_sizes
from sim.errors import UserError
from sim.metrics.rundir import Result, write_json
from sim.metrics.stability import stability_warning
from sim.metrics.window import default_drain_s
from sim.scenario.schema import Scenario, load_scenario

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
    """Per-metric comparison rows.

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


def mean_summary(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mean of every numeric field (recursively) over replications' summaries."""
    first = summaries[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        values = [s.get(key) for s in summaries]
        if isinstance(value, dict) and all(isinstance(v, dict) for v in values):
            out[key] = mean_summary(values)  # type: ignore[arg-type]
        elif isinstance(value, int | float) and not isinstance(value, bool) and all(
                isinstance(v, int | float) for v in values):
            finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
            out[key] = float(np.mean(finite)) if finite else math.nan
        else:
            out[key] = value
    return out


def predict(scn: Scenario, out_dir: Path, replications: int, *, seed: int = 0,
            overrides: dict[str, Any] | None = None, drain_timeout_s: float | None = None,
            first: Result | None = None) -> tuple[Result, dict[str, Any]]:
    """The simulator's prediction for one arrival schedule: the mean summary over
    ``replications`` service-time streams, so the prediction carries little sampling noise of
    its own. Returns the first run (the scenario's own seed; written to ``out_dir``; pass it
    as ``first`` when already simulated) and the mean summary. ``drain_timeout_s`` stops each
    simulation as the live run stops, so that censoring matches.
    """
    first = first if first is not None else sim.run(scn, overrides,
                                                    drain_timeout_s=drain_timeout_s)
    first.write(out_dir)
    summaries = [first.summary] + [
        sim.run(scn, overrides, service_seed=seed * 10_000 + j,
                drain_timeout_s=drain_timeout_s).summary
        for j in range(1, replications)]
    mean = mean_summary(summaries)
    write_json(out_dir / "prediction.json", {"replications": replications, "summary": mean})
    return first, mean


def compare(scenario: Scenario | dict[str, Any] | str | Path, out_dir: str | Path, *,
            repeats: int = 3, overrides: list[str] | dict[str, Any] | None = None,
            runners: Sequence[ModelRunner] | None = None,
            progress: Callable[[str], None] | None = None, probe_mode: str = "full",
            probe_budget_s: float = 3.0, sim_replications: int = 10,
            drain_timeout_s: float | None = None, max_wall_s: float = 600.0,
            force: bool = False) -> dict[str, Any]:
    """Simulate the scenario and run it live ``repeats`` times; write and return the comparison.

    Before anything runs live, the simulated run (with the same drain timeout as the live
    runs: default the window's length) must be stable and its predicted wall time, for all
    repeats and probes, within ``max_wall_s``; else :class:`LiveError` says so in one line
    (``force`` skips the check).

    Runners are built once (from the profile's model) and reused by every live repeat. Each
    prediction is the mean over ``sim_replications`` simulations of the same arrival schedule
    with independent service-time draws (``prediction.json`` next to the first one's tables).

    With ``probe_mode`` ``full`` (and a measured profile) each live run is bracketed by two
    probes of the device (:mod:`executor.probe`); the profile rescaled to their speed scale
    plus the measured dispatch overhead gives that repeat's prediction (``DIR/sim-K/``,
    profile in ``DIR/live-K/``), and the median of those is compared. ``overhead`` applies the
    overhead only; ``off`` predicts from the stored profile. ``DIR/sim/`` is always the stored
    profile's prediction; its errors are kept per metric as ``rel_error_stored``.
    """
    if repeats < 1:
        raise UserError(f"--repeats {repeats}: must be >= 1")
    if sim_replications < 1:
        raise UserError(f"sim_replications {sim_replications}: must be >= 1")
    if probe_mode not in PROBE_MODES:
        raise UserError(f"--probe {probe_mode!r}: allowed: {', '.join(PROBE_MODES)}")
    scn = load_scenario(scenario, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _msg: None)
    drain_s = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    say("simulating")
    started_s = time.perf_counter()
    first = sim.run(scn, drain_timeout_s=drain_s)
    profile = probe_target(scn) if probe_mode != "off" else None
    extra_s = 2 * probe_budget_s if profile is not None else 0.0
    if not force:
        check_live_bounds(first, max_wall_s=max_wall_s, repeats=repeats, extra_s_per_run=extra_s)
    per_run_s = float(first.meta["end_s"]) + extra_s
    figure_sim, stored = predict(scn, out / "sim", sim_replications, drain_timeout_s=drain_s,
                                 first=first)
    runner_list = list(runners) if runners is not None else default_runners(scn)
    probe_runner = runner_list[0] if runner_list else None
    if profile is not None and probe_runner is None:  # scale from zero: a runner to probe
        probe_runner = replica_loader(scn)(0)[0]
    sizes = probe_sizes(scn, profile) if profile is not None else []
    metrics = METRICS + (FLEET_METRICS if scn.autoscaling is not None else [])
    lives: list[Result] = []
    predictions: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    loop_s = time.perf_counter()
    for i in range(1, repeats + 1):
        elapsed_s = time.perf_counter() - started_s
        # the first estimate is the schedule, its predicted drain and the probes; later ones
        # are what the runs so far took (model loading and predictions included)
        each_s = (time.perf_counter() - loop_s) / (i - 1) if i > 1 else per_run_s
        say(f"repeat {i}/{repeats}: {elapsed_s:.0f} s so far, about "
            f"{each_s * (repeats - i + 1):.0f} s left")
        before = None
        if profile is not None:
            say(f"probing the device (batch sizes {sizes})")
            assert probe_runner is not None
            before = probe(probe_runner, profile, sizes, budget_s=probe_budget_s, seed=i)
        say(f"live run {i}/{repeats}")
        result = live(scn, runners=runner_list, drain_timeout_s=drain_s)
        result.write(out / f"live-{i}")
        lives.append(result)
        if before is not None and profile is not None:
            assert probe_runner is not None
            after = probe(probe_runner, profile, sizes, budget_s=probe_budget_s, seed=i + 500)
            scaled = before.profile_for(profile, probe_mode, [after])
            info = {"repeat": i, "mode": probe_mode, "scale": pooled_scale([before, after]),
                    "applied": scaled.meta["rescaled"], "drift": drift(before, after),
                    "before": before.to_dict(), "after": after.to_dict()}
            path = scaled.save(out / f"live-{i}" / "probed-profile.json")
            write_json(out / f"live-{i}" / "probe.json", info)
            probed, mean = predict(scn, out / f"sim-{i}", sim_replications, seed=i,
                                   overrides={"service.path": str(path)},
                                   drain_timeout_s=drain_s)
            figure_sim = probed if i == 1 else figure_sim
            predictions.append(mean)
            probes.append(info)
    if predictions:
        rows = compare_rows(predictions, [r.summary for r in lives], stored_summary=stored,
                            metrics=metrics)
    else:
        rows = compare_rows(stored, [r.summary for r in lives], metrics=metrics)
    data = {"scenario": scn.name, "repeats": repeats, "rho": rows[0]["rho"],
            "sim_replications": sim_replications, "probed": bool(predictions),
            "probe_mode": probe_mode if predictions else "off",
            "probes": probes, "rows": rows,
            "live_health": [r.summary.get("executor_health") for r in lives],
            "drain_timeout_s": drain_s,
            "stability": {"sim": stored.get("stability"),
                          "live": [r.summary.get("stability") for r in lives]},
            "stability_warnings": [w for w in (stability_warning(x) for x in
                                               [figure_sim.summary, *(r.summary for r in lives)])
                                   if w],
            "calibration_warnings": lives[0].meta.get("calibration_warnings", [])}
    write_json(out / "compare.json", data)
    from executor.report import write_compare_report

    write_compare_report(out / "report.html", figure_sim, lives, rows)
    return data


def rate_for_utilization(scenario: Scenario, rho: float, *, tol: float = 0.01,
                         n_requests: int = 20_000) -> float:
    """The arrival rate (scaled from ``workload.rate_rps``) at which the simulator predicts
    device utilisation ``rho`` for this scenario (bisection on the simulator).
    """
    if not 0 < rho < 1:
        raise UserError(f"--sweep rho={rho}: must lie in (0, 1)")
    base = getattr(scenario.workload, "rate_rps", None)
    if base is None:
        raise UserError("--sweep: needs a workload with rate_rps (poisson, constant, gamma, "
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
          progress: Callable[[str], None] | None = None, probe_mode: str = "full",
          probe_budget_s: float = 3.0, drain_timeout_s: float | None = None,
          max_wall_s: float = 600.0, force: bool = False) -> pd.DataFrame:
    """``compare`` at each target utilisation; writes ``fidelity.csv`` and returns it.

    When probing, the rates are found on the profile refreshed by a probe of the device taken
    first, so that each target ρ is the utilisation the device really sees.
    """
    scn = load_scenario(scenario, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runner_list = list(runners) if runners is not None else default_runners(scn)
    rate_scn = probed_scenario(scn, runner_list, out / "rate-probe-profile.json",
                               probe_budget_s, probe_mode) if probe_mode != "off" else scn
    rows = []
    for rho in rhos:
        rate = rate_for_utilization(rate_scn, rho)
        if progress:
            progress(f"rho={rho}: {rate:.1f} req/s")
        sub = load_scenario(scn, {"workload.rate_rps": rate})
        data = compare(sub, out / f"rho-{rho:g}", repeats=repeats, runners=runner_list,
                       progress=progress, probe_mode=probe_mode,
                       probe_budget_s=probe_budget_s, drain_timeout_s=drain_timeout_s,
                       max_wall_s=max_wall_s, force=force)
        for row in data["rows"]:
            rows.append({"target_rho": rho, "rate_rps": rate, **row})
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "fidelity.csv", index=False)
    (out / "fidelity.json").write_text(json.dumps(rows, indent=1, default=str))
    return frame


def probed_scenario(scn: Scenario, runners: Sequence[ModelRunner], profile_path: Path,
                    budget_s: float = 3.0, mode: str = "full") -> Scenario:
    """The scenario with its profile rescaled by one probe of the device now (unchanged when
    its service is not a measured profile).
    """
    profile = probe_target(scn)
    if profile is None:
        return scn
    measured = probe(runners[0], profile, probe_sizes(scn, profile), budget_s=budget_s)
    path = measured.profile_for(profile, mode).save(profile_path)
    return load_scenario(scn, {"service.path": str(path)})


def probe_target(scn: Scenario) -> LatencyProfile | None:
    """The scenario's profile when a probe can refresh it: a measured (not synthetic) one."""
    profile = scenario_profile(scn)
    return None if profile is None or profile.meta.get("synthetic") else profile
