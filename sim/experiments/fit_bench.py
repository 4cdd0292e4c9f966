"""Fit the roofline coefficients to ``servelab bench`` runs by simulation in the loop.

Each bench directory records the scenario it ran (``scenario.yaml``: arrivals, lengths,
scheduler knobs), the server's KV knobs (``meta.json`` ``server_config``) and every request's
TTFT and E2E (``requests.parquet``). For a candidate coefficient set the simulator replays
each directory's scenario with the ``llm_roofline`` step model of the given model config,
device and tp, on the same arrival schedule, and the loss is the mean absolute relative
error of the TTFT and E2E percentiles (p50, p90, p99) against the measured ones, as BLIS
fits its trained-physics coefficients to request latencies rather than to step times.

The search is Nelder–Mead (scipy, derivative-free) over the logarithms of four multipliers
of the starting set (a step-profile NNLS fit, a shipped set or a file): one on the prefill
terms, one on the decode and weight terms, one on the fixed overheads per step, and one on
the per-request overhead outside the steps (``request_overheads.request_ms``: API and
tokenisation before the scheduler, BLIS's α₀, which only TTFT and E2E show); the step
model's bases keep their shape, the search scales what request latencies can tell apart (a
start without fixed overheads gets 100 µs per step, one without a request overhead 5 ms,
for their multipliers to scale). The set's per-output-token and post-decode overheads are
applied as they are.
Evaluations are bounded (``max_evals``), the start simplex is fixed, the held-out
directories are chosen by a seeded draw: the same inputs give the same coefficients.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sim.drivers.llm_overheads import apply_overheads
from sim.drivers.llm_simulate import build_llm_core, horizon_s, llm_cold_start, simulate, tables
from sim.errors import UserError
from sim.scenario.llm import LlmScenario, load_llm_scenario
from sim.scenario.roofline.hardware import DeviceSheet, ModelShape
from sim.scenario.roofline.model import Coefficients, RooflineStepModel

GROUPS: dict[str, tuple[str, ...]] = {
    "prefill": ("prefill_compute", "prefill_attention"),
    "decode": ("decode_compute", "decode_kv", "weights", "lm_head"),
    "overhead": ("per_layer", "per_request", "per_step"),
}
TARGETS = (("ttft_ms", 50), ("ttft_ms", 90), ("ttft_ms", 99), ("e2e_ms", 50),
           ("e2e_ms", 90), ("e2e_ms", 99))
# the fourth multiplier: the per-request overhead outside the steps (ms)
REQUEST = "request_ms"
PARAMS = (*GROUPS, REQUEST)
KV_POLICIES = ("continuous", "vllm", "sarathi")
SEED_PER_STEP_US = 100.0
SEED_REQUEST_MS = 5.0


@dataclass(frozen=True)
class BenchRun:
    """One bench directory: the scenario to replay and the measured percentiles."""

    name: str
    scenario: LlmScenario
    drain_s: float | None
    measured: dict[str, float]


def percentiles(requests: pd.DataFrame, warmup_s: float) -> dict[str, float]:
    """TTFT and E2E percentiles (ms) of the finished requests that arrived after warm-up."""
    done = requests[np.isfinite(requests["finish_s"].to_numpy(float))
                    & (requests["arrival_s"].to_numpy(float) >= warmup_s)]
    if "status" in done:
        done = done[done["status"].astype(str).isin(("ok", "finished", "done"))]
    out: dict[str, float] = {}
    if done.empty:
        return out
    arrival = done["arrival_s"].to_numpy(float)
    ttft = (done["first_token_s"].to_numpy(float) - arrival) * 1e3
    e2e = (done["finish_s"].to_numpy(float) - arrival) * 1e3
    for (metric, q) in TARGETS:
        out[f"{metric}.p{q}"] = float(np.percentile(ttft if metric == "ttft_ms" else e2e, q))
    return out


def load_bench_run(path: str | Path, service: dict[str, Any]) -> BenchRun:
    """A bench directory replayed with ``service`` (an ``llm_roofline`` service mapping).

    The scenario's KV policy takes the server's block size and block count when its
    ``/metrics`` page gave them.

    Raises:
        UserError: not a bench directory, or no finished request to fit (named).
    """
    folder = Path(path)
    try:
        scenario = yaml.safe_load((folder / "scenario.yaml").read_text())
        meta = json.loads((folder / "meta.json").read_text())
        requests = pd.read_parquet(folder / "requests.parquet")
    except (OSError, yaml.YAMLError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise UserError(f"--bench {str(path)!r}: not a servelab bench directory (needs "
                        f"scenario.yaml, meta.json, requests.parquet): {exc}") from None
    if not isinstance(meta, dict) or meta.get("driver") != "bench":
        raise UserError(f"--bench {str(path)!r}: meta.json says driver "
                        f"{(meta or {}).get('driver')!r}; give a servelab bench directory")
    policy = dict(scenario.get("policy") or {})
    knobs = meta.get("server_config") or {}
    if policy.get("kind") in KV_POLICIES:
        if isinstance(knobs.get("block_size"), int):
            policy["block_size"] = knobs["block_size"]
        if isinstance(knobs.get("num_blocks"), int):
            policy["num_gpu_blocks"] = knobs["num_blocks"]
            policy.pop("gpu_memory_gb", None)
    scn = load_llm_scenario({**scenario, "service": service, "policy": policy})
    measured = percentiles(requests, scn.warmup_s)
    if not measured:
        raise UserError(f"--bench {str(path)!r}: no request finished after warm-up; nothing "
                        "to fit")
    drain = meta.get("drain_timeout_s")
    return BenchRun(folder.name, scn, float(drain) if drain is not None else None, measured)


def simulate_run(run: BenchRun, shape: ModelShape, device: DeviceSheet, tp: int,
                 coefficients: Coefficients) -> dict[str, float]:
    """The percentiles of one bench run's scenario simulated with ``coefficients`` (their
    per-request overheads applied as :func:`sim.llm.run` applies ``service.overheads``).
    """
    core = build_llm_core(run.scenario)
    model = RooflineStepModel(shape, device, tp, coefficients)
    arrival_s = core.arrival_s
    until = math.inf if run.drain_s is None else horizon_s(run.scenario, arrival_s) \
        + run.drain_s
    over = coefficients.overheads
    core.arrival_s = arrival_s + over.get(REQUEST, 0.0) / 1e3
    simulate(core, model, until, llm_cold_start(run.scenario))
    requests, _, tokens, _ = tables(core)
    requests, _, _ = apply_overheads(requests, tokens, core.token_s, core.token_offset,
                                     arrival_s, over.get("per_output_token_ms", 0.0) / 1e3,
                                     over.get("post_decode_ms", 0.0) / 1e3)
    return percentiles(requests, run.scenario.warmup_s)


def run_errors(sim: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """Signed relative error of every percentile (> 0: the simulation is slow)."""
    return {k: (sim[k] - v) / v if k in sim and v > 0 else math.inf
            for k, v in measured.items()}


def scaled(start: Coefficients, log_scales: np.ndarray, name: str) -> Coefficients:
    """``start`` with each group's terms multiplied by ``exp`` of its log-scale (one per
    :data:`GROUPS`, then optionally one for the request overhead).
    """
    values = dict(start.values)
    for (_, terms), s in zip(GROUPS.items(), log_scales[:len(GROUPS)], strict=True):
        for term in terms:
            values[term] = start.values[term] * math.exp(float(s))
    over = dict(start.overheads)
    if len(log_scales) > len(GROUPS):
        over[REQUEST] = over.get(REQUEST, 0.0) * math.exp(float(log_scales[len(GROUPS)]))
    return Coefficients(values, name, dict(start.meta), over)


def split(runs: list[BenchRun], holdout: float, seed: int) -> tuple[list[BenchRun],
                                                                    list[BenchRun]]:
    """(train, held out): a seeded draw of ``round(holdout × n)`` runs (at least one when
    ``holdout > 0`` and two runs or more), the rest for training.

    Raises:
        UserError: a bad share, or nothing left to train on.
    """
    if not 0 <= holdout < 1:
        raise UserError(f"--holdout: {holdout} must be in [0, 1)")
    n_out = max(1, round(holdout * len(runs))) if holdout > 0 and len(runs) > 1 else 0
    test = set(np.random.default_rng(seed).choice(len(runs), size=n_out, replace=False)
               .tolist()) if n_out else set()
    return ([r for i, r in enumerate(runs) if i not in test],
            [r for i, r in enumerate(runs) if i in test])


def fit_bench(runs: list[BenchRun], shape: ModelShape, device: DeviceSheet, tp: int,
              start: Coefficients, *, holdout: float = 0.34, seed: int = 0,
              max_evals: int = 120, name: str = "fitted-bench", fit_request: bool = True
              ) -> Coefficients:
    """Coefficients that minimise the training runs' mean |relative error| of the TTFT and
    E2E percentiles; the held-out runs' errors, before and after, go in ``meta.fit``.
    ``fit_request=False`` keeps the start's request overhead as it is (the three step-term
    multipliers only: what the fit did before it had the fourth).

    Raises:
        UserError: no runs, a bad share or budget.
    """
    from scipy.optimize import minimize

    if not runs:
        raise UserError("--bench: give at least one bench directory")
    params = PARAMS if fit_request else tuple(GROUPS)
    if max_evals < len(params) + 1:
        raise UserError(f"--max-evals {max_evals}: must be >= {len(params) + 1} (the "
                        f"simplex has {len(params) + 1} points)")
    train, test = split(runs, holdout, seed)
    if not any(start.values[t] for t in GROUPS["overhead"]):
        # a start without fixed overheads (a step-profile fit of a bare decoder) gets a
        # seed per step for the search to scale: a server adds its own per step
        start = Coefficients({**start.values, "per_step": SEED_PER_STEP_US}, start.name,
                             start.meta, start.overheads)
    if fit_request and not start.overheads.get(REQUEST):  # likewise without a request one
        start = Coefficients(start.values, start.name, start.meta,
                             {**start.overheads, REQUEST: SEED_REQUEST_MS})
    history: list[float] = []

    def loss(x: np.ndarray) -> float:
        if np.any(np.abs(x) > math.log(1e3)):  # a thousandfold off the start: out of bounds
            return 1e9
        coeffs = scaled(start, x, name)
        errs = [abs(e) for r in train for e in run_errors(
            simulate_run(r, shape, device, tp, coeffs), r.measured).values()]
        value = float(np.mean(np.minimum(errs, 1e3)))
        history.append(value)
        return value

    simplex = np.vstack([np.zeros(len(params)), 0.5 * np.eye(len(params))])
    result = minimize(loss, np.zeros(len(params)), method="Nelder-Mead",
                      options={"initial_simplex": simplex, "maxfev": max_evals,
                               "xatol": 0.01, "fatol": 1e-4})
    best = scaled(start, result.x, name)
    report: dict[str, Any] = {}
    for label, coeffs in (("start", start), ("fitted", best)):
        report[label] = {r.name: {"split": "train" if r in train else "held_out",
                                  "errors": run_errors(simulate_run(r, shape, device, tp,
                                                                    coeffs), r.measured)}
                         for r in runs}
    meta = {**start.meta,
            "fitted_on": {"bench_runs": [r.name for r in runs], "models": [shape.name],
                          "devices": [device.name], "tp": tp,
                          "engines": ["the servers the bench directories measured"]},
            "fit": {"method": "simulation in the loop: Nelder-Mead on log multipliers of "
                              "the start set's step-term groups and request overhead, mean "
                              "|relative error| of TTFT and E2E p50/p90/p99",
                    "start": start.name, "seed": seed,
                    "holdout": holdout, "max_evals": max_evals,
                    "evaluations": len(history), "loss_start": history[0] if history
                    else None, "loss_fitted": float(result.fun),
                    "group_multipliers": {g: math.exp(float(s)) for g, s in
                                          zip(params, result.x, strict=True)},
                    "request_ms": {"start": start.overheads.get(REQUEST, 0.0),
                                   "fitted": best.overheads.get(REQUEST, 0.0)},
                    "train": [r.name for r in train], "held_out": [r.name for r in test],
                    "runs": report}}
    return Coefficients(best.values, name, meta, best.overheads)


def mean_abs(report: dict[str, Any], which: str) -> float | None:
    """Mean |relative error| over the runs of one split (``train`` / ``held_out``)."""
    errs = [abs(e) for r in report.values() if r["split"] == which
            for e in r["errors"].values()]
    return float(np.mean(errs)) if errs else None
