"""``compare_endpoint``: predict an LLM scenario with a step profile calibrated from an
endpoint (``servelab calibrate --endpoint``), measure it with ``bench`` ``repeats`` times,
and write the ``compare.json`` the live LLM compare writes (same rows:
:func:`executor.compare.compare_rows` over :data:`executor.compare_llm.LLM_METRICS`).

Around each run a short probe (one-token prefills of two lengths, decode streams of one and
of eight sequences) re-measures the server against the profile: its prefill and decode speed
scales per step size, geometric means of before and after (1 where that lies within their
difference from each other: the probe's noise, not the server's drift), rescale the profile
(:meth:`calibration.step_profile.StepProfile.rescaled`, interpolating between the probed
sizes) for that run's prediction, and their largest change between before and after is the
run's drift. One sequence's scale alone would rescale every decode step by the drift of its
fixed costs. The stored profile's prediction and error are kept beside.

``sweep_endpoint`` does that at several target loads ρ (``compare --endpoint --sweep``).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sim.llm
from calibration.step_profile import StepProfile, load_step_profile
from executor.compare import compare_rows
from executor.compare_llm import LLM_METRICS
from executor.endpoint import probes, server_info
from executor.endpoint.bench import bench, preflight
from executor.endpoint.calibrate import endpoint_overrides
from executor.endpoint.client import APIS
from executor.endpoint.sweep_points import check_loads, sweep_loads
from sim.drivers.llm_overheads import overheads_s
from sim.errors import UserError
from sim.experiments.llm_load import load_overrides, saturation_rps
from sim.metrics.rundir import write_json
from sim.metrics.window import default_drain_s
from sim.scenario.llm import LlmProfileServiceCfg, LlmScenario, load_llm_scenario

PROBE_PREFILL_TOKENS = (64, 256)
PROBE_DECODE_SEQS = (1, 8)
# prompt and output tokens: calibrate --endpoint's decode probe (prompt 32, 64 outputs less
# 16), so a probe times exactly what a grid point of the profile holds
PROBE_DECODE = (32, 64)


def probe_endpoint(target: probes.Target, profile: StepProfile, request_s: float,
                   per_token_s: float, reps: int = 3) -> dict[str, Any]:
    """Measured over predicted, per step size (a drift need not touch a short and a long
    step alike, and one sequence's step is mostly fixed costs): prefill (TTFT over the
    request overhead plus the profile's prefill step, at each of
    :data:`PROBE_PREFILL_TOKENS` the profile's grid reaches: the overhead can dwarf a short
    prefill, so the whole is compared) and decode (ITL over the profile's decode step plus
    the per-token overhead, at each of :data:`PROBE_DECODE_SEQS` it reaches).
    """
    prompt, output = PROBE_DECODE
    ctx = prompt + output // 2
    prefill: dict[int, float] = {}
    decode: dict[int, float] = {}
    ttft_ms: dict[str, float] = {}
    itl_ms: dict[str, float] = {}
    for size in (p for p in PROBE_PREFILL_TOKENS if p <= max(profile.prefill_tokens)):
        ttft = float(np.median(probes.prefill_ttft_s(target, size, reps)))
        prefill[size] = ttft / (request_s + profile.step_s(size, 0, 0))
        ttft_ms[str(size)] = ttft * 1e3
    for seqs in (d for d in PROBE_DECODE_SEQS if d <= max(profile.decode_seqs)):
        gaps = probes.decode_itl_s(target, seqs, prompt, output, runs=max(1, 3 // seqs))
        if not gaps:
            raise UserError("probe: the server streamed no separate tokens to time (all in "
                            "one chunk?); use --probe off")
        itl = float(np.median(gaps))
        decode[seqs] = itl / (profile.step_s(0, seqs, seqs * ctx) + per_token_s)
        itl_ms[str(seqs)] = itl * 1e3
    return {"ttft_ms": ttft_ms, "itl_ms": itl_ms,
            "prefill_scale": float(np.median(list(prefill.values()))),
            "decode_scale": float(np.median(list(decode.values()))),
            "prefill_scale_by_tokens": prefill, "decode_scale_by_seqs": decode}


def _geomean(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """Each size's scale: the geometric mean of before and after, where it differs from 1
    by more than before and after differ from each other (the probe's own noise); else 1
    (no evidence that the server's speed moved: rescaling by noise only adds error).
    """
    out = {}
    for k in before:
        scale, noise = math.sqrt(before[k] * after[k]), abs(after[k] / before[k] - 1)
        out[k] = scale if abs(scale - 1) > noise else 1.0
    return out


def _drift(before: dict[str, Any], after: dict[str, Any]) -> float:
    """The largest change of any probed size's scale between before and after."""
    return float(max(abs(after[k][size] / before[k][size] - 1)
                     for k in ("prefill_scale_by_tokens", "decode_scale_by_seqs")
                     for size in before[k]))


def _scenario(scenario: LlmScenario | dict[str, Any] | str | Path,
              overrides: list[str] | dict[str, Any] | None, profile: str | Path | None
              ) -> LlmScenario:
    scn = load_llm_scenario(scenario, overrides)
    if profile is not None:
        scn = load_llm_scenario(scn, endpoint_overrides(profile))
    if scn.service.kind not in ("llm_profile", "llm_roofline"):
        raise UserError("service.kind: compare --endpoint predicts with a calibrated step "
                        "profile (pass --profile PROFILE.json, from servelab calibrate "
                        "--endpoint) or a roofline (service.kind llm_roofline)")
    return scn


def compare_endpoint(scenario: LlmScenario | dict[str, Any] | str | Path, endpoint: str,
                     out_dir: str | Path, *, profile: str | Path | None = None,
                     repeats: int = 3, overrides: list[str] | dict[str, Any] | None = None,
                     model: str | None = None, probe_mode: str = "full",
                     drain_timeout_s: float | None = None,
                     progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Simulate, bench ``repeats`` times (probing around each), compare; write
    ``compare.json``, ``sim/``, ``sim-i/`` and ``bench-i/`` run directories.

    Raises:
        UserError: bad arguments, no profile, or an unusable endpoint (one line).
    """
    if repeats < 1:
        raise UserError(f"--repeats {repeats}: must be >= 1")
    if probe_mode not in ("full", "off"):
        raise UserError(f"--probe {probe_mode!r}: allowed with --endpoint: full, off")
    scn = _scenario(scenario, overrides, profile)
    base = server_info.base_url(endpoint)
    listed = server_info.models(base)
    names = [str(m.get("id")) for m in (listed or {}).get("data", []) if isinstance(m, dict)]
    # a roofline's prediction is the one under test: no profile for the probes to rescale
    stored_profile = load_step_profile(scn.service.path) \
        if isinstance(scn.service, LlmProfileServiceCfg) else None
    if stored_profile is None:
        probe_mode = "off"
    model = model or (stored_profile.meta.get("model") if stored_profile else None) or (
        names[0] if names else None)
    if model is None:
        raise UserError(f"{base}/v1/models lists no model: pass --model NAME")
    url = base + APIS["openai-completions"]
    preflight(url, "openai-completions", model)
    out = Path(out_dir)
    request_s, per_token_s, post_decode_s = overheads_s(scn)
    drain_s = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    stored = sim.llm.run(scn, drain_timeout_s=drain_s)
    stored.write(out / "sim")
    # fresh probe prompts (an earlier compare's are in the server's prefix cache)
    target = probes.Target(url, model, np.random.default_rng([scn.seed, 2930,
                                                              secrets.randbits(31)]))
    lives, sims, probe_rows = [], [], []
    for i in range(1, repeats + 1):
        before = probe_endpoint(target, stored_profile, request_s, per_token_s) \
            if probe_mode == "full" and stored_profile is not None else None
        if progress:
            progress(f"bench run {i}/{repeats}")
        result = bench(scn, base, model=model, drain_timeout_s=drain_s)
        run_dir = result.write(out / f"bench-{i}")
        lives.append(result.summary)
        if before is None or stored_profile is None:
            continue
        after = probe_endpoint(target, stored_profile, request_s, per_token_s)
        scales = {k: math.sqrt(before[k] * after[k]) for k in ("prefill_scale", "decode_scale")}
        by_size = {k: _geomean(before[k], after[k])
                   for k in ("prefill_scale_by_tokens", "decode_scale_by_seqs")}
        probe = {"before": before, "after": after, **scales, **by_size,
                 "drift": _drift(before, after)}
        write_json(run_dir / "probe.json", probe)
        path = stored_profile.rescaled(by_size["prefill_scale_by_tokens"],
                                       by_size["decode_scale_by_seqs"]
                                       ).save(run_dir / "probed-profile.json")
        predicted = sim.llm.run(scn, {"service.path": str(path)}, drain_timeout_s=drain_s)
        predicted.write(out / f"sim-{i}")
        sims.append(predicted.summary)
        probe_rows.append(probe)
    rows = compare_rows(sims if sims else stored.summary, lives,
                        stored_summary=stored.summary if sims else None, metrics=LLM_METRICS)
    data = {"scenario": scn.name, "kind": "llm", "driver": "bench", "endpoint": base,
            "model": model, "repeats": repeats, "probe_mode": probe_mode,
            "profile": scn.service.path if isinstance(scn.service, LlmProfileServiceCfg)
            else None, "service": scn.service.kind,
            "overheads_ms": {"request_ms": request_s * 1e3,
                             "per_output_token_ms": per_token_s * 1e3,
                             "post_decode_ms": post_decode_s * 1e3},
            "offered_rps": stored.summary["stability"]["offered_rps"],
            "probed": bool(sims),
            "probes": [{k: p[k] for k in ("prefill_scale", "decode_scale", "drift")}
                       for p in probe_rows],
            "client_cpu_share": [s["client"]["cpu_share"] for s in lives],
            "rows": rows}
    write_json(out / "compare.json", data)
    return data


def sweep_endpoint(scenario: LlmScenario | dict[str, Any] | str | Path, endpoint: str,
                   out_dir: str | Path, rhos: Sequence[float], *,
                   profile: str | Path | None = None, repeats: int = 3,
                   overrides: list[str] | dict[str, Any] | None = None,
                   model: str | None = None, probe_mode: str = "full",
                   drain_timeout_s: float | None = None,
                   progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """:func:`compare_endpoint` at each target load ρ (offered request rate over the
    calibrated configuration's capacity, :mod:`sim.experiments.llm_load`, as the live
    ``compare --sweep`` sets it): one ``rho-R/compare.json`` per point, and every point's
    rows in ``fidelity.csv`` / ``fidelity.json``; returns the rows.

    Raises:
        UserError: no load, a load out of (0, 1.5), or what :func:`compare_endpoint` raises.
    """
    check_loads(rhos, 1.5)  # before the capacity search
    scn = _scenario(scenario, overrides, profile)
    capacity = saturation_rps(scn)

    def point(rho: float, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        ov = load_overrides(scn, rho, capacity)
        if progress:
            progress(f"rho={rho:g}: capacity {capacity:.3g} req/s on the calibrated profile, "
                     + ", ".join(f"{k.split('.')[-1]} {v:.3g}" for k, v in ov.items()))
        data = compare_endpoint(load_llm_scenario(scn, ov), endpoint, out, repeats=repeats,
                                model=model, probe_mode=probe_mode,
                                drain_timeout_s=drain_timeout_s, progress=progress)
        return {"capacity_rps": capacity, "rate_rps": rho * capacity}, data

    return sweep_loads(rhos, 1.5, out_dir, point, {
        "kind": "llm", "driver": "bench", "scenario": scn.name,
        "endpoint": server_info.base_url(endpoint), "capacity_rps": capacity})
