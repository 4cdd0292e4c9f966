"""Fidelity against a real vLLM: calibrate from its endpoint, then predict and measure the
Azure LLM conversation trace (builtin, token lengths truncated to the calibrated grid),
time-scaled to loads ρ of the capacity the calibrated profile gives, for two server
settings: a small ``--max-num-batched-tokens`` that forces chunked prefill, and a large one.

For each setting the script starts vLLM's CPU build (``servelab server install vllm``'s
environment, the tiny model) on a loopback port, runs ``servelab calibrate --endpoint``
(``calibrate_endpoint``) with the knobs it started the server with, then
``compare --endpoint`` (``compare_endpoint``) at each ρ with ``--repeats`` bench runs.
Errors are the prediction (on the profile rescaled by each run's probes) against the median
of the runs, with the runs' spread beside them; the stored profile's error is kept too.
Each bench run sends fresh prompts (``bench``'s prompt salt): with the same prompts, every run
after the first finds most of its prompt blocks in vLLM's prefix cache (60% of prompt tokens
in the previous round's runs) and prefills far less than the simulator predicts.

Beside the errors, the engine's steps: vLLM's per-iteration token histogram
(``vllm:iteration_tokens_total`` on ``/metrics`` before and after each bench run) against the
simulated runs' steps (prefill tokens + decoding sequences of each step), as steps per second,
mean tokens per step and the share of steps above each of vLLM's bucket bounds.

Usage: python benchmarks/fidelity_vllm.py [--rhos 0.3,0.6,0.8,0.9] [--repeats 3]
       [--seconds 15] [--settings 256,2048] [--budget-s 150] [--note TEXT]
Writes benchmarks/results/fidelity_vllm.md and fidelity_vllm.csv (``--tag T``: with -T in
the names, for a reduced run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.endpoint.calibrate import calibrate_endpoint, endpoint_overrides  # noqa: E402
from executor.endpoint.compare_endpoint import compare_endpoint  # noqa: E402
from executor.endpoint.servers import VllmServer, ensure_vllm, free_port  # noqa: E402
from sim.experiments.llm_load import load_overrides, saturation_rps  # noqa: E402
from sim.scenario.llm import load_llm_scenario  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MAX_NUM_SEQS = 64
METRICS = ("ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p99", "e2e_ms.p50",
           "output_tokens_per_s")
HIST = "iteration_tokens_total"
SHOWN_BOUNDS = (1.0, 8.0, 32.0, 128.0, 256.0, 512.0)
TARGETS = {"ttft_ms.p50": 0.05, "tpot_ms.p50": 0.05, "e2e_ms.p50": 0.05, "ttft_ms.p99": 0.10,
           "tpot_ms.p99": 0.10, "output_tokens_per_s": 0.02}


def trace_scenario(seconds: float) -> dict[str, Any]:
    """A slice of the Azure conversation trace (from minute 10), prompts <= 1024 and outputs
    <= 128 tokens (the calibrated grid's prompts; the tiny model's 4,096-token context).
    """
    return {"name": "fidelity-vllm-azure", "seed": 3,
            "service": {"kind": "llm_linear", "base_ms": 1},
            "workload": {"kind": "trace", "path": "builtin:azure_llm_2023_conv.csv",
                         "start_s": 600, "duration_s": seconds,
                         "prompt_tokens_column": "ContextTokens", "prompt_tokens_max": 1024,
                         "output_tokens_column": "GeneratedTokens", "output_tokens_max": 128},
            "policy": {"kind": "vllm", "num_gpu_blocks": 64},
            "warmup_s": min(3.0, seconds / 5)}


def _hist(page: dict[str, Any]) -> dict[float, float]:
    return {float(le): v for le, v in page.get("buckets", {}).get(HIST, {}).items()}


def vllm_counted(steps: pd.DataFrame, requests: pd.DataFrame) -> tuple[np.ndarray, float]:
    """The simulated steps as vLLM's ``iteration_tokens_total`` counts them, and the last
    step's end. vLLM observes only steps that return tokens, each with its generated tokens
    (one per decode, one per prompt finishing its prefill) plus the whole computed prompt of
    each request finishing its prefill (not the chunk the step ran).
    """
    if steps.empty:
        return np.zeros(0), 0.0
    ends = (steps["start_s"] + steps["duration_s"]).to_numpy(float)
    first = requests["first_token_s"].to_numpy(float)
    done = np.isfinite(first)
    at = np.clip(np.searchsorted(ends, first[done] - 1e-9), 0, ends.size - 1)
    prompt = np.zeros(ends.size)
    firsts = np.zeros(ends.size)
    np.add.at(prompt, at, requests["prompt_tokens"].to_numpy(float)[done])
    np.add.at(firsts, at, 1.0)
    counted = steps["decode_seqs"].to_numpy(float) + firsts + prompt
    returns = (steps["decode_seqs"].to_numpy(float) + firsts) > 0
    return counted[returns], float(ends.max())


def step_mix(point: Path, repeats: int) -> dict[str, Any]:
    """The server's engine steps over the point's bench runs (``/metrics`` differences) and
    the simulated runs' steps counted as vLLM counts them (:func:`vllm_counted`): steps/s,
    mean tokens per step, share of steps above each bucket bound (vLLM's bounds).
    """
    counts: dict[float, float] = {}
    total = steps = span = 0.0
    sim_tokens: list[np.ndarray] = []
    sim_span = 0.0
    for i in range(1, repeats + 1):
        meta = json.loads((point / f"bench-{i}" / "meta.json").read_text())
        before, after = meta["server_metrics_before"], meta["server_metrics_after"]
        h0, h1 = _hist(before), _hist(after)
        for le, v in h1.items():
            counts[le] = counts.get(le, 0.0) + v - h0.get(le, 0.0)
        values0, values1 = before["values"], after["values"]
        total += values1.get(f"{HIST}_sum", 0.0) - values0.get(f"{HIST}_sum", 0.0)
        steps += values1.get(f"{HIST}_count", 0.0) - values0.get(f"{HIST}_count", 0.0)
        span += float(meta["wall_s"])
        sim_dir = point / f"sim-{i}" if (point / f"sim-{i}").is_dir() else point / "sim"
        tokens, end_s = vllm_counted(pd.read_parquet(sim_dir / "steps.parquet"),
                                     pd.read_parquet(sim_dir / "requests.parquet"))
        sim_tokens.append(tokens)
        sim_span += end_s
    sim_all = np.concatenate(sim_tokens) if sim_tokens else np.zeros(0)
    bounds = [le for le in sorted(counts) if np.isfinite(le) and le in SHOWN_BOUNDS]
    above_vllm = {f"{le:g}": 1 - counts[le] / steps if steps else float("nan") for le in bounds}
    above_sim = {f"{le:g}": float(np.mean(sim_all > le)) if sim_all.size else float("nan")
                 for le in bounds}
    return {"vllm_steps_per_s": steps / span if span else float("nan"),
            "sim_steps_per_s": sim_all.size / sim_span if sim_span else float("nan"),
            "vllm_tokens_per_step": total / steps if steps else float("nan"),
            "sim_tokens_per_step": float(sim_all.mean()) if sim_all.size else float("nan"),
            "vllm_share_above": above_vllm, "sim_share_above": above_sim}


def run_setting(batched: int, args: argparse.Namespace, out: Path,
                steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start the server with ``--max-num-batched-tokens batched``, calibrate, sweep ρ (the
    step mixes go to ``steps``).
    """
    server = VllmServer(ensure_vllm(), port=free_port(),
                        args=("--max-num-batched-tokens", str(batched),
                              "--max-num-seqs", str(MAX_NUM_SEQS)))
    print(f"[{batched}] starting vLLM …", flush=True)
    server.start()
    rows = []
    try:
        profile = out / f"profile-{batched}.json"
        calibrate_endpoint(server.url, profile, budget_s=args.budget_s, reps=5,
                           max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=batched,
                           say=lambda m: print(f"[{batched}] {m}", flush=True))
        scn = load_llm_scenario(trace_scenario(args.seconds), endpoint_overrides(profile))
        capacity = saturation_rps(scn)
        for rho in [float(r) for r in args.rhos.split(",")]:
            if args.stop_at is not None and time.time() > args.stop_at:
                print(f"[{batched}] --stop-at reached: rho {rho:g} and after skipped", flush=True)
                break
            sub = load_llm_scenario(scn, load_overrides(scn, rho, capacity))
            t0 = time.perf_counter()
            data = compare_endpoint(sub, server.url, out / f"b{batched}-rho{rho:g}",
                                    repeats=args.repeats)
            print(f"[{batched}] rho {rho:g}: {time.perf_counter() - t0:.0f} s", flush=True)
            steps.append({"max_num_batched_tokens": batched, "rho": rho,
                          **step_mix(out / f"b{batched}-rho{rho:g}", args.repeats)})
            for row in data["rows"]:
                if row["metric"] in METRICS:
                    rows.append({"max_num_batched_tokens": batched, "rho": rho,
                                 "capacity_rps": capacity, "metric": row["metric"],
                                 "sim": row["sim"], "vllm_median": row["live_median"],
                                 "rel_error": row["rel_error"],
                                 "rel_error_stored": row.get("rel_error_stored"),
                                 "spread": row["live_spread_rel"],
                                 "drift": max(p["drift"] for p in data["probes"]),
                                 "client_cpu": max(data["client_cpu_share"]),
                                 "vllm_min": row["live_min"], "vllm_max": row["live_max"],
                                 "within_spread": row["within_spread"]})
            args.save(rows)
    finally:
        server.stop()
    return rows


def table(frame: pd.DataFrame) -> list[str]:
    """The markdown table: error with its bias, the runs' range and spread, target."""
    lines = ["| batched tokens | ρ | metric | sim | vLLM median (min–max) | error | bias "
             "| run spread | stored-profile error | probe drift | target met | met (stored) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples():
        bias = "sim high" if r.rel_error > 0 else "sim low"
        stored = _known(r.rel_error_stored)  # None without a stored-profile prediction
        lines.append(f"| {r.max_num_batched_tokens} | {r.rho:g} | {r.metric} | {r.sim:.3g} | "
                     f"{r.vllm_median:.3g} ({r.vllm_min:.3g}–{r.vllm_max:.3g}) | "
                     f"{100 * r.rel_error:+.1f}% | {bias} | {100 * r.spread:.1f}% | "
                     f"{_pct(stored)} | {100 * r.drift:.0f}% | "
                     f"{'yes' if _met(r, r.rel_error) else 'no'} | "
                     f"{'n/a' if stored is None else 'yes' if _met(r, stored) else 'no'} |")
    return lines


def _known(error: float | None) -> float | None:
    """``error``, or None where there is none (missing or NaN)."""
    return None if error is None or error != error else float(error)


def _pct(error: float | None) -> str:
    return "n/a" if error is None else f"{100 * error:+.1f}%"


def _met(row: Any, error: float) -> bool:
    """Whether ``error`` meets the row's target (at ρ 0.9: within the runs' spread)."""
    return abs(error) <= (TARGETS[row.metric] if row.rho <= 0.8 else row.spread)


def met_counts(frame: pd.DataFrame) -> str:
    """Targets met at ρ <= 0.8 and at 0.9, by the probe-rescaled and the stored profile."""
    parts = []
    for label, col in (("probe-rescaled", "rel_error"), ("stored profile", "rel_error_stored")):
        counts = []
        for low in (True, False):
            sub = frame[(frame.rho <= 0.8) == low]
            errors = [(r, _known(getattr(r, col))) for r in sub.itertuples()]
            known = [(r, e) for r, e in errors if e is not None]
            met = sum(_met(r, e) for r, e in known)
            counts.append(f"{met} of {len(known)} at ρ {'<= 0.8' if low else '0.9'}")
        parts.append(f"{label}: " + ", ".join(counts))
    return "Targets met: " + "; ".join(parts) + "."


def steps_table(steps: list[dict[str, Any]]) -> list[str]:
    """The engine's steps, vLLM's (``/metrics``) against the simulated ones."""
    lines = ["| batched tokens | ρ | steps/s vLLM | sim | tokens/step vLLM | sim | share of steps "
             "above 1 / 8 / 32 / 128 / 256 / 512 tokens: vLLM | sim |",
             "|---|---|---|---|---|---|---|---|"]
    for r in steps:
        def share(d: dict[str, float]) -> str:
            return " / ".join(f"{100 * v:.0f}%" for v in d.values())
        lines.append(f"| {r['max_num_batched_tokens']} | {r['rho']:g} | "
                     f"{r['vllm_steps_per_s']:.0f} | {r['sim_steps_per_s']:.0f} | "
                     f"{r['vllm_tokens_per_step']:.1f} | {r['sim_tokens_per_step']:.1f} | "
                     f"{share(r['vllm_share_above'])} | {share(r['sim_share_above'])} |")
    return lines


def write_results(rows: list[dict[str, Any]], steps: list[dict[str, Any]],
                  args: argparse.Namespace, wall_s: float) -> Path:
    """The CSV and the markdown report (so far: written after each setting)."""
    suffix = f"-{args.tag}" if args.tag else ""
    frame = pd.DataFrame(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    frame.to_csv(RESULTS / f"fidelity_vllm{suffix}.csv", index=False)
    load = os.getloadavg()
    lines = ["# Fidelity against a real vLLM (CPU build, tiny random-weight Llama)", "",
             f"Command: `{args.command}`", "",
             f"Machine: {platform.machine()}, the shared 2-core development VM; the run had "
             "CPU priority over the other jobs on it (`fgrun`: a cgroup with high cpu.shares; "
             "the vLLM server, its engine core and the client are its children), load average "
             f"at the end {load[0]:.1f}. Trace: Azure LLM conversation 2023 from minute 10, "
             f"{args.seconds:g} s slices, prompts <= 1024 and outputs <= 128 tokens, "
             f"time-scaled to ρ of the calibrated capacity; {args.repeats} bench runs per "
             f"point, each with fresh prompts; max_num_seqs {MAX_NUM_SEQS}. Error = sim "
             "(profile rescaled by each run's probes, per step size) over the runs' median − 1 "
             "(bias: sim high = the simulator predicts more); run spread = (max − min) / "
             "median of the runs; targets at ρ <= 0.8: TTFT/TPOT P50 and E2E P50 ±5%, P99 "
             f"±10%, output tokens/s ±2%; at 0.9 the run spread. Wall time: {wall_s:.0f} s.",
             *(["", args.note] if args.note else []), "", *table(frame), "",
             met_counts(frame), "",
             "## Engine steps: vLLM's iteration token histogram against the simulated steps", "",
             "Over each point's bench runs (vLLM: `vllm:iteration_tokens_total` differences, "
             "including the few steps of the pre-flight request; sim: the probed predictions' "
             "steps). vLLM observes only the steps that return tokens, and counts in each the "
             "tokens generated plus the whole prompt of every request whose prefill ends there "
             "(not the chunk the step ran); the simulated steps are counted the same way.", "",
             *steps_table(steps)]
    path = RESULTS / f"fidelity_vllm{suffix}.md"
    path.write_text("\n".join(lines) + "\n")
    (RESULTS / f"fidelity_vllm{suffix}-steps.json").write_text(json.dumps(steps, indent=1)
                                                                + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rhos", default="0.3,0.6,0.8,0.9")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--settings", default="256,2048")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--tag", default="", help="suffix of the results' names (reduced runs)")
    ap.add_argument("--note", default="", help="a paragraph for the report")
    ap.add_argument("--out", type=Path, default=Path("/tmp/servelab-fidelity-vllm"))
    ap.add_argument("--stop-at", default=None,
                    help="HH:MM (UTC): start no point after it; stop 120 s after it")
    args = ap.parse_args()
    args.command = "fgrun python " + " ".join(["benchmarks/fidelity_vllm.py", *sys.argv[1:]])
    args.stop_at = _stop_at(args.stop_at)
    rows: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    path = RESULTS / "fidelity_vllm.md"
    # SIGTERM and the --stop-at alarm end the run through ``finally`` (the server stops)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(142))
    if args.stop_at is not None:
        signal.alarm(max(1, int(args.stop_at - time.time()) + 120))
    for batched in [int(s) for s in args.settings.split(",")]:
        if args.stop_at is not None and time.time() > args.stop_at:
            break
        done = list(rows)
        args.save = lambda new, done=done: write_results(done + new, steps, args,
                                                         time.perf_counter() - t0)
        rows += run_setting(batched, args, args.out, steps)
        path = write_results(rows, steps, args, time.perf_counter() - t0)
    print(path.read_text())


def _stop_at(text: str | None) -> float | None:
    """Epoch seconds of the next HH:MM UTC within 12 hours, else the last one (None: no
    limit): 00:15 given at 23:00 is tomorrow's (today's made the run skip every point).
    """
    if text is None:
        return None
    now = datetime.datetime.now(datetime.UTC)
    hour, minute = (int(v) for v in text.split(":"))
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if (now - at).total_seconds() > 12 * 3600:
        at += datetime.timedelta(days=1)
    return at.timestamp()


if __name__ == "__main__":
    main()
