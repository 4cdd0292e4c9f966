"""Fidelity against a real Ray Serve: servelab's prediction (``simulate`` on a profile that
``calibrate --endpoint`` measured through the KServe v2 endpoint) beside ``servelab bench``'s
measurement of MiniLM behind ``@serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)``,
at several loads rho (of the calibrated batch-1 capacity), with several runs per load; and the
open-loop client's own overhead against the local stub (``instant`` model).

Each row: the measured mean of a metric over the runs, the live spread (max - min over the
runs, relative to the mean), and the prediction's error (signed: + means servelab predicts
higher). Ray's batches come from the deployment's own log (``/servelab/batches``), which a
black-box client cannot see.

The calibration separates the per-request path outside the replica (Ray's HTTP proxy, the
router, the hops; :func:`executor.endpoint.request_calibrate.request_overhead`) from the
replica's busy time; the prediction applies it as ``service.overheads`` (a latency outside
the queue), and rho is the load on the replica's busy time at batch 1. Ray's own batch log
gives the replica's real busy time per batch size, printed beside the calibrated one.

Every run also keeps its raw timestamps: the client's sends and answers, the replica's own
stamps per request (``/servelab/requests``: user code entered, body read back from the
proxy, batch result back) and Ray's batches. From them (:mod:`benchmarks.rayserve_paths`)
the main prediction takes Ray's batching rule as read in its source (``timer: arrival``)
with the departures from it that the stamps show, each measured on the *other* setting's
runs: the window's lateness and the front end's work that lengthens a running batch.
Beside it: earlier models, the proxy as a FIFO stage, and diagnostics
(:mod:`benchmarks.rayserve_predict`, which ``--repredict`` runs again).

    python benchmarks/fidelity_rayserve.py [--settings 8/5,16/10] [--rhos 0.3,0.6,0.8,0.9]
        [--runs 3] [--duration-s 10] [--tag TAG]
    python benchmarks/fidelity_rayserve.py --repredict [--tag TAG]

Writes benchmarks/results/fidelity_rayserve[-TAG].json, -raw.json, .md and the profiles.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.rayserve_predict import repredict  # noqa: E402
from benchmarks.rayserve_report import markdown  # noqa: E402
from executor.endpoint.rayserve import RayServeApp, ensure_ray  # noqa: E402
from executor.endpoint.request_bench import bench_requests  # noqa: E402
from executor.endpoint.request_calibrate import (  # noqa: E402
    calibrate_endpoint,
    profile_service,
)
from executor.endpoint.servers import free_port  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PAYLOAD = {"model": "minilm", "inputs": [{"name": "input", "datatype": "BYTES", "shape": [-1]}]}
METRICS = ("latency_p50_ms", "latency_p99_ms", "latency_mean_ms", "throughput_rps",
           "mean_batch_size")


def _call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _row(summary: dict[str, Any], batch: float) -> dict[str, float]:
    lat = summary["latency_ms"]
    return {"latency_p50_ms": lat["p50"], "latency_p99_ms": lat["p99"],
            "latency_mean_ms": lat["mean"], "throughput_rps": summary["throughput_rps"],
            "mean_batch_size": batch}


def client_overhead(duration_s: float) -> list[dict[str, Any]]:
    """The client against the stub's instant model: sustained rate and added latency."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "executor.endpoint.stub", "--port",
                             str(port)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    rows = []
    try:
        for rate in (200, 500, 1000):
            scn = {"name": f"stub-{rate}", "seed": 1, "service": {"kind": "constant", "ms": 1},
                   "workload": {"kind": "poisson", "rate_rps": rate, "duration_s": duration_s},
                   "policy": {"kind": "none"}, "payload": {"model": "instant"}}
            r = bench_requests(scn, f"http://127.0.0.1:{port}", api="kserve-v2")
            s = r.summary
            rows.append({"offered_rps": rate, "throughput_rps": s["throughput_rps"],
                         "latency_p50_ms": s["latency_ms"]["p50"],
                         "latency_p99_ms": s["latency_ms"]["p99"],
                         "send_lag_p99_ms": s["client"]["send_lag_ms"]["p99"],
                         "client_cpu_share": s["client"]["cpu_share"], "failed": s["failed"]})
            print(f"client vs stub at {rate} req/s: {rows[-1]}", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return rows


def _raw_run(rho: float, run: int, requests: Any, unix_offset_s: float,
             ray_requests: list[list[Any]], batches: list[list[float]]) -> dict[str, Any]:
    """One run's timestamps, unix seconds (6 decimals): per request the client's
    ``[id, scheduled, sent, answered]`` (answered NaN -> None when it failed) and the
    replica's ``[id, entered, parsed, answered]``; Ray's batches ``[size, start, finish]``.
    """
    def r6(x: float) -> float | None:
        return None if not np.isfinite(x) else round(float(x), 6)

    client = [[int(i), r6(sch + unix_offset_s), r6(sent + unix_offset_s),
               r6(fin + unix_offset_s)] for i, sch, sent, fin in zip(
        requests["id"], requests["scheduled_s"], requests["arrival_s"], requests["finish_s"],
        strict=True)]
    return {"rho": rho, "run": run, "client": client,
            "replica": [[str(i), r6(a), r6(b), r6(c)] for i, a, b, c in ray_requests],
            "batches": [[int(n), r6(a), r6(b)] for n, a, b in batches]}


def busy_by_size(batches: list[list[float]]) -> dict[int, float]:
    """Median busy time (ms) per batch size from Ray's batch log (size, start, finish)."""
    by: dict[int, list[float]] = {}
    for size, start, finish in batches:
        by.setdefault(int(size), []).append((finish - start) * 1e3)
    return {b: float(np.median(v)) for b, v in sorted(by.items())}


def one_setting(url: str, max_batch: int, window_ms: float, rhos: list[float], runs: int,
                duration_s: float, reps: int, stem: str = "fidelity_rayserve"
                ) -> dict[str, Any]:
    """Calibrate at one @serve.batch setting, then predict and measure each rho."""
    sizes = [b for b in (1, 2, 4, 8, 16) if b <= max_batch]
    # calibrated at the scenario's own window: the paired bursts that separate the request
    # overhead need a window shorter than a batch (a burst split by it is flagged)
    _call(f"{url}/servelab/config", {"max_batch_size": max_batch,
                                     "batch_wait_timeout_s": window_ms / 1e3})
    # the pairs send the same inputs, as in the committed `-contention` session (off by
    # default in calibrate: see request_calibrate.request_overhead)
    profile = calibrate_endpoint(url, api="kserve-v2", sizes=sizes, reps=reps, model="minilm",
                                 window_ms=window_ms, server_max_batch=max_batch,
                                 same_pair_inputs=True)
    tag = f"{max_batch}-{window_ms:g}ms"
    path = profile.save(RESULTS / f"{stem}-profile-{tag}.json")
    service = profile_service(profile, str(path))
    # the other bound: the same overhead counted as replica busy time (the previous model)
    over_s = float(service.get("overheads", {}).get("request_ms", 0.0)) / 1e3
    profile.rescaled({sizes[0]: 1.0}, add_s=over_s).save(
        RESULTS / f"{stem}-profile-{tag}-overhead-as-busy.json")
    s1 = profile.median_s(1)
    rows: list[dict[str, Any]] = []
    ray_batches: list[list[float]] = []
    raw: list[dict[str, Any]] = []
    for rho in rhos:
        scenario = {"name": f"ray-{tag}-rho{rho}", "seed": 11, "service": service,
                    "workload": {"kind": "poisson", "rate_rps": round(rho / s1, 2),
                                 "duration_s": duration_s},
                    "policy": {"kind": "dynamic", "max_batch_size": max_batch,
                               "max_wait_ms": window_ms, "timer": "first"},
                    "warmup_s": 1, "payload": PAYLOAD}
        live = []
        for run in range(runs):
            seen = len(_call(f"{url}/servelab/batches")["batches"])
            seen_req = len(_call(f"{url}/servelab/requests")["requests"])
            t0 = time.time()
            clients: list[Any] = []
            measured = bench_requests(scenario, url, api="kserve-v2", on_client=clients.append)
            unix_offset_s = clients[0].t0 + (time.time() - time.perf_counter())
            batches = _call(f"{url}/servelab/batches")["batches"][seen:]
            ray_requests = _call(f"{url}/servelab/requests")["requests"][seen_req:]
            ray_batches += batches
            raw.append(_raw_run(rho, run, measured.requests, unix_offset_s, ray_requests,
                                batches))
            live.append(_row(measured.summary, float(np.mean([b[0] for b in batches]))))
            print(f"{tag} rho {rho} run {run}: {live[-1]} ({time.time() - t0:.0f} s; lag p99 "
                  f"{measured.summary['client']['send_lag_ms']['p99']:.1f} ms)", flush=True)
        for key in METRICS:  # predictions: repredict() (from the saved profile, raw logs)
            vals = np.array([r[key] for r in live], dtype=float)
            mean = float(vals.mean())
            rows.append({"setting": tag, "rho": rho,
                         "rate_rps": scenario["workload"]["rate_rps"], "metric": key,
                         "live_mean": mean, "live_runs": vals.tolist(),
                         "live_min": float(vals.min()), "live_max": float(vals.max()),
                         "live_spread": float((vals.max() - vals.min()) / mean)})
    endpoint = profile.meta["endpoint"]
    return {"setting": tag, "max_batch_size": max_batch, "window_ms": window_ms,
            "profile": str(path.relative_to(ROOT)),
            "request_overhead": endpoint["request_overhead"],
            "profile_busy_ms": {str(b): profile.median_s(b) * 1e3 for b in sizes},
            "ray_busy_ms": {str(b): v for b, v in busy_by_size(ray_batches).items()},
            "calibration_bursts": endpoint["bursts"], "rows": rows, "raw": raw}


def _save(out: dict[str, Any], stem: str, table: bool = True) -> None:
    """``STEM.json`` (indented), ``STEM.md`` (with ``table``) and the raw logs in
    ``STEM-raw.json`` (one run per line: they are long lists of timestamps).
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = {st["setting"]: st.get("raw", []) for st in out["settings"]}
    lean = {**out, "settings": [{k: v for k, v in st.items() if k != "raw"}
                                for st in out["settings"]]}
    (RESULTS / f"{stem}.json").write_text(json.dumps(lean, indent=1) + "\n")
    if any(raw.values()):
        lines = [json.dumps({"setting": name, **run}, separators=(",", ":"))
                 for name, runs in raw.items() for run in runs]
        (RESULTS / f"{stem}-raw.json").write_text("\n".join(lines) + "\n")
    if table:
        (RESULTS / f"{stem}.md").write_text("\n".join(markdown(out)) + "\n")


def _load(stem: str) -> dict[str, Any]:
    """A results file with its raw logs put back (see :func:`_save`)."""
    out: dict[str, Any] = json.loads((RESULTS / f"{stem}.json").read_text())
    raw_path = RESULTS / f"{stem}-raw.json"
    if raw_path.exists():
        runs = [json.loads(line) for line in raw_path.read_text().splitlines() if line]
        for st in out["settings"]:
            st["raw"] = [{k: v for k, v in r.items() if k != "setting"} for r in runs
                         if r["setting"] == st["setting"]]
    return out



def start_minilm() -> RayServeApp:
    """MiniLM behind ``@serve.batch`` (max 8 / 5 ms until ``/servelab/config`` changes it),
    started and announced.
    """
    app = RayServeApp(ensure_ray(), {"model": "minilm", "model_name": "minilm",
                                     "max_batch_size": 8, "batch_wait_timeout_s": 0.005,
                                     "max_ongoing_requests": 64})
    app.start()
    print(f"Ray Serve up in {app.started_s:.0f} s", flush=True)
    return app

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="8/5,16/10",
                    help="max_batch_size/batch_wait_timeout_ms pairs")
    ap.add_argument("--rhos", default="0.3,0.6,0.8,0.9")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=8, help="calibration bursts per size")
    ap.add_argument("--tag", default="",
                    help="write fidelity_rayserve-TAG.{json,md} and its profiles (default: "
                         "fidelity_rayserve.{json,md})")
    ap.add_argument("--repredict", action="store_true",
                    help="recompute the predictions of the committed results (no server)")
    args = ap.parse_args()
    stem = f"fidelity_rayserve-{args.tag}" if args.tag else "fidelity_rayserve"
    if args.repredict:
        out = _load(stem)
        repredict(out)
        _save(out, stem)
        print("\n".join(markdown(out)))
        return
    rhos = [float(x) for x in args.rhos.split(",")]
    settings = [(int(a), float(b)) for a, b in (x.split("/") for x in args.settings.split(","))]
    overhead = client_overhead(3.0)
    app = start_minilm()
    results = []
    try:
        for max_batch, window_ms in settings:
            results.append(one_setting(app.url, max_batch, window_ms, rhos, args.runs,
                                       args.duration_s, args.reps, stem))
    finally:
        app.stop()
    out = {"load_average_at_end": os.getloadavg(), "settings": results,
           "client_overhead": overhead, "runs": args.runs, "duration_s": args.duration_s,
           "command": "fgrun python benchmarks/fidelity_rayserve.py " + " ".join(sys.argv[1:])}
    _save(out, stem, table=False)  # the measurements first: --repredict can redo the rest
    repredict(out)
    _save(out, stem)
    print("\n".join(markdown(out)))


if __name__ == "__main__":
    main()
