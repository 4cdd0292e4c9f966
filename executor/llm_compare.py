"""``compare_llm``: simulate an LLM scenario, run it live ``repeats`` times on the decoder, and
compare TTFT/TPOT/ITL/E2E, request and token throughput, preemptions and KV utilisation.

Around each live run a **probe** re-times a few step compositions on the same decoder:
prefill-only and decode-only steps. Their ratios to the stored profile give a prefill speed
scale and a decode speed scale (the device's drift need not touch both alike). The profile
rescaled by them (each grid point by the scales weighted by its prefill share in the fitted
linear model) is what each live run is predicted on; the stored profile's prediction and
error are kept alongside.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import sim.llm
from calibration.errors import UserError
from calibration.llm_decoder import LlamaDecoder, StepEntry
from calibration.step_profile import StepProfile, load_step_profile
from executor.compare import compare_rows
from executor.llm_run import build_decoders, check_llm_bounds, live_llm, llm_model_spec
from sim.llm.runner import build_llm_core, decoder_capacity, default_drain_s, horizon_s
from sim.llm.scenario import LlmScenario, load_llm_scenario
from sim.rundir import write_json

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
    return {"prefill_scale": scale["prefill"], "decode_scale": scale["decode"], "points": rows}


def rescaled(profile: StepProfile, prefill_scale: float, decode_scale: float) -> StepProfile:
    """The profile with each grid point's samples scaled by its prefill share (from the fitted
    linear model) times ``prefill_scale`` plus the rest times ``decode_scale``.
    """
    fit = profile.fit
    samples = {}
    for key, values in profile.samples_s.items():
        p, d, ctx = (int(v) for v in key.split(","))
        prefill = fit["b_ms_per_prefill_token"] * p
        total = fit["a_ms"] + prefill + fit["c_ms_per_decode_seq"] * d \
            + fit["d_ms_per_kv_token"] * d * ctx
        share = min(max(prefill / total, 0.0), 1.0) if total > 0 else 0.0
        factor = share * prefill_scale + (1 - share) * decode_scale
        samples[key] = [v * factor for v in values]
    meta = {**profile.meta, "rescaled": {"prefill_scale": prefill_scale,
                                         "decode_scale": decode_scale}}
    context = {k: [v * prefill_scale for v in values]
               for k, values in profile.prefill_context_s.items()}
    return StepProfile(profile.prefill_tokens, profile.decode_seqs, profile.context_tokens,
                       samples, meta=meta, prefill_context_s=context)


def compare_llm(scenario: LlmScenario | dict[str, Any] | str | Path, out_dir: str | Path, *,
                repeats: int = 3, overrides: list[str] | dict[str, Any] | None = None,
                probe_mode: str = "full", drain_timeout_s: float | None = None,
                max_wall_s: float = 600.0, force: bool = False,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Simulate, run live ``repeats`` times (probing around each), compare; write
    ``compare.json``, ``sim/``, ``sim-i/`` and ``live-i/`` run directories.

    Raises:
        UserError: bad arguments, no step profile, or (``force=False``) a run the simulator
            predicts unstable or too long.
    """
    if repeats < 1:
        raise UserError(f"--repeats {repeats}: must be >= 1")
    if probe_mode not in PROBE_MODES:
        raise UserError(f"--probe {probe_mode!r}: allowed for LLM scenarios: "
                        f"{', '.join(PROBE_MODES)}")
    scn = load_llm_scenario(scenario, overrides)
    if scn.service.kind != "llm_profile":
        raise UserError("service.kind: compare needs a measured step profile (llm_profile); "
                        "an llm_linear model has no device to compare against")
    out = Path(out_dir)
    stored_profile = load_step_profile(scn.service.path)
    drain_s = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    stored = sim.llm.run(scn, drain_timeout_s=drain_s)  # censored like the live runs
    stored.write(out / "sim")
    core = build_llm_core(scn)
    if not force:
        check_llm_bounds(stored, horizon_s(scn, core.arrival_s), max_wall_s, repeats)
    slots, max_len = decoder_capacity(scn, core)
    decoders = build_decoders(llm_model_spec(scn), scn.replicas, slots, max_len)
    lives, sims, probes = [], [], []
    for i in range(1, repeats + 1):
        probe = None
        if probe_mode == "full":
            before = probe_llm(decoders[0], stored_profile)
        if progress:
            progress(f"live run {i}/{repeats}")
        result = live_llm(scn, drain_timeout_s=drain_s, decoders=decoders)
        run_dir = result.write(out / f"live-{i}")
        lives.append(result.summary)
        if probe_mode == "full":
            after = probe_llm(decoders[0], stored_profile)
            scales = {k: math.sqrt(before[k] * after[k])
                      for k in ("prefill_scale", "decode_scale")}
            probe = {"before": before, "after": after, **scales,
                     "drift": max(abs(after[k] / before[k] - 1) for k in scales)}
            write_json(run_dir / "probe.json", probe)
            probed = rescaled(stored_profile, scales["prefill_scale"],
                              scales["decode_scale"])
            path = probed.save(run_dir / "probed-profile.json")
            predicted = sim.llm.run(scn, {"service.path": str(path)},
                                    drain_timeout_s=drain_s)
            predicted.write(out / f"sim-{i}")
            sims.append(predicted.summary)
            probes.append(probe)
    rows = compare_rows(sims if sims else stored.summary, lives,
                        stored_summary=stored.summary if sims else None,
                        metrics=LLM_METRICS)
    data = {"scenario": scn.name, "kind": "llm", "repeats": repeats, "probe_mode": probe_mode,
            "probed": bool(sims), "probes": [{k: p[k] for k in ("prefill_scale",
                                                                "decode_scale", "drift")}
                                             for p in probes],
            "rows": rows}
    write_json(out / "compare.json", data)
    return data
