"""LLM fidelity: the simulator's TTFT/TPOT against live runs of the same scheduler objects on
the decoder the step profile measured (builtin:llm-small-cpu on this CPU).

Runs ``compare_llm`` (a probe around each live run) per policy. Requests: Poisson arrivals
with lognormal token lengths inside the CPU decoder's grid (prompts mean 600, at most 1024;
outputs mean 60, at most 128). Relative error = (sim − live median) / live median; spread =
(live max − min) / live median.

Usage: python benchmarks/fidelity_llm.py [--seconds 20] [--repeats 2] [--rate 1.0]
       [--runner decoder|replay]
Writes benchmarks/results/fidelity_llm-cpu.md and .json (replay: fidelity_llm-cpu-replay.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.llm_compare import compare_llm  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
POLICIES: dict[str, dict[str, Any]] = {
    "vllm-chunked": {"kind": "vllm", "max_num_batched_tokens": 512},
    "vllm-unchunked": {"kind": "vllm", "max_num_batched_tokens": 1024,
                       "enable_chunked_prefill": False},
    "sarathi": {"kind": "sarathi", "max_num_batched_tokens": 256},
    "static": {"kind": "static", "max_batch_size": 8, "max_wait_ms": 50},
}
KV = {"num_gpu_blocks": 2000, "block_size": 16, "max_num_seqs": 16}
METRICS = ["throughput_rps", "output_tokens_per_s", "ttft_ms.p50", "ttft_ms.p99",
           "tpot_ms.p50", "tpot_ms.p99", "e2e_ms.p50"]


def scenario(policy: dict[str, Any], rate: float, seconds: float) -> dict[str, Any]:
    kv = {} if policy["kind"] == "static" else KV
    return {"name": "fidelity-llm", "seed": 3,
            "service": {"kind": "llm_profile", "path": "builtin:llm-small-cpu"},
            "workload": {"kind": "poisson", "rate_rps": rate, "duration_s": seconds,
                         "prompt_tokens": {"dist": "lognormal", "mean": 600, "cv": 0.8,
                                           "max": 1024},
                         "output_tokens": {"dist": "lognormal", "mean": 60, "cv": 1.0,
                                           "max": 128}},
            "policy": {**policy, **kv}, "warmup_s": min(2.0, seconds / 5)}


def replay(args: argparse.Namespace) -> None:
    """Sim against live runs on the replay stand-in (no device, no probe)."""
    import sim.llm
    from executor.compare import compare_rows
    from executor.llm_compare import LLM_METRICS
    from executor.llm_run import live_llm

    t0 = time.perf_counter()
    rows = []
    for name, policy in POLICIES.items():
        cfg = scenario(policy, args.rate, args.seconds)
        simulated = sim.llm.run(cfg).summary
        lives = [live_llm(cfg, replay=True).summary for _ in range(args.repeats)]
        for r in compare_rows(simulated, lives, metrics=LLM_METRICS):
            if r["metric"] in METRICS:
                rows.append({"policy": name, **r})
        print(name, "done", flush=True)
    lines = ["# LLM fidelity, replay: what the live engine adds", "",
             f"Machine: {platform.machine()}; {args.repeats} live runs of {args.seconds:g} s "
             f"per policy at {args.rate:g} req/s on stand-ins that sleep the step profile's "
             "own time for each step's composition (no device drift, no probe); benchmark "
             f"took {(time.perf_counter() - t0) / 60:.1f} min.", "",
             "| policy | metric | sim | live median | error | live spread |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['metric']} | {r['sim']:.3g} | "
                     f"{r['live_median']:.3g} | {100 * r['rel_error']:+.1f}% | "
                     f"{100 * r['live_spread_rel']:.1f}% |")
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fidelity_llm-cpu-replay.md").write_text(text)
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--runner", choices=["decoder", "replay"], default="decoder",
                    help="replay: stand-ins sleeping the step model's own time (what the "
                    "engine adds, free of device drift)")
    args = ap.parse_args()
    if args.runner == "replay":
        replay(args)
        return
    t0 = time.perf_counter()
    rows = []
    drifts = []
    for name, policy in POLICIES.items():
        cfg = scenario(policy, args.rate, args.seconds)
        data = compare_llm(cfg, Path("/tmp") / "servelab-fidelity-llm" / name,
                           repeats=args.repeats, force=True)
        drifts += [p["drift"] for p in data["probes"]]
        for r in data["rows"]:
            if r["metric"] in METRICS:
                rows.append({"policy": name, "metric": r["metric"], "sim": r["sim"],
                             "live_median": r["live_median"], "rel_error": r["rel_error"],
                             "rel_error_stored": r["rel_error_stored"],
                             "spread": r["live_spread_rel"]})
        print(name, "done", flush=True)
    lines = ["# LLM fidelity: sim vs live on the CPU decoder (builtin:llm-small-cpu)", "",
             f"Machine: {platform.machine()}; {args.repeats} live runs of {args.seconds:g} s "
             f"per policy at {args.rate:g} req/s (Poisson; prompts lognormal mean 600, ≤ 1024; "
             f"outputs lognormal mean 60, ≤ 128); benchmark took "
             f"{(time.perf_counter() - t0) / 60:.1f} min. Predictions on the profile "
             "rescaled by the probes around each live run (median over the runs); 'stored': "
             "the same live runs against the stored profile. Probe drift (largest change of "
             "the prefill or decode speed between the probes before and after one run): "
             f"median {100 * float(np.median(drifts)):.1f}%, max "
             f"{100 * float(np.max(drifts)):.1f}%.", "",
             "| policy | metric | sim | live median | error | error stored | live spread |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['metric']} | {r['sim']:.3g} | "
                     f"{r['live_median']:.3g} | {100 * r['rel_error']:+.1f}% | "
                     f"{100 * r['rel_error_stored']:+.1f}% | {100 * r['spread']:.1f}% |")
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fidelity_llm-cpu.md").write_text(text)
    (RESULTS / "fidelity_llm-cpu.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
