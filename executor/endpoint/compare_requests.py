"""``compare_request_endpoint``: predict a request-level scenario with a latency profile
calibrated from an endpoint (``servelab calibrate --endpoint --api kserve-v2|http-json``) and
the scenario's batching knobs, measure it with the request-level ``bench`` ``repeats`` times,
and write the ``compare.json`` and ``report.html`` the live compare writes, on the same
skeleton (:func:`executor.compare_loop.run_repeats`, :meth:`executor.compare_loop.Repeats.rows`).

Around each run a short probe re-measures the server: a few bursts of each calibrated size up
to the policy's largest batch, their latency (less the server's window where the burst waits
for it) over the profile's (the replica's busy time plus ``service.overheads``). Each size
gets its own ratio (as the live compare's probe does), the geometric mean of before and after;
the busy time is rescaled by them (interpolated between sizes) and the request overhead by the
smallest size's, for that run's prediction. The change between before and after is the run's
drift. A black box shows no batches: the rows the server keeps to itself (mean batch size,
utilisation, queue wait) are compared only where the bench could see them (null otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from calibration.profile import LatencyProfile, load_profile
from executor.compare import predict, rate_for_utilization
from executor.compare_loop import METRICS, Probing, run_repeats, write_compare
from executor.endpoint.probes import Stopper
from executor.endpoint.request_bench import bench_requests
from executor.endpoint.request_calibrate import _burst_stats, _bursts, profile_service
from executor.endpoint.request_client import REQUEST_APIS, request_path
from executor.endpoint.server_info import EndpointError, base_url
from executor.endpoint.sweep_points import check_loads, sweep_loads
from sim.metrics.rundir import Result, write_json
from sim.metrics.window import default_drain_s
from sim.scenario.payload import PayloadCfg
from sim.scenario.schema import ProfileServiceCfg, Scenario, load_scenario

PROBE_BURSTS = 4  # timed bursts per size and probe (after one untimed burst)


def _scenario(scenario: Scenario | dict[str, Any] | str | Path,
              overrides: list[str] | dict[str, Any] | None,
              profile: str | Path | None) -> tuple[Scenario, LatencyProfile]:
    scn = load_scenario(scenario, overrides)
    if profile is not None:
        prof = load_profile(profile)
        scn = load_scenario(scn, {"service": profile_service(prof, str(profile))})
    if not isinstance(scn.service, ProfileServiceCfg):
        raise EndpointError("service.kind: compare --endpoint predicts with a calibrated "
                            "profile; pass --profile PROFILE.json (servelab calibrate "
                            "--endpoint URL --api ...)")
    prof = load_profile(scn.service.path)
    if "endpoint" not in prof.meta:
        raise EndpointError(f"--profile {scn.service.path}: not measured from an endpoint "
                            "(servelab calibrate --endpoint URL --api ... writes one)")
    return scn, prof


def probe_sizes(scn: Scenario, prof: LatencyProfile) -> list[int]:
    """The calibrated sizes the scenario's policy can dispatch (at least the smallest)."""
    most = getattr(scn.policy, "max_batch_size", None) or getattr(scn.policy, "batch_size",
                                                                   None) or 1
    sizes = [b for b in prof.batch_sizes if b <= int(most)]
    return sizes or [prof.batch_sizes[0]]


def server_knobs(scn: Scenario) -> tuple[float, int | None]:
    """The server's batching window (s) and largest batch as the scenario states them: a
    ``dynamic`` policy's ``max_wait_ms`` and ``max_batch_size`` (Ray Serve's
    ``batch_wait_timeout_s`` and ``max_batch_size``); no window otherwise.
    """
    policy = scn.policy
    if policy.kind == "dynamic":
        return float(getattr(policy, "max_wait_ms", 0.0)) / 1e3, getattr(
            policy, "max_batch_size", None)
    return 0.0, getattr(policy, "batch_size", None)


def probe_endpoint(url: str, api: str, payload: PayloadCfg, prof: LatencyProfile,
                   overhead_s: float, sizes: list[int], knobs: tuple[float, int | None],
                   seed: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """Bursts of each size (one untimed, then :data:`PROBE_BURSTS`), each its own batch:
    measured latency (less the window where the burst waits for it; ``knobs``: the window
    and the largest batch, :func:`server_knobs`) over the profile's busy median plus the
    request overhead, per size.
    """
    window_s, server_max = knobs
    gap_s = 2.0 * max(prof.median_s(b) + overhead_s + window_s for b in sizes) + 0.02
    plan = [(0.05 + k * gap_s, n) for k, n in enumerate(
        [n for n in sizes for _ in range(PROBE_BURSTS + 1)])]
    groups = _bursts(url, api, payload, plan, seed, timeout_s, Stopper())  # not installed:
    # compare's own stop path (the bench's) handles signals
    rows = []
    for n in sizes:
        mine = [g for (_, size), g in zip(plan, groups, strict=True) if size == n][1:]
        waits = window_s if (server_max is None or n < int(server_max)) else 0.0
        measured_s = float(np.median([_burst_stats(g)[0] for g in mine])) - waits
        predicted_s = prof.median_s(n) + overhead_s
        rows.append({"batch_size": n, "bursts": len(mine), "measured_ms": measured_s * 1e3,
                     "profile_ms": predicted_s * 1e3, "ratio": measured_s / predicted_s})
    return {"sizes": rows}


def _ratios(before: dict[str, Any], after: dict[str, Any]) -> dict[int, float]:
    """Per size: the geometric mean of the two probes' ratios."""
    a = {r["batch_size"]: r["ratio"] for r in before["sizes"]}
    b = {r["batch_size"]: r["ratio"] for r in after["sizes"]}
    return {n: math.sqrt(a[n] * b[n]) for n in sorted(a) if n in b and a[n] > 0 and b[n] > 0}


def compare_request_endpoint(scenario: Scenario | dict[str, Any] | str | Path, endpoint: str,
                             out_dir: str | Path, *, api: str,
                             profile: str | Path | None = None, repeats: int = 3,
                             overrides: list[str] | dict[str, Any] | None = None,
                             model: str | None = None, probe_mode: str = "full",
                             sim_replications: int = 10, drain_timeout_s: float | None = None,
                             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Simulate, bench ``repeats`` times (probing around each), compare; write
    ``compare.json``, ``report.html``, ``sim/``, ``sim-K/`` and ``live-K/``.

    Raises:
        EndpointError: a bad flag, no endpoint profile, or an unusable endpoint (one line).
    """
    from executor.compare_loop import check_compare_args

    check_compare_args(repeats, probe_mode, ("full", "off"), "--endpoint")
    if api not in REQUEST_APIS:
        raise EndpointError(f"--api {api!r}: allowed for request-level scenarios: "
                            f"{', '.join(REQUEST_APIS)}")
    scn, prof = _scenario(scenario, overrides, profile)
    say = progress or (lambda _msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = base_url(endpoint)
    drain_s = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    assert isinstance(scn.service, ProfileServiceCfg)
    overhead_s = scn.service.overheads.request_ms / 1e3 if scn.service.overheads else 0.0
    say("simulating")
    figure_sim, stored = predict(scn, out / "sim", sim_replications, drain_timeout_s=drain_s)
    payload = (scn.payload or PayloadCfg()).model_copy(
        update={"model": model or (scn.payload.model if scn.payload else None)})
    if api == "kserve-v2" and not payload.model:
        raise EndpointError("--api kserve-v2 needs the model's name: pass --model NAME or "
                            "set payload.model")
    url = base + request_path(api, payload, payload.model)
    sizes = probe_sizes(scn, prof)

    def probe(i: int, after: bool) -> dict[str, Any]:
        return probe_endpoint(url, api, payload, prof, overhead_s, sizes, server_knobs(scn),
                              seed=scn.seed * 1000 + 2 * i + after)

    def predict_probed(i: int, before: dict[str, Any], after: dict[str, Any], run_dir: Path
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
        ratios = _ratios(before, after)
        pooled = math.exp(float(np.mean([math.log(r) for r in ratios.values()])))
        drift = math.exp(float(np.mean([
            math.log(b["ratio"] / a["ratio"])
            for a, b in zip(before["sizes"], after["sizes"], strict=True)]))) - 1
        path = prof.rescaled(ratios, note={"by": "endpoint probe", "repeat": i}).save(
            run_dir / "probed-profile.json")
        service: dict[str, Any] = {"kind": "profile", "path": str(path)}
        if overhead_s:
            service["overheads"] = {"request_ms": overhead_s * 1e3 * ratios[min(ratios)]}
        record = {"repeat": i, "ratio_by_size": {str(n): r for n, r in ratios.items()},
                  "scale": pooled, "drift": drift, "before": before, "after": after}
        write_json(run_dir / "probe.json", record)
        _, mean = predict(scn, out / f"sim-{i}", sim_replications, seed=i,
                          overrides={"service": service}, drain_timeout_s=drain_s)
        return mean, record

    probing = None if probe_mode == "off" else Probing(
        probe, predict_probed, announce=lambda _i: say(f"probing the endpoint (bursts of "
                                                       f"{sizes})"))
    done = run_repeats(repeats, out, lambda: bench_requests(
        scn, base, api=api, model=payload.model, drain_timeout_s=drain_s), probing, say=say)
    rows = done.rows(stored, METRICS)
    lives = [r.summary for r in done.lives]
    data = {"scenario": scn.name, "kind": "request", "driver": "bench", "endpoint": base,
            "api": api, "model": payload.model, "repeats": repeats, "rho": rows[0]["rho"],
            "probe_mode": probe_mode if done.predictions else "off",
            "profile": scn.service.path, "overheads_ms": {"request_ms": overhead_s * 1e3},
            "sim_replications": sim_replications, "drain_timeout_s": drain_s,
            "offered_rps": stored["stability"]["offered_rps"],
            "probed": bool(done.predictions),
            "probes": [{k: p[k] for k in ("ratio_by_size", "scale", "drift")}
                       for p in done.probes],
            "client_cpu_share": [s["client"]["cpu_share"] for s in lives],
            "not_visible": [r["metric"] for r in rows if not math.isfinite(r["live_median"])],
            "rows": rows}
    write_compare(out, data)
    from executor.report import write_compare_report

    write_compare_report(out / "report.html", figure_sim, cast(list[Result], done.lives), rows)
    return data


def sweep_request_endpoint(scenario: Scenario | dict[str, Any] | str | Path, endpoint: str,
                           out_dir: str | Path, rhos: Sequence[float], *, api: str,
                           profile: str | Path | None = None, repeats: int = 3,
                           overrides: list[str] | dict[str, Any] | None = None,
                           model: str | None = None, probe_mode: str = "full",
                           sim_replications: int = 10, drain_timeout_s: float | None = None,
                           progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """:func:`compare_request_endpoint` at each target utilisation ρ of the replica (the
    rate at which the simulator, on the calibrated profile, predicts that utilisation, as
    the live ``compare --sweep`` finds it): one ``rho-R/compare.json`` per point, and every
    point's rows in ``fidelity.csv`` / ``fidelity.json``; returns the rows.

    Raises:
        UserError: no load, a load out of (0, 1), a workload without a rate, or what
            :func:`compare_request_endpoint` raises.
    """
    check_loads(rhos, 1.0)
    if api not in REQUEST_APIS:
        raise EndpointError(f"--api {api!r}: allowed for request-level scenarios: "
                            f"{', '.join(REQUEST_APIS)}")
    scn, _ = _scenario(scenario, overrides, profile)

    def point(rho: float, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        rate = rate_for_utilization(scn, rho)
        if progress:
            progress(f"rho={rho:g}: {rate:.3g} req/s (the calibrated profile's replica "
                     f"utilisation {rho:g})")
        data = compare_request_endpoint(
            load_scenario(scn, {"workload.rate_rps": rate}), endpoint, out, api=api,
            repeats=repeats, model=model, probe_mode=probe_mode,
            sim_replications=sim_replications, drain_timeout_s=drain_timeout_s,
            progress=progress)
        return {"rate_rps": rate}, data

    return sweep_loads(rhos, 1.0, out_dir, point, {
        "kind": "request", "driver": "bench", "api": api, "scenario": scn.name,
        "endpoint": base_url(endpoint)})
