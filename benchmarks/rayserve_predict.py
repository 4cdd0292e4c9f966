"""The predictions of ``benchmarks/fidelity_rayserve.py`` (one job: from a results file's
saved profiles and raw logs to each row's predicted values and errors; the simulator is
deterministic, the measurements are kept as they are).

Each prediction is the mean over ``SEEDS`` simulated runs as long as a measured one, on
the measured runs' arrival schedule (the scenario's seed 11, which the bench sends too)
with service-time seeds 11 to 30: a 10 s run's p99 rests on its three slowest requests, and
one seed's p99 moves by 14-29% (sd) from seed to seed at these loads, more than the
targets.

The main prediction is the calibrated profile with Ray's batching rule as read in its
source (``timer: arrival``) and the measured departures from it, each measured on the
*other* setting's runs (the replica's own stamps and batch log): the lateness that makes the
rule form Ray's batches (:func:`benchmarks.rayserve_paths.batching_lateness_ms`), the
hand-over between batches, and the front end's work that lengthens a running batch
(``service.overheads.arrival_busy_ms`` / ``answer_busy_ms``, ``sim/drivers/contention.py``;
fitted by :func:`benchmarks.rayserve_paths.contention_ms`). Beside it: the earlier models
and diagnostics (see :data:`benchmarks.rayserve_report.OTHER`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import sim
from benchmarks import rayserve_paths
from calibration.profile import LatencyProfile, load_profile

ROOT = Path(__file__).resolve().parents[1]
SEEDS = tuple(range(11, 31))


def _row(summary: dict[str, Any]) -> dict[str, float]:
    lat = summary["latency_ms"]
    return {"latency_p50_ms": lat["p50"], "latency_p99_ms": lat["p99"],
            "latency_mean_ms": lat["mean"], "throughput_rps": summary["throughput_rps"],
            "mean_batch_size": summary["mean_batch_size"]}


def _errors(pred: float, row: dict[str, Any]) -> tuple[float, float, float]:
    """(error against the runs' mean, and against the runs' two extremes)."""
    lo, hi, mean = row["live_min"], row["live_max"], row["live_mean"]
    return (pred - mean) / mean, (pred - hi) / hi, (pred - lo) / lo


def _service(st: dict[str, Any], overheads: dict[str, float]) -> dict[str, Any]:
    service: dict[str, Any] = {"kind": "profile", "path": str(ROOT / st["profile"])}
    if any(overheads.values()):
        service["overheads"] = overheads
    return service


def _saved(samples: dict[int, np.ndarray], name: str) -> str:
    path = Path(tempfile.mkdtemp(prefix="rayfid-")) / f"{name}.json"
    LatencyProfile(samples, model={"name": name}, extrapolate=True).save(path)
    return str(path)


def _deconvolved(runs: list[dict[str, Any]], cont: dict[str, float]) -> dict[int, np.ndarray]:
    """Ray's logged batch times less the front end's share by the fitted rule (each send
    during a batch, each answer of the batch before when it followed at once), by size.
    """
    c_in, c_out = cont["arrival_busy_ms"] / 1e3, cont["answer_busy_ms"] / 1e3
    out: dict[int, list[float]] = {}
    for run in runs:
        sent = np.sort([c[2] for c in run["client"] if c[2] is not None])
        prev: list[float] | None = None
        for size, start, finish in run["batches"]:
            during = np.searchsorted(sent, finish) - np.searchsorted(sent, start)
            answers = prev[0] if prev is not None and start - prev[2] < 0.004 else 0.0
            out.setdefault(int(size), []).append(
                max(finish - start - c_in * during - c_out * answers, 1e-4))
            prev = [float(size), start, finish]
    return {b: np.array(v) for b, v in out.items() if len(v) >= 5}


def _models(st: dict[str, Any], out: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Every model of one setting: name -> (scenario overrides, timer)."""
    over = st["request_overhead"]["request_ms"]
    profile_path = ROOT / st["profile"]
    busy_path = profile_path.with_name(profile_path.stem + "-overhead-as-busy.json")
    models: dict[str, tuple[dict[str, Any], str]] = {
        "first_overhead": ({"service": _service(st, {"request_ms": over})}, "first"),
        "arrival_overhead": ({"service": _service(st, {"request_ms": over})}, "arrival"),
        "overhead_as_busy": ({"service": {"kind": "profile", "path": str(busy_path)}},
                             "first")}
    other = next((o for o in out["settings"] if o["setting"] != st["setting"]
                  and o.get("raw")), None)
    if other is None or not st.get("raw"):
        models["main"] = models["first_overhead"]
        return models
    other_raw = other["raw"]
    stage = rayserve_paths.stage_overheads(other_raw)
    stage["fitted_on"] = other["setting"]
    st["proxy_stage"] = stage
    models["arrival_proxy"] = ({"service": _service(st, stage["overheads"])}, "arrival")
    late = rayserve_paths.timer_lateness_ms(other_raw, other["max_batch_size"],
                                            other["window_ms"])
    hand = rayserve_paths.handover_ms(other_raw, other["window_ms"])
    cont = rayserve_paths.contention_ms(other_raw)
    batching = rayserve_paths.batching_lateness_ms(other_raw, other["max_batch_size"],
                                                   other["window_ms"])
    st["timer_lateness_ms"], st["handover_ms"], st["contention_ms"] = late, hand, cont
    st["batching_lateness_ms"] = batching
    window = st["window_ms"] + late["p50"]
    models["arrival_late"] = ({"service": _service(st, {"request_ms": over}),
                               "policy.max_wait_ms": window}, "arrival")
    profile = load_profile(profile_path)
    hand_path = profile_path.with_name(profile_path.stem + "-handover.json")
    profile.rescaled({min(profile.samples_s): 1.0}, add_s=hand["mean"] / 1e3).save(hand_path)
    hand_service = {"kind": "profile", "path": str(hand_path),
                    "overheads": {"request_ms": over}}
    models["arrival_late_handover"] = ({"service": hand_service,
                                        "policy.max_wait_ms": window}, "arrival")
    models["measured_path"] = ({"service": {**hand_service, "overheads": {
        "request_ms": stage["fit"]["outside_ms_p50"]}}, "policy.max_wait_ms": window},
        "arrival")
    # the front end's share, read out of what the calibration measured: a pair's gap (the
    # profile's busy time) is the second batch's own time, one hand-over and the first
    # burst's answers (c_out each); the first burst's latency less the gap and the window
    # (the outside time) holds the timer's lateness, less a hand-over, plus the second
    # burst's sends during the first batch less those answers ((c_in - c_out) per request)
    c_in, c_out = cont["arrival_busy_ms"], cont["answer_busy_ms"]
    n0 = int(st["request_overhead"].get("from_size") or 1)
    outside = max(over - late["p50"] - (c_in - c_out) * n0 + hand["mean"], 0.0)
    own = _saved({b: np.maximum(v - c_out * b / 1e3, 1e-4)
                  for b, v in profile.samples_s.items()}, "calibrated-less-answers")
    contention = {"request_ms": outside, "arrival_busy_ms": c_in, "answer_busy_ms": c_out}
    models["contention"] = ({"service": {"kind": "profile", "path": own, "extrapolate": True,
                                         "overheads": contention},
                             "policy.max_wait_ms": window}, "arrival")
    # the same with the window that reproduces Ray's batches on the other setting's stamps
    # (the outside time then less that lateness: a lone request's latency stays the one
    # the calibration measured)
    late_b = batching["late_ms"]
    batched = {**contention, "request_ms": max(outside + late["p50"] - late_b, 0.0)}
    models["contention_batching"] = ({"service": {**models["contention"][0]["service"],
                                                  "overheads": batched},
                                      "policy.max_wait_ms": st["window_ms"] + late_b},
                                     "arrival")
    st["contention_overheads"] = batched
    models["main"] = models["contention_batching"]
    return models


def _replays(st: dict[str, Any], rho: float, models: dict[str, Any]) -> dict[str, Any]:
    """Diagnostics, not predictions: the batch times Ray logged at this load on this
    setting, as they are (with the measured hand-over) and less the front end's share with
    the contention rule on top.
    """
    if "arrival_late_handover" not in models:
        return {}
    runs = [r for r in st.get("raw", []) if r["rho"] == rho]
    raw: dict[int, list[float]] = {}
    for run in runs:
        for size, start, finish in run["batches"]:
            raw.setdefault(int(size), []).append(finish - start)
    hand_s = st["handover_ms"]["mean"] / 1e3
    logged = _saved({b: np.array(v) + hand_s for b, v in raw.items() if len(v) >= 5},
                    "ray-batch-log")
    overrides, timer = models["arrival_late_handover"]
    out = {"replay_ray_busy": ({**overrides, "service": {**overrides["service"],
                                                          "path": logged,
                                                          "extrapolate": True}}, timer)}
    base = _saved({b: v + hand_s for b, v in _deconvolved(runs, st["contention_ms"]).items()},
                  "ray-batch-log-less-front-end")
    cont = st["contention_ms"]
    out["replay_contention"] = ({**overrides, "service": {
        "kind": "profile", "path": base, "extrapolate": True, "overheads": {
            "request_ms": overrides["service"]["overheads"]["request_ms"],
            "arrival_busy_ms": cont["arrival_busy_ms"],
            "answer_busy_ms": cont["answer_busy_ms"]}}}, timer)
    return out


def repredict(out: dict[str, Any], seeds: tuple[int, ...] = SEEDS) -> None:
    """Recompute every prediction of a results file (rows get ``predicted``, ``error``,
    ``error_min``/``error_max`` against the runs' extremes and ``pred_sd`` for the main
    model, ``predicted_NAME``/``error_NAME`` for the others).
    """
    out["pred_seeds"] = len(seeds)
    if any(st.get("raw") for st in out["settings"]):
        out["main_model"] = (
            "`timer: arrival` (Ray's rule), `max_wait_ms` = the window + the lateness that "
            "makes the rule form Ray's batches on the batcher's own stamps; the calibrated "
            "busy times less the answers' share, with the front end's contention "
            "(`service.overheads.arrival_busy_ms`, `answer_busy_ms`); the calibrated outside "
            "time less that lateness and the contention it holds; lateness, hand-over and "
            "contention measured on the other setting's runs")
    for st in out["settings"]:
        for r in st["rows"]:  # older files: the runs' extremes from the first error range
            if "live_min" not in r:
                r["live_min"] = r["predicted"] / (1 + r["error_max"])
                r["live_max"] = r["predicted"] / (1 + r["error_min"])
        if st.get("raw"):
            st["rule_check"] = [rayserve_paths.rule_check_runs(
                [r for r in st["raw"] if r["rho"] == rho], st["max_batch_size"],
                st["window_ms"]) for rho in sorted({r["rho"] for r in st["raw"]})]
        models = _models(st, out)
        for rho in sorted({r["rho"] for r in st["rows"]}):
            rows = [r for r in st["rows"] if r["rho"] == rho]
            scenario = {"name": f"ray-{st['setting']}-rho{rho}", "seed": seeds[0],
                        "service": _service(st, {}),
                        "workload": {"kind": "poisson", "rate_rps": rows[0]["rate_rps"],
                                     "duration_s": out["duration_s"]},
                        "policy": {"kind": "dynamic", "max_batch_size": st["max_batch_size"],
                                   "max_wait_ms": st["window_ms"], "timer": "first"},
                        "warmup_s": 1}
            for name, (overrides, timer) in {**models, **_replays(st, rho, models)}.items():
                runs = [_row(sim.run(scenario, {**overrides, "policy.timer": timer},
                                     service_seed=seed).summary) for seed in seeds]
                for r in rows:
                    values = np.array([p[r["metric"]] for p in runs], dtype=float)
                    pred = float(values.mean())
                    err, lo, hi = _errors(pred, r)
                    if name == "main":
                        r["predicted"], r["error"] = pred, err
                        r["error_min"], r["error_max"] = min(lo, hi), max(lo, hi)
                        r["pred_spread"] = float(values.std() / pred) if pred else 0.0
                        r["pred_seeds"] = len(seeds)
                    else:
                        r[f"predicted_{name}"], r[f"error_{name}"] = pred, err
