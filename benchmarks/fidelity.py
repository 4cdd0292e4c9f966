"""Fidelity: simulator predictions against live runs of the real model on this machine.

For each policy and target utilisation ρ (the rate is found by bisection on the simulator),
simulate, run live ``--repeats`` times, and report the relative error of throughput, P50,
P99, mean batch size and utilisation next to ρ and the live run-to-run spread. By default each
live run is bracketed by device probes and predicted on the profile rescaled to them
(``compare``'s probe); the stored profile's errors are reported next to them (``--no-probe``
turns probing off). Then, in the same run, executor efficiency at saturation (greedy, max
batch B, arrivals far above capacity): live throughput / (B / median latency(B)) with the
latency from the stored profile and from a probe taken just before, and the dispatch overhead
per batch (decide + bookkeeping, excluding the model).

Throughput is the summary's: ok requests that finish inside the window per second.

Usage: python benchmarks/fidelity.py [--model minilm] [--seconds 10] [--repeats 3] [--runner replay]
       [--no-probe]
       [--rhos 0.3,0.6,0.8,0.9] [--policies none,greedy,dynamic-request,dynamic-first,slo]
Writes benchmarks/results/fidelity-<device>.md and .csv.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.profile import load_profile  # noqa: E402
from executor.compare import (  # noqa: E402
    compare,
    compare_rows,
    probed_scenario,
    rate_for_utilization,
)
from executor.live_requests import default_runners, live  # noqa: E402
from executor.probe import probe  # noqa: E402
from executor.testing import ReplayRunner  # noqa: E402
from sim.scenario.schema import load_scenario  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

POLICIES = {
    "none": {"kind": "none"},
    "greedy": {"kind": "greedy", "max_batch_size": 8},
    "dynamic-request": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5,
                        "timer": "request"},
    "dynamic-first": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5,
                      "timer": "first"},
    "slo": {"kind": "slo", "max_batch_size": 8},
}
KEYS = ["throughput_rps", "latency_ms.p50", "latency_ms.p99", "mean_batch_size", "utilization"]


def base_scenario(profile: str, policy: dict, seconds: float, slo_ms: float) -> dict:
    return {"name": "fidelity", "seed": 11, "service": {"kind": "profile", "path": profile},
            "workload": {"kind": "poisson", "rate_rps": 10.0, "duration_s": seconds},
            "policy": policy, "warmup_s": min(2.0, seconds / 5), "slo_ms": slo_ms}


def summary(run_dir: Path) -> dict:
    """A run directory's summary.json."""
    return json.loads((run_dir / "summary.json").read_text())


def efficiency(profile_ref: str, runners: list, batch: int, seconds: float) -> dict:
    """Live throughput at saturation vs the capacity B / median(B), median from the stored
    profile and from a probe of the device's model time just before the run.
    """
    profile = load_profile(profile_ref)
    capacity = batch / profile.median_s(batch)
    # the device's speed now, model call only: the executor's overhead is what is measured
    probed_capacity = batch / probe(runners[0], profile, [batch], budget_s=3.0).model_median_s[
        batch]
    cfg = {"name": "saturation", "seed": 3, "service": {"kind": "profile", "path": profile_ref},
           "workload": {"kind": "constant", "rate_rps": capacity * 3, "duration_s": seconds},
           "policy": {"kind": "greedy", "max_batch_size": batch}, "warmup_s": seconds / 4}
    result = live(cfg, runners=runners, handle_sigint=False)
    # the summary's throughput: completions inside the window (arrivals are 3x capacity)
    live_rate = float(result.summary["throughput_rps"])
    health = result.summary["executor_health"]
    return {"batch": batch, "calibrated_capacity_rps": capacity, "live_rps": live_rate,
            "efficiency": live_rate / capacity, "probed_capacity_rps": probed_capacity,
            "probed_efficiency": live_rate / probed_capacity,
            "dispatch_overhead_p50_ms": health["dispatch_overhead_ms"]["p50"],
            "dispatch_overhead_p99_ms": health["dispatch_overhead_ms"]["p99"],
            "handoff_p50_ms": health["handoff_ms"]["p50"],
            "handoff_p99_ms": health["handoff_ms"]["p99"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rhos", default="0.3,0.6,0.8,0.9")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--slo-ms", type=float, default=None)
    ap.add_argument("--out", default=None, help="result name (default fidelity-<device>)")
    ap.add_argument("--probe", choices=["full", "overhead", "off"], default=None,
                    help="compare's probe mode (default: full for the model, overhead for "
                    "replay)")
    ap.add_argument("--runner", choices=["model", "replay"], default="model",
                    help="model: the real model; replay: a constant-speed stand-in that sleeps "
                    "for the simulator's own service-time draws (common random numbers; each "
                    "live run is compared with the simulated run of the same seed): what the "
                    "executor adds, free of device drift and sampling noise")
    args = ap.parse_args()
    profile_ref = f"builtin:{args.model}-{args.device}"
    profile = load_profile(profile_ref)
    slo_ms = args.slo_ms or 10 * profile.median_s(1) * 1e3
    rhos = [float(x) for x in args.rhos.split(",")]
    policies = args.policies.split(",")
    work = Path("/tmp") / f"servelab-fidelity-{args.model}-{args.device}"
    t0 = time.perf_counter()
    runners = None
    replay = args.runner == "replay"
    mode = args.probe or ("overhead" if replay else "full")
    rows = []
    for name in policies:
        scn = load_scenario(base_scenario(profile_ref, POLICIES[name], args.seconds, slo_ms))
        if runners is None:
            runners = ([ReplayRunner(profile, same_draws_as_seed=scn.seed)]
                       if replay else default_runners(scn))
        rate_scn = scn if mode == "off" else probed_scenario(
            scn, runners, work / name / "rate-probe-profile.json", mode=mode)
        for rho in rhos:
            rate = rate_for_utilization(rate_scn, rho)
            sub = load_scenario(scn, {"workload.rate_rps": rate})
            out = work / name / f"rho-{rho:g}"
            # force: the rate comes from the probed (today's) device speed, so the stored
            # profile's stability check may call a rate near its capacity unstable when the
            # device is faster today; the drain timeout still bounds every live run
            data = compare(sub, out, repeats=args.repeats, runners=runners, probe_mode=mode,
                           force=True)
            if replay:  # the same draws: each live run against the simulated run of its seed
                lives = [summary(out / f"live-{i}") for i in range(1, args.repeats + 1)]
                sims = ([summary(out / f"sim-{i}") for i in range(1, args.repeats + 1)]
                        if data["probed"] else [summary(out / "sim")] * args.repeats)
                data["rows"] = compare_rows(sims, lives, stored_summary=summary(out / "sim"))
            by = {r["metric"]: r for r in data["rows"]}
            drifts = [p["drift"] for p in data["probes"]]
            row = {"policy": name, "target_rho": rho, "rate_rps": rate,
                   "sim_rho": data["rho"],
                   "max_abs_drift": max((abs(d) for d in drifts), default=math.nan),
                   "probe_scale": (sum(p["scale"] for p in data["probes"]) / len(drifts)
                                   if drifts else math.nan),
                   "probe_overhead_ms": (sum(p["applied"]["add_s"] for p in data["probes"])
                                         * 1e3 / len(drifts) if drifts else math.nan)}
            for key in KEYS:
                r = by[key]
                row[f"{key}:sim"] = r["sim"]
                row[f"{key}:live"] = r["live_median"]
                row[f"{key}:err"] = r["rel_error"]
                row[f"{key}:spread"] = r["live_spread_rel"]
                row[f"{key}:within"] = r["within_spread"]
                row[f"{key}:err_stored"] = r.get("rel_error_stored", r["rel_error"])
            rows.append(row)
            print(f"{name:16s} rho={rho:.1f} rate={rate:7.2f}  "
                  + "  ".join(f"{k}={100 * row[k + ':err']:+.1f}%" for k in KEYS)
                  + f"  (stored P50 {100 * row['latency_ms.p50:err_stored']:+.1f}%, "
                  f"drift {100 * row['max_abs_drift']:.1f}%)", flush=True)
    frame = pd.DataFrame(rows)
    eff = efficiency(profile_ref, runners or [], 8, max(args.seconds, 8))
    elapsed = time.perf_counter() - t0

    what = ("a constant-speed replay of the profile (no model)" if args.runner == "replay"
            else f"{args.model} on {args.device}")
    lines = [f"# Fidelity: sim vs live, {what}", "",
             f"Machine: {platform.processor() or platform.machine()}; profile {profile_ref} "
             f"(threads {profile.meta.get('threads')}); live runs of {args.seconds:g} s, "
             f"{args.repeats} repeats; SLO {slo_ms:.0f} ms (slo policy); benchmark took "
             f"{elapsed / 60:.1f} min.", "",
             "Relative error = (sim − live median) / live median; spread = (live max − min) / "
             "live median over the repeats. "
             + ("Errors are of the prediction on the profile refreshed by the probes around "
                "each live run (speed scale × samples + dispatch overhead); 'stored' columns: "
                "the same live runs against the stored profile; drift: the largest change of "
                "device speed between the probes before and after one live run; probe scale: "
                "the device's model time relative to the stored profile, overhead: dispatch "
                "overhead per batch (means over the repeats)."
                if mode == "full" else f"Probe mode: {mode}.")
             + (" The live runs replay the simulated run's own service times (same seed) and "
                "each is compared with that simulated run, so errors are what the executor "
                "adds; 'stored' columns: without the probed dispatch overhead."
                if replay else ""), "",
             "| policy | ρ target | rate req/s | thr err | P50 err | P99 err | P99 spread | "
             "P99 in spread | batch err | util err | P50 err stored | P99 err stored | "
             "drift | probe scale | overhead ms |",
             "|---|---:|---:|---:|---:|---:|---:|:-:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['target_rho']:.1f} | {r['rate_rps']:.2f} | "
            f"{100 * r['throughput_rps:err']:+.1f}% | {100 * r['latency_ms.p50:err']:+.1f}% | "
            f"{100 * r['latency_ms.p99:err']:+.1f}% | {100 * r['latency_ms.p99:spread']:.1f}% | "
            f"{'yes' if r['latency_ms.p99:within'] else 'no'} | "
            f"{100 * r['mean_batch_size:err']:+.1f}% | {100 * r['utilization:err']:+.1f}% | "
            f"{100 * r['latency_ms.p50:err_stored']:+.1f}% | "
            f"{100 * r['latency_ms.p99:err_stored']:+.1f}% | {100 * r['max_abs_drift']:.1f}% | "
            f"{r['probe_scale']:.3f} | {r['probe_overhead_ms']:.3f} |")
    low = frame[frame["target_rho"] <= 0.8]

    def met(col: str, tol: float) -> str:
        return f"{int((low[col].abs() <= tol).sum())}/{len(low)}"

    lines += ["", "Targets (ρ ≤ 0.8): |throughput err| ≤ 2% in "
              f"{met('throughput_rps:err', 0.02)}, |P50 err| ≤ 2% in "
              f"{met('latency_ms.p50:err', 0.02)}, |P99 err| ≤ 5% in "
              f"{met('latency_ms.p99:err', 0.05)}; P50 within 5%: "
              f"{met('latency_ms.p50:err', 0.05)}; P99 within 10%: "
              f"{met('latency_ms.p99:err', 0.10)}; P99 sim within the live min–max: "
              f"{int(low['latency_ms.p99:within'].sum())}/{len(low)}.",
              "Stored profile (same live runs): |P50 err| ≤ 2% in "
              f"{met('latency_ms.p50:err_stored', 0.02)}, |P99 err| ≤ 5% in "
              f"{met('latency_ms.p99:err_stored', 0.05)}.",
              f"ρ = 0.9: P99 sim within the live min–max in "
              f"{int(frame[frame['target_rho'] >= 0.9]['latency_ms.p99:within'].sum())}/"
              f"{int((frame['target_rho'] >= 0.9).sum())}.", "",
              "## Executor efficiency at saturation (greedy, max batch 8)", "",
              "| capacity req/s (stored / probed) | live req/s | efficiency (stored / probed) | "
              "dispatch overhead p50 / p99 ms | hand-off p50 / p99 ms |",
              "|---:|---:|---:|---:|---:|",
              f"| {eff['calibrated_capacity_rps']:.2f} / {eff['probed_capacity_rps']:.2f} | "
              f"{eff['live_rps']:.2f} | {eff['efficiency']:.3f} / "
              f"{eff['probed_efficiency']:.3f} | {eff['dispatch_overhead_p50_ms']:.3f} / "
              f"{eff['dispatch_overhead_p99_ms']:.3f} | {eff['handoff_p50_ms']:.3f} / "
              f"{eff['handoff_p99_ms']:.3f} |"]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = args.out or (f"fidelity-{args.device}" + ("" if args.model == "minilm" else
                                                     f"-{args.model}")
                        + ("-replay" if args.runner == "replay" else ""))
    (RESULTS / f"{name}.md").write_text(text)
    frame.to_csv(RESULTS / f"{name}.csv", index=False)


if __name__ == "__main__":
    main()
