"""Ray Serve's autoscaler against servelab's ``target`` autoscaler on a burst day
(:mod:`executor.endpoint.autoscale_check`): a sleep-model deployment (a batch of n takes
50 + 10 n ms of ``asyncio.sleep``, whatever the CPU does) with ``autoscaling_config`` min 1,
max 4, ``target_ongoing_requests`` 2, ``upscale_delay_s`` 1, ``downscale_delay_s`` 5,
``look_back_period_s`` 2 and a 2 s start-up delay in each replica's constructor, driven by
``servelab bench`` on 8 s at 4 req/s, 16 s at 40 req/s, 20 s at 4 req/s (Poisson, a new seed
each run); Ray's replica counts polled from ``serve.status()``; servelab simulates the same
day with the cold start measured from Ray's log in that run (Ray's own actor start adds to
the controlled delay) and the single-request overhead outside the replica measured before
the runs added to its latencies.

Targets (issue #30): replica-seconds within 5%, upscales within +-1, latency P99 within 15%.

    python benchmarks/fidelity_rayserve_autoscale.py [--runs 3]

Writes benchmarks/results/fidelity_rayserve_autoscale.json and .md.
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

from executor.endpoint.autoscale_check import AutoscaleDay, errors, run_days  # noqa: E402
from executor.endpoint.rayserve import ensure_ray  # noqa: E402
from sim.metrics.rundir import versions  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"replica_seconds": 0.05, "upscales": 1.0, "latency_p99_ms": 0.15}
VARIANTS = ("predicted", "predicted_calibrated", "predicted_calibrated_no_drain",
            "predicted_no_outside", "predicted_calibrated_no_outside", "predicted_retry",
            "predicted_calibrated_retry")
METRICS = ("replica_seconds", "upscales", "max_replicas", "latency_p50_ms", "latency_p99_ms")


def _spread(values: list[float]) -> float:
    mean = float(np.mean(values))
    return (max(values) - min(values)) / abs(mean) if mean else float("nan")


def table(rows: list[dict[str, Any]], which: str) -> str:
    """The Markdown table: per metric the live mean, live spread, predicted mean, error."""
    lines = ["| metric | Ray Serve (mean of runs) | live spread (max-min)/mean | servelab "
             "predicted | error (mean; per run) | target |", "|---|---|---|---|---|---|"]
    errs = [errors(r, which) for r in rows]
    for m in METRICS:
        live = [float(r["live"][m]) for r in rows]
        pred = [float(r[which][m]) for r in rows]
        if m == "upscales":
            err = f"{np.mean([e[m] for e in errs]):+.1f}; " + ", ".join(
                f"{e[m]:+.0f}" for e in errs)
            target = "within ±1"
        elif m == "max_replicas":
            err, target = ", ".join(f"{p - v:+.0f}" for p, v in zip(pred, live, strict=True)), ""
        else:
            err = f"{np.mean([e[m] for e in errs]):+.1%}; " + ", ".join(
                f"{e[m]:+.1%}" for e in errs)
            target = {"replica_seconds": "within 5%", "latency_p99_ms": "within 15%"}.get(m, "")
        lines.append(f"| {m} | {np.mean(live):.2f} | {_spread(live):.1%} | "
                     f"{np.mean(pred):.2f} | {err} | {target} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tag", default="drain", help="results file suffix (the first results, "
                    "before the drain was modelled, are fidelity_rayserve_autoscale.md)")
    args = ap.parse_args()
    stem = f"fidelity_rayserve_autoscale{'_' + args.tag if args.tag else ''}"
    t0 = time.perf_counter()
    day = AutoscaleDay()
    rows = run_days(ensure_ray(), day, Path("/tmp/servelab-rayserve-autoscale"), args.runs)
    wall_s = time.perf_counter() - t0
    met = {which: {k: all(abs(errors(r, which)[k]) <= tol for r in rows)
                   for k, tol in TARGETS.items()}
           for which in VARIANTS}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"day": rows[0]["day"], "runs": [{k: v for k, v in r.items() if k != "run_dir"}
                                           for r in rows],
           "errors": [errors(r) for r in rows],
           "errors_calibrated": [errors(r, "predicted_calibrated") for r in rows],
           "errors_calibrated_no_drain": [errors(r, "predicted_calibrated_no_drain")
                                          for r in rows],
           "errors_no_outside": [errors(r, "predicted_no_outside") for r in rows],
           "errors_calibrated_no_outside": [errors(r, "predicted_calibrated_no_outside")
                                            for r in rows],
           "errors_retry": [errors(r, "predicted_retry") for r in rows],
           "errors_calibrated_retry": [errors(r, "predicted_calibrated_retry") for r in rows],
           "targets": TARGETS, "met": met,
           "wall_s": wall_s, "machine": platform.platform(), "versions": versions(),
           "command": "fgrun python benchmarks/fidelity_rayserve_autoscale.py --runs "
                      f"{args.runs}" + (f" --tag {args.tag}" if args.tag else "")}
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
    cold = [c for r in rows for c in r["cold_start_s"]["measured"]]
    md = [
        "# Ray Serve autoscaling vs servelab's `target` autoscaler",
        "",
        f"Command: `{out['command']}` (run under `fgrun`: CPU priority over the other jobs on "
        "this shared 2-core VM). Ray Serve 2.60, sleep model (a batch of n takes "
        f"{day.base_ms:g} + {day.per_item_ms:g} n ms of asyncio.sleep: its service time "
        "does not depend on CPU contention, so replicas on 2 cores do not slow each other), "
        f"max batch {day.max_batch_size}, window {day.batch_wait_ms:g} ms; autoscaling min "
        f"{day.min_replicas}, max {day.max_replicas}, target_ongoing_requests "
        f"{day.target_ongoing_requests:g}, upscale_delay_s {day.upscale_delay_s:g}, "
        f"downscale_delay_s {day.downscale_delay_s:g}, look_back_period_s "
        f"{day.look_back_period_s:g}, start-up delay {day.startup_delay_s:g} s in the "
        "constructor, graceful_shutdown_wait_loop_s "
        f"{day.graceful_shutdown_wait_loop_s:g} s (Ray's default, set explicitly); metrics "
        "push interval 0.2 s. Day: "
        + ", ".join(f"{d:g} s at {r:g} req/s" for d, r in day.phases)
        + f"; {len(rows)} runs, a new seed each, {wall_s:.0f} s in all.",
        "",
        "servelab's scenario mirrors Ray's stopping replica (`autoscaling."
        "graceful_shutdown_wait_loop_s`: a removed replica sleeps that long, then stops at "
        "the first check that finds no ongoing request; it counts replica-seconds until "
        "then; a scale-up launches while it stops, `autoscaling.stopping_holds_slot: "
        "false`, as Ray does not count a STOPPING replica against max_replicas) and the "
        "cold start measured in each run. It batches by Ray's rule "
        "(`policy.timer: arrival`: the next batch forms while one runs) and bounds each "
        f"replica at Ray's `max_ongoing_requests` ({day.max_ongoing_requests}; "
        "`queue.max_ongoing_requests`: past it a request waits at the router).",
        "",
        "**servelab with the nominal service time** (a + b·n, the sleep the deployment "
        "does; the single-request overhead added to its latencies):",
        "",
        table(rows, "predicted"),
        "",
        "**servelab with the service time calibrated through the endpoint** (`calibrate "
        "--endpoint`, bursts of 1, 2 and 4 with a 100 ms window, subtracted; the request "
        "overhead outside the replica from paired full bursts, as `service.overheads`):",
        "",
        table(rows, "predicted_calibrated"),
        "",
        "**The same, without the stopping replica** (a removed replica stops when its work "
        "is done, as servelab did before):",
        "",
        table(rows, "predicted_calibrated_no_drain"),
        "",
        "**Ablation: the autoscaler counting only what the replicas hold** (no "
        "`autoscaling.outside_ms`; Ray's count also holds the path outside the replica), "
        "nominal, then calibrated:",
        "",
        table(rows, "predicted_no_outside"),
        "",
        table(rows, "predicted_calibrated_no_outside"),
        "",
        "**Variant: the router retrying as Ray's routing tasks do** (`queue.retry`, Ray's "
        "defaults: two tasks per running replica, back-off 25 ms doubling to 0.5 s, the room "
        "found given to the oldest waiting request), nominal, then calibrated:",
        "",
        table(rows, "predicted_retry"),
        "",
        table(rows, "predicted_calibrated_retry"),
        "",
        "What Ray's own logs say its router met during each day (replicas rejecting a "
        "request at `max_ongoing_requests` because the router's cached queue length said "
        "it had room; queue-length probes past their 0.1 s deadline, after which the "
        "router treats the replica as full and backs off): "
        + "; ".join(f"run {k + 1}: {r['ray_router'].get('rejected', 0)} rejected, "
                    f"{r['ray_router'].get('probe_timeouts', 0)} probes late"
                    for k, r in enumerate(rows)) + ".",
        "",
        f"Cold start measured in Ray's log (upscale to running): "
        f"{', '.join(f'{c:.1f}' for c in cold)} s (controlled part {day.startup_delay_s:g} s; "
        "the rest is Ray starting the replica actor). The simulation uses each run's median. "
        f"Single-request overhead outside the replica (proxy, router, HTTP), measured before "
        f"the runs and added to the nominal prediction's latencies: "
        f"{rows[0]['overhead_ms']:.1f} ms; the calibration's paired full bursts put "
        f"{rows[0]['calibrated_overhead_ms']:.1f} ms outside the replica.",
        "",
        "Targets met (every run): " + "; ".join(
            f"{which}: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in m.items())
            for which, m in met.items()),
        "",
        "Replica-seconds count every replica that exists (starting, running, stopping) over "
        f"[0, {day.length_s:g} s]; upscales are the increases of that count (Ray's log is "
        "polled every 0.25 s, so two upscales closer than that read as one).",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
