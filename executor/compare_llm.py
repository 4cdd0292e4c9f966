"""``compare_llm``: simulate an LLM scenario, run it live ``repeats`` times on the decoder, and
compare TTFT/TPOT/ITL/E2E, request and token throughput, preemptions and KV utilisation.

Around each live run a **probe** re-times a few step compositions on the same decoder:
prefill-only steps of 256 and 1024 tokens and decode-only steps of 1, 8 and 16 sequences.
Their ratios to the stored profile give a prefill speed scale per chunk size and a decode
speed scale per batch of sequences (the device's drift need not touch them alike: on this
CPU a one-sequence decode and a sixteen-sequence one drift apart by up to 25%). The profile
rescaled by them (each grid point by the scales at its size, weighted by its prefill share in
the fitted linear model) is what each live run is predicted on; the stored profile's
prediction and error are kept alongside.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sim.llm
from calibration.llm_decoder import LlamaDecoder, StepEntry
from calibration.step_profile import StepProfile, load_step_profile
from executor.compare_loop import (
    FLEET_METRICS,
    Probing,
    check_compare_args,
    run_repeats,
    write_compare,
)
from executor.lifecycle import check_bounds, default_drain_s
from executor.live_budget import check_llm_engines, check_llm_plan
from executor.live_llm import (
    build_decoders,
    live_llm,
    llm_model_spec,
    resident_engines,
)
from sim.drivers.llm_simulate import build_llm_core, decoder_capacity, horizon_s
from sim.errors import UserError
from sim.experiments.llm_load import load_overrides, saturation_rps
from sim.metrics.rundir import write_json
from sim.scenario.llm import LlmScenario, load_llm_scenario

LLM_METRICS: list[tuple[str, str]] = [
    ("throughput_rps", "throughput (req/s)"),
    ("output_tokens_per_s", "output tokens/s"),
    ("goodput_rps", "goodput (req/s)"),
    ("ttft_ms.mean", "TTFT mean (ms)"), ("ttft_ms.p50", "TTFT p50 (ms)"),
    ("ttft_ms.p99", "TTFT p99 (ms)"),
    ("tpot_ms.mean", "TPOT mean (ms)"), ("tpot_ms.p50", "TPOT p50 (ms)"),
    ("tpot_ms.p99", "TPOT p99 (ms)"),
    ("itl_ms.p50", "ITL p50 (ms)"), ("itl_ms.p99", "ITL p99 (ms)"),
    ("e2e_ms.mean", "E2E mean (ms)"), ("e2e_ms.p50", "E2E p50 (ms)"),
    ("e2e_ms.p99", "E2E p99 (ms)"),
    ("preemptions", "preemptions"),
    ("kv_cache_utilization.mean", "KV cache utilisation (mean)"),
]
PROBE_PREFILL = ((256, 0, 0), (1024, 0, 0))
PROBE_DECODE = ((0, 1, 512), (0, 8, 512), (0, 16, 1024))
PROBE_MODES = ("full", "off")


def _entries(p: int, d: int, ctx: int) -> list[StepEntry]:
    return ([StepEntry(0, 0, p)] if p else []) + [StepEntry(1 + i, ctx, 1) for i in range(d)]


def probe_llm(decoder: LlamaDecoder, profile: StepProfile, reps: int = 5) -> dict[str, Any]:
    """Re-time the probe compositions; return the prefill and decode speed scales (measured
    over the profile's prediction, medians of the points' median ratios).
    """
    rows = []
    for group, points in (("prefill", PROBE_PREFILL), ("decode", PROBE_DECODE)):
        for p, d, ctx in points:
            entries = _entries(p, d, ctx)
            step = partial(decoder.step, entries)
            step()
            step()  # twice untimed: the first large step of a session pays for allocation
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            measured = float(np.median(times))
            predicted = profile.step_s(p, d, d * ctx)
            rows.append({"group": group, "prefill_tokens": p, "decode_seqs": d,
                         "context": ctx, "measured_ms": measured * 1e3,
                         "profile_ms": predicted * 1e3, "ratio": measured / predicted})
    scale = {g: float(np.median([r["ratio"] for r in rows if r["group"] == g]))
             for g in ("prefill", "decode")}
    by_size = {"prefill": _by_size(rows, "prefill", "prefill_tokens"),
               "decode": _by_size(rows, "decode", "decode_seqs")}
    return {"prefill_scale": scale["prefill"], "decode_scale": scale["decode"],
            "prefill_scale_by_tokens": by_size["prefill"],
            "decode_scale_by_seqs": by_size["decode"], "points": rows}


def _by_size(rows: list[dict[str, Any]], group: str, size: str) -> dict[int, float]:
    """A probe's ratio per step size (median over the points of that size)."""
    sizes = sorted({int(r[size]) for r in rows if r["group"] == group})
    return {n: float(np.median([r["ratio"] for r in rows
                                if r["group"] == group and int(r[size]) == n])) for n in sizes}


def compare_llm(scenario: LlmScenario | dict[str, Any] | str | Path, out_dir: str | Path, *,
                repeats: int = 3, overrides: list[str] | dict[str, Any] | None = None,
                probe_mode: str = "full", drain_timeout_s: float | None = None,
                max_wall_s: float = 600.0, force: bool = False,
                progress: Callable[[str], None] | None = None,
                decoders: list[Any] | None = None, yes: bool = False) -> dict[str, Any]:
    """Simulate, run live ``repeats`` times (probing around each), compare; write
    ``compare.json``, ``sim/``, ``sim-i/`` and ``live-i/`` run directories.

    ``decoders`` (one per replica, large enough for the scenario's requests) are reused
    instead of building new ones (a sweep builds them once).

    Raises:
        UserError: bad arguments, no step profile, or (``force=False``) a run the simulator
            predicts unstable or too long.
    """
    check_compare_args(repeats, probe_mode, PROBE_MODES, "LLM scenarios")
    scn = load_llm_scenario(scenario, overrides)
    check_llm_plan(scn, yes=yes)  # as live: before the simulation draws the plan
    if scn.service.kind not in ("llm_profile", "llm_roofline"):
        raise UserError("service.kind: compare needs a measured step profile (llm_profile) "
                        "or a roofline (llm_roofline); an llm_linear model has no device to "
                        "compare against")
    out = Path(out_dir)
    # a roofline's prediction is the one under test: no profile to rescale by probes
    stored_profile = load_step_profile(scn.service.path) \
        if scn.service.kind == "llm_profile" else None
    if stored_profile is None:
        probe_mode = "off"
    drain_s = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    stored = sim.llm.run(scn, drain_timeout_s=drain_s)  # censored like the live runs
    stored.write(out / "sim")
    core = build_llm_core(scn)
    if not force:
        check_bounds(stored.summary["stability"], float(stored.meta["end_s"]),
                     horizon_s(scn, core.arrival_s), max_wall_s=max_wall_s, repeats=repeats)
    slots, max_len = decoder_capacity(scn, core)
    if decoders is None:
        check_llm_engines(scn, llm_model_spec(scn), core, slots, max_len, yes=yes)
        decoders = build_decoders(llm_model_spec(scn), resident_engines(scn), slots, max_len)
    probe_decoder = decoders[0] if decoders else None
    if probe_mode == "full" and probe_decoder is None:  # scale from zero: one to probe
        probe_decoder = build_decoders(llm_model_spec(scn), 1, slots, max_len)[0]

    def probe_device(_i: int, _after: bool) -> dict[str, Any]:
        assert probe_decoder is not None
        assert stored_profile is not None
        return probe_llm(probe_decoder, stored_profile)

    def predict_probed(i: int, before: dict[str, Any], after: dict[str, Any], run_dir: Path
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
        scales = {k: math.sqrt(before[k] * after[k]) for k in ("prefill_scale", "decode_scale")}
        by_size = {k: {n: math.sqrt(before[k][n] * after[k][n]) for n in before[k]}
                   for k in ("prefill_scale_by_tokens", "decode_scale_by_seqs")}
        probe = {"before": before, "after": after, **scales, **by_size,
                 "drift": max(abs(after[k] / before[k] - 1) for k in scales)}
        write_json(run_dir / "probe.json", probe)
        assert stored_profile is not None
        probed = stored_profile.rescaled(by_size["prefill_scale_by_tokens"],
                                         by_size["decode_scale_by_seqs"])
        path = probed.save(run_dir / "probed-profile.json")
        predicted = sim.llm.run(scn, {"service.path": str(path)}, drain_timeout_s=drain_s)
        predicted.write(out / f"sim-{i}")
        return predicted.summary, probe

    done = run_repeats(repeats, out, lambda: live_llm(scn, drain_timeout_s=drain_s,
                                                      decoders=decoders),
                       Probing(probe_device, predict_probed) if probe_mode == "full" else None,
                       say=progress or (lambda _msg: None))
    rows = done.rows(stored.summary, LLM_METRICS + (FLEET_METRICS if scn.autoscaling else []))
    sims, probes = done.predictions, done.probes
    data = {"scenario": scn.name, "kind": "llm", "repeats": repeats, "probe_mode": probe_mode,
            "service": scn.service.kind,
            "offered_rps": stored.summary["stability"]["offered_rps"],
            "probed": bool(sims), "probes": [{k: p[k] for k in ("prefill_scale",
                                                                "decode_scale", "drift")}
                                             for p in probes],
            "rows": rows}
    return write_compare(out, data)


def sweep_llm(scenario: LlmScenario | dict[str, Any] | str | Path, out_dir: str | Path,
              rhos: Sequence[float], *, repeats: int = 3,
              overrides: list[str] | dict[str, Any] | None = None, probe_mode: str = "full",
              drain_timeout_s: float | None = None, max_wall_s: float = 600.0,
              force: bool = False, progress: Callable[[str], None] | None = None,
              yes: bool = False) -> pd.DataFrame:
    """``compare_llm`` at each target load ρ (offered request rate over the configuration's
    capacity, :mod:`sim.experiments.llm_load`); writes ``fidelity.csv``/``.json`` and returns
    the rows.

    With ``probe_mode="full"`` the capacity is found on the profile refreshed by one probe of
    the decoder taken first (saved as ``rate-probe-profile.json``), so each ρ is the load the
    device really sees; one set of decoders, sized for the largest point, serves every run.
    """
    scn = load_llm_scenario(scenario, overrides)
    if scn.service.kind != "llm_profile":
        raise UserError("service.kind: compare --sweep needs a measured step profile "
                        "(llm_profile) to size its loads; compare an llm_roofline scenario "
                        "one load at a time (without --sweep)")
    if not rhos:
        raise UserError("--sweep: give at least one load, e.g. 0.3,0.6,0.8,0.9")
    for rho in rhos:
        if not (math.isfinite(rho) and 0 < rho < 1.5):
            raise UserError(f"--sweep rho={rho}: must lie in (0, 1.5)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stored_profile = load_step_profile(scn.service.path)
    capacity_stored = saturation_rps(scn)
    # room for every point up to a device 1.5x faster than its profile (more requests)
    points = [load_llm_scenario(scn, load_overrides(scn, r * f, capacity_stored))
              for r in rhos for f in (1.0, 1.5)]
    for p in points:
        check_llm_plan(p, yes=yes)  # as live: before each point's plan is drawn
    cores = [build_llm_core(p) for p in points]
    sizes = [decoder_capacity(p, c) for p, c in zip(points, cores, strict=True)]
    slots, max_len = max(s for s, _ in sizes), max(m for _, m in sizes)
    check_llm_engines(points[-1], llm_model_spec(scn), cores[-1], slots, max_len, yes=yes)
    decoders = build_decoders(llm_model_spec(scn), max(resident_engines(scn), 1), slots,
                              max_len)
    rate_scn, capacity = scn, capacity_stored
    if probe_mode == "full":
        measured = probe_llm(decoders[0], stored_profile)
        path = stored_profile.rescaled(measured["prefill_scale_by_tokens"],
                        measured["decode_scale_by_seqs"]).save(out / "rate-probe-profile.json")
        rate_scn = load_llm_scenario(scn, {"service.path": str(path)})
        capacity = saturation_rps(rate_scn)
    rows = []
    for rho in rhos:
        ov = load_overrides(scn, rho, capacity)
        sub = load_llm_scenario(scn, ov)
        need_slots, need_len = decoder_capacity(sub, build_llm_core(sub))
        if need_slots > slots or need_len > max_len:
            raise UserError(f"--sweep rho={rho}: the probed device is so much faster than the "
                            "profile that this load's requests do not fit the decoders; "
                            "re-measure the step profile")
        if progress:
            progress(f"rho={rho:g}: capacity {capacity:.3g} req/s, "
                     + ", ".join(f"{k.split('.')[-1]} {v:.3g}" for k, v in ov.items()))
        data = compare_llm(sub, out / f"rho-{rho:g}", repeats=repeats, probe_mode=probe_mode,
                           drain_timeout_s=drain_timeout_s, max_wall_s=max_wall_s,
                           force=force, progress=progress, decoders=decoders, yes=yes)
        for row in data["rows"]:
            rows.append({"target_rho": rho, "capacity_rps": capacity,
                         "capacity_stored_rps": capacity_stored,
                         "rate_rps": rho * capacity, "offered_rps": data["offered_rps"],
                         **row})
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "fidelity.csv", index=False)
    write_json(out / "fidelity.json", {"kind": "llm", "scenario": scn.name,
                                       "capacity_rps": capacity,
                                       "capacity_stored_rps": capacity_stored, "rows": rows})
    return frame
