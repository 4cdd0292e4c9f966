"""Client-overhead benchmark of ``servelab bench``: how many streamed requests and token events
per second the open-loop client sustains, and how much latency it adds, against the local stub
(:mod:`executor.endpoint.stub`, mode ``instant``: every token at once) in its own process.

Each point is a constant-rate schedule; "sustained" means every request was sent and finished
ok and the send lag stayed bounded. E2E against the instant stub is an upper bound on the
latency the client adds (the stub's own handling and the loopback are in it too).
Target on the development machine: >= 2,000 streamed requests/s, <= 1 ms added at p99.
``cpu_ms_per_request`` (the client's CPU time per request) gives the rate one free core
would sustain (1000 / it), whatever else the machine is running.

Usage: python benchmarks/bench_client.py [--rates 500,1000,2000,3000] [--repeats 3]
Writes benchmarks/results/bench_client.md and bench_client.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.endpoint.bench import bench  # noqa: E402
from executor.endpoint.servers import free_port  # noqa: E402
from sim.metrics.rundir import versions  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def scenario(path: Path, rate_rps: float, duration_s: float, output_tokens: int) -> Path:
    """A constant-rate LLM scenario (16-token prompts) written to ``path``."""
    path.write_text(yaml.safe_dump({
        "name": f"client-{rate_rps:g}", "seed": 1,
        "service": {"kind": "llm_linear", "base_ms": 1, "per_prefill_token_ms": 0.0,
                    "per_decode_seq_ms": 0.0},
        "workload": {"kind": "constant", "rate_rps": rate_rps,
                     "n_requests": int(rate_rps * duration_s), "prompt_tokens": 16,
                     "output_tokens": output_tokens},
        "policy": {"kind": "vllm", "max_num_seqs": 1024, "max_num_batched_tokens": 65536,
                   "block_size": 16, "num_gpu_blocks": 100000},
        "warmup_s": 0}))
    return path


def point(url: str, rate: float, duration_s: float, tokens: int, tmp: Path) -> dict[str, float]:
    """One run at ``rate`` requests/s; what the client drove and added."""
    result = bench(scenario(tmp / "s.yaml", rate, duration_s, tokens), url, model="instant",
                   drain_timeout_s=5.0)
    req, s = result.requests, result.summary
    sent = len(req)
    span = float(req["arrival_s"].max() - req["arrival_s"].min()) if sent > 1 else float("nan")
    done = float(req["finish_s"].max() - req["arrival_s"].min())
    e2e = (req["finish_s"] - req["arrival_s"]).to_numpy() * 1e3
    lag = req["send_lag_s"].to_numpy() * 1e3
    return {"rate_rps": rate, "requests": sent, "ok": int(s["ok"]),
            "sent_rps": (sent - 1) / span, "completed_rps": int(s["ok"]) / done,
            "token_events_per_s": int(req["received_tokens"].sum()) / done,
            "e2e_p50_ms": float(np.nanpercentile(e2e, 50)),
            "e2e_p99_ms": float(np.nanpercentile(e2e, 99)),
            "lag_p50_ms": float(np.percentile(lag, 50)),
            "lag_p99_ms": float(np.percentile(lag, 99)),
            "cpu_share": float(s["client"]["cpu_share"]),
            # the client's CPU time per request: what sets its ceiling on a free core
            "cpu_ms_per_request": float(s["client"]["cpu_share"]) * float(result.meta["wall_s"])
            * 1e3 / sent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="500,1000,2000,3000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=3.0)
    ap.add_argument("--output-tokens", type=int, default=8)
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    # SIGTERM ends the run through the finally below, so the stub does not outlive it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "executor.endpoint.stub", "--port",
                             str(port)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert stub.stdout is not None
    assert stub.stdout.readline().strip() == "ready"
    rows: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rate in rates:
                for rep in range(args.repeats):
                    row = point(f"http://127.0.0.1:{port}", rate, args.duration_s,
                                args.output_tokens, Path(tmp))
                    row["repeat"] = rep
                    rows.append(row)
                    print(json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
    finally:
        stub.terminate()
        stub.wait(10)
        stub.stdout.close()
    keys = ["sent_rps", "completed_rps", "token_events_per_s", "e2e_p50_ms", "e2e_p99_ms",
            "lag_p50_ms", "lag_p99_ms", "cpu_share", "cpu_ms_per_request"]
    lines = ["# servelab bench: client overhead against the instant stub", "",
             f"{args.duration_s:g} s per run, {args.output_tokens} output tokens per request "
             f"(one SSE chunk each), {args.repeats} repeats per rate; median [min–max]. "
             f"Host: {platform.node()}, {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f} at the end (shared machine).", "",
             "| offered req/s | ok / sent | " + " | ".join(keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for rate in rates:
        mine = [r for r in rows if r["rate_rps"] == rate]
        cells = []
        for k in keys:
            v = np.array([r[k] for r in mine])
            cells.append(f"{np.median(v):.3g} [{v.min():.3g}–{v.max():.3g}]")
        okc = f"{sum(r['ok'] for r in mine)} / {sum(r['requests'] for r in mine)}"
        lines.append(f"| {rate:g} | {okc} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_client.md").write_text(text)
    (RESULTS / "bench_client.json").write_text(json.dumps(
        {"rows": rows, "versions": versions(), "host": platform.node(),
         "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
