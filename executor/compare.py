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
from typing import Any, cast

import numpy as np
import pandas as pd

import sim
from calibration.model_runners import ModelRunner
from calibration.profile import LatencyProfile
from executor.compare_loop import (
    FLEET_METRICS,
    METRICS,
    Probing,
    check_compare_args,
    compare_rows,
    metric,
    run_repeats,
    write_compare,
)
from executor.live_budget import check_live_requests
from executor.live_requests import (
    check_live_bounds,
    default_runners,
    live,
    model_spec,
    replica_loader,
    scenario_profile,
)
from executor.probe import PROBE_MODES, Probe, drift, pooled_scale, probe, probe_sizes
from sim.errors import UserError
from sim.metrics.rundir import Result, write_json
from sim.metrics.stability import stability_warning
from sim.metrics.window import default_drain_s
from sim.scenario.schema import Scenario, load_scenario

__all__ = ["FLEET_METRICS", "METRICS", "compare", "compare_rows", "mean_summary", "metric",
           "predict", "probe_target", "probed_scenario", "rate_for_utilization", "sweep"]

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
            force: bool = False, yes: bool = False) -> dict[str, Any]:
    """Simulate the scenario and run it live ``repeats`` times; write and return the comparison.

    First, as ``live`` does, the run's records and models are priced against the memory
    budget (:mod:`executor.live_budget`; ``yes`` runs past it): the simulation comes next,
    and a scenario of a billion requests would otherwise hold the process there.

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
    check_compare_args(repeats, probe_mode, PROBE_MODES)
    if sim_replications < 1:
        raise UserError(f"sim_replications {sim_replications}: must be >= 1")
    scn = load_scenario(scenario, overrides)
    check_live_requests(scn, model_spec(scn) if runners is None else None, yes=yes)
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
    figures: list[Result] = []  # the first probed prediction's run, for the report
    loop_s = time.perf_counter()

    def before_repeat(i: int) -> None:
        elapsed_s = time.perf_counter() - started_s
        # the first estimate is the schedule, its predicted drain and the probes; later ones
        # are what the runs so far took (model loading and predictions included)
        each_s = (time.perf_counter() - loop_s) / (i - 1) if i > 1 else per_run_s
        say(f"repeat {i}/{repeats}: {elapsed_s:.0f} s so far, about "
            f"{each_s * (repeats - i + 1):.0f} s left")

    def probe_device(i: int, after: bool) -> Probe:
        assert probe_runner is not None
        assert profile is not None
        return probe(probe_runner, profile, sizes, budget_s=probe_budget_s,
                     seed=i + 500 if after else i)

    def predict_probed(i: int, before: Probe, after: Probe, run_dir: Path
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
        assert profile is not None
        scaled = before.profile_for(profile, probe_mode, [after])
        info = {"repeat": i, "mode": probe_mode, "scale": pooled_scale([before, after]),
                "applied": scaled.meta["rescaled"], "drift": drift(before, after),
                "before": before.to_dict(), "after": after.to_dict()}
        path = scaled.save(run_dir / "probed-profile.json")
        write_json(run_dir / "probe.json", info)
        probed, mean = predict(scn, out / f"sim-{i}", sim_replications, seed=i,
                               overrides={"service.path": str(path)}, drain_timeout_s=drain_s)
        figures.append(probed)
        return mean, info

    probing = None if profile is None else Probing(
        probe_device, predict_probed,
        announce=lambda _i: say(f"probing the device (batch sizes {sizes})"))
    done = run_repeats(repeats, out, lambda: live(scn, runners=runner_list,
                                                  drain_timeout_s=drain_s),
                       probing, before_repeat=before_repeat, say=say)
    lives = cast(list[Result], done.lives)  # live() makes Results
    figure_sim = figures[0] if figures else figure_sim
    rows = done.rows(stored, metrics)
    predictions, probes = done.predictions, done.probes
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
    write_compare(out, data)
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
          max_wall_s: float = 600.0, force: bool = False, yes: bool = False) -> pd.DataFrame:
    """``compare`` at each target utilisation; writes ``fidelity.csv`` and returns it.

    When probing, the rates are found on the profile refreshed by a probe of the device taken
    first, so that each target ρ is the utilisation the device really sees.
    """
    scn = load_scenario(scenario, overrides)
    check_live_requests(scn, model_spec(scn) if runners is None else None, yes=yes)
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
                       max_wall_s=max_wall_s, force=force, yes=yes)
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
