"""Client-overhead benchmark of ``servelab bench``: how many requests and token events per
second the open-loop client sustains, and how much latency it adds, against a server that
answers instantly (:mod:`executor.endpoint.stub_lean`, in its own process), for LLM streams
(``--api openai-completions``) and request-level answers (``--api kserve-v2``).

Each point is a constant-rate schedule run through the very functions ``servelab bench``
calls (:func:`executor.endpoint.bench.bench`, :func:`executor.endpoint.request_bench.
bench_requests`). "Sustained": every request sent and finished ok. Added latency is per
request: the client's latency (E2E: the last chunk's arrival minus the send) minus the
server's own time for that request (the stub stamps when it read the request's last byte and
when it wrote the answer, on the same monotonic clock), so it holds the client's send and
receive paths and the loopback; ``lag`` is the send lag (start of the send minus the
scheduled time). ``cpu_ms_per_request``: the client process's CPU time per request (at rates
below the ceiling a busy wait before each send (``--spin-ms`` above 0) makes this overstate the
cost; without it, or at the highest rate, it is the real cost).

Target on the development machine: >= 2,000 streamed requests/s and <= 1 ms added at p99.

Usage: python benchmarks/bench_client.py [--rates 1000,2000,3000] [--v2-rates 2000]
Writes benchmarks/results/bench_client.md and bench_client.json (``--tag T``: with -T in the
names).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.endpoint.bench import bench, make_jobs  # noqa: E402
from executor.endpoint.client import OpenLoop, payload  # noqa: E402
from executor.endpoint.http1 import Pool  # noqa: E402
from executor.endpoint.request_bench import bench_requests  # noqa: E402
from executor.endpoint.servers import free_port  # noqa: E402
from sim.drivers.llm_simulate import llm_schedule  # noqa: E402
from sim.metrics.rundir import versions  # noqa: E402
from sim.scenario.llm import load_llm_scenario  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
KEYS = ["sent_rps", "completed_rps", "token_events_per_s", "added_p50_ms", "added_p99_ms",
        "send_path_p99_ms", "recv_path_p99_ms", "e2e_p99_ms", "lag_p50_ms", "lag_p99_ms",
        "cpu_share", "cpu_ms_per_request", "preempted_per_s"]


def llm_scenario(path: Path, rate_rps: float, duration_s: float, output_tokens: int) -> Path:
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


def v2_scenario(path: Path, rate_rps: float, duration_s: float) -> Path:
    """A constant-rate request-level scenario with a one-item KServe v2 payload."""
    path.write_text(yaml.safe_dump({
        "name": f"client-v2-{rate_rps:g}", "seed": 1,
        "service": {"kind": "linear", "base_ms": 1, "per_item_ms": 0},
        "workload": {"kind": "constant", "rate_rps": rate_rps,
                     "n_requests": int(rate_rps * duration_s)},
        "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 1},
        "payload": {"model": "instant", "inputs": [{"name": "input", "datatype": "BYTES",
                                                    "shape": [-1]}]}}))
    return path


def stub_log(url: str) -> dict[int, tuple[float, float]]:
    """The stub's times per request since the last call: key -> (recv_s, sent_s), the
    ``time.perf_counter`` times (one clock for every process) it read the request's last
    byte and wrote its answer.
    """
    with urllib.request.urlopen(f"{url}/stub/log", timeout=30) as resp:
        log = json.loads(resp.read())
    return {k: (r, s) for k, r, s in zip(log["keys"], log["recv_s"], log["sent_s"],
                                         strict=True)}


def preemptions() -> int:
    """This process's involuntary context switches so far (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("nonvoluntary_ctxt_switches"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _row(req: Any, summary: dict[str, Any], meta: dict[str, Any], rate: float,
         server: np.ndarray, tokens: int, t0: float, preempted: int) -> dict[str, float]:
    """One run's figures; ``server``: per request the stub's (recv_s, sent_s), NaN when not
    matched; ``t0``: the client's clock start (its times are since then).
    """
    sent = len(req)
    span = float(req["arrival_s"].max() - req["arrival_s"].min()) if sent > 1 else float("nan")
    done = float(req["finish_s"].max() - req["arrival_s"].min())
    e2e = (req["finish_s"] - req["arrival_s"]).to_numpy(float)
    # added = send path (the client's send stamp -> the stub read it) + receive path (the
    # stub wrote the answer -> the client read its last byte)
    send_path = (server[:, 0] - t0 - req["arrival_s"].to_numpy(float)) * 1e3
    recv_path = (t0 + req["finish_s"].to_numpy(float) - server[:, 1]) * 1e3
    added = send_path + recv_path
    lag = req["send_lag_s"].to_numpy(float) * 1e3
    cpu = float(summary["client"]["cpu_share"])
    return {"rate_rps": rate, "requests": sent, "ok": int(summary["ok"]),
            "sent_rps": (sent - 1) / span, "completed_rps": int(summary["ok"]) / done,
            "token_events_per_s": tokens / done,
            "added_p50_ms": float(np.nanpercentile(added, 50)),
            "added_p99_ms": float(np.nanpercentile(added, 99)),
            "send_path_p99_ms": float(np.nanpercentile(send_path, 99)),
            "recv_path_p99_ms": float(np.nanpercentile(recv_path, 99)),
            "e2e_p99_ms": float(np.nanpercentile(e2e * 1e3, 99)),
            "lag_p50_ms": float(np.percentile(lag, 50)),
            "lag_p99_ms": float(np.percentile(lag, 99)),
            "cpu_share": cpu, "cpu_ms_per_request": cpu * float(meta["wall_s"]) * 1e3 / sent,
            "preempted_per_s": preempted / float(meta["wall_s"]),
            "matched": int(np.isfinite(server[:, 0]).sum())}


def llm_point(url: str, rate: float, duration_s: float, tokens: int, tmp: Path,
              spin_s: float = 0.0, precise: bool = True) -> dict[str, float]:
    """One streamed run at ``rate`` requests/s (``precise``: the client's timerfd sends)."""
    path = llm_scenario(tmp / "s.yaml", rate, duration_s, tokens)
    stub_log(url)  # empty it (the preflight's request)
    box: list[OpenLoop] = []

    def hold(client: OpenLoop) -> None:
        client.precise_timer = precise
        box.append(client)

    switched = preemptions()
    result = bench(path, url, model="instant", drain_timeout_s=5.0, spin_s=spin_s,
                   prompt_salt=0, on_client=hold)
    switched = preemptions() - switched
    own = stub_log(url)
    scn = load_llm_scenario(path)
    schedule, prompt, output = llm_schedule(scn)
    jobs = make_jobs(schedule.arrival_s, prompt, output, "openai-completions", scn.seed,
                     (10, 250))
    req = result.requests
    server = np.array([own.get(hash(tuple(jobs[i].prompt)), (np.nan, np.nan))
                       for i in req["id"]], dtype=float).reshape(-1, 2)
    return _row(req, result.summary, result.meta, rate, server,
                int(req["received_tokens"].sum()), box[0].t0, switched)


def v2_point(url: str, rate: float, duration_s: float, tmp: Path) -> dict[str, float]:
    """One KServe v2 run at ``rate`` requests/s."""
    path = v2_scenario(tmp / "v.yaml", rate, duration_s)
    stub_log(url)
    box: list[OpenLoop] = []
    switched = preemptions()
    result = bench_requests(path, url, api="kserve-v2", drain_timeout_s=5.0,
                            on_client=box.append)
    switched = preemptions() - switched
    own = stub_log(url)
    req = result.requests
    server = np.array([own.get(int(i), (np.nan, np.nan)) for i in req["id"]],
                      dtype=float).reshape(-1, 2)
    row = _row(req, result.summary, result.meta, rate, server, 0, box[0].t0, switched)
    return {**row, "spin_ms": OpenLoop.spin_s * 1e3}  # bench_requests: the client's default


def floor_point(url: str, rate: float, duration_s: float, tokens: int, tmp: Path
                ) -> dict[str, float]:
    """The machine's floor: the same requests at the same rate from the plainest client
    Python has (one blocking socket, one request at a time, a busy wait for each send time,
    the answer read until its last chunk), measured as the client is. What ``servelab
    bench`` adds beyond this row is the client's own cost; the rest is the machine's (the
    loopback, the scheduler, the stub).
    """
    path = llm_scenario(tmp / "f.yaml", rate, duration_s, tokens)
    scn = load_llm_scenario(path)
    schedule, prompt, output = llm_schedule(scn)
    jobs = make_jobs(schedule.arrival_s, prompt, output, "openai-completions", scn.seed,
                     (10, 250))
    pool = Pool(f"{url}/v1/completions")
    requests = [pool.request(json.dumps(payload("openai-completions", "instant", j, None))
                             .encode()) for j in jobs]
    stub_log(url)
    sock = socket.create_connection((pool.host, pool.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent = np.full(len(jobs), np.nan)
    done = np.full(len(jobs), np.nan)
    clock = time.perf_counter
    t0 = clock()
    try:
        for k, (job, request) in enumerate(zip(jobs, requests, strict=True)):
            while clock() - t0 < job.scheduled_s:
                pass
            sent[k] = clock() - t0
            sock.sendall(request)
            buf = b""
            while not buf.endswith(b"0\r\n\r\n"):
                buf += sock.recv(65536)
            done[k] = clock() - t0
    finally:
        sock.close()
    own = stub_log(url)
    server = np.array([own.get(hash(tuple(j.prompt)), (np.nan, np.nan)) for j in jobs],
                      dtype=float).reshape(-1, 2)
    send_path = (server[:, 0] - t0 - sent) * 1e3
    recv_path = (t0 + done - server[:, 1]) * 1e3
    added = send_path + recv_path
    lag = (sent - np.array([j.scheduled_s for j in jobs])) * 1e3
    return {"rate_rps": rate, "requests": len(jobs), "ok": len(jobs),
            "sent_rps": (len(jobs) - 1) / float(sent[-1] - sent[0]),
            "completed_rps": len(jobs) / float(done[-1] - sent[0]),
            "token_events_per_s": len(jobs) * tokens / float(done[-1] - sent[0]),
            "added_p50_ms": float(np.nanpercentile(added, 50)),
            "added_p99_ms": float(np.nanpercentile(added, 99)),
            "send_path_p99_ms": float(np.nanpercentile(send_path, 99)),
            "recv_path_p99_ms": float(np.nanpercentile(recv_path, 99)),
            "e2e_p99_ms": float(np.nanpercentile((done - sent) * 1e3, 99)),
            "lag_p50_ms": float(np.percentile(lag, 50)),
            "lag_p99_ms": float(np.percentile(lag, 99)),
            "cpu_share": float("nan"), "cpu_ms_per_request": float("nan"),
            "preempted_per_s": float("nan"),
            "matched": int(np.isfinite(server[:, 0]).sum())}


def _table(title: str, rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"### {title}", "", "| offered req/s | spin ms | send timer | ok / sent | "
             "added_p99_ms per run | " + " | ".join(KEYS) + " |",
             "|---|---|---|---|---|" + "---|" * len(KEYS)]
    keys = sorted({(r["rate_rps"], r.get("spin_ms", 1.0), r.get("timer", "loop"))
                   for r in rows})
    for rate, spin, timer in keys:
        mine = [r for r in rows if (r["rate_rps"], r.get("spin_ms", 1.0),
                                    r.get("timer", "loop")) == (rate, spin, timer)]
        cells = []
        for k in KEYS:
            v = np.array([r[k] for r in mine])
            cells.append(f"{np.median(v):.3g} [{v.min():.3g}–{v.max():.3g}]")
        okc = f"{sum(r['ok'] for r in mine)} / {sum(r['requests'] for r in mine)}"
        each = ", ".join(f"{r['added_p99_ms']:.2f}" for r in mine)
        lines.append(f"| {rate:g} | {spin:g} | {timer} | {okc} | {each} | "
                     + " | ".join(cells) + " |")
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="1000,2000,3000")
    ap.add_argument("--v2-rates", default="2000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=3.0)
    ap.add_argument("--output-tokens", type=int, default=8)
    ap.add_argument("--floor-rates", default="2000",
                    help="rates for the floor: a blocking one-socket client (see floor_point)")
    ap.add_argument("--spin-ms", default="0",
                    help="the client's busy wait before each send; several: compared")
    ap.add_argument("--timers", default="precise",
                    help="the client's send timer: precise (timerfd), loop (the event "
                         "loop's 1 ms timers); several: compared")
    ap.add_argument("--tag", default="",
                    help="suffix of the results' names (a run kept beside the main one)")
    ap.add_argument("--note", default="", help="how the run was made (e.g. under fgrun)")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    v2_rates = [float(r) for r in args.v2_rates.split(",") if r]
    spins = [float(v) for v in args.spin_ms.split(",")]
    floor_rates = [float(r) for r in args.floor_rates.split(",") if r]
    timers = args.timers.split(",")
    if not set(timers) <= {"precise", "loop"}:
        ap.error(f"--timers {args.timers!r}: allowed: precise, loop")
    # SIGTERM ends the run through the finally below, so the stub does not outlive it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stub = subprocess.Popen([sys.executable, "-m", "executor.endpoint.stub_lean", "--port",
                             str(port)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert stub.stdout is not None
    assert stub.stdout.readline().strip() == "ready"
    llm_rows: list[dict[str, float]] = []
    v2_rows: list[dict[str, float]] = []
    floor_rows: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.repeats):  # repeats interleaved: drift spreads over rates
                for rate in rates:
                    for spin in spins:
                        for timer in timers:
                            row = llm_point(url, rate, args.duration_s, args.output_tokens,
                                            Path(tmp), spin / 1e3, timer == "precise")
                            llm_rows.append({**row, "repeat": rep, "spin_ms": spin,
                                             "timer": timer})
                            print("llm", timer, json.dumps(
                                {k: round(v, 3) for k, v in row.items()}), flush=True)
                for rate in floor_rates:
                    row = floor_point(url, rate, args.duration_s, args.output_tokens, Path(tmp))
                    floor_rows.append({**row, "repeat": rep, "spin_ms": float("inf"),
                                       "timer": "busy wait"})
                    print("floor", json.dumps({k: round(v, 3) for k, v in row.items()}),
                          flush=True)
                for rate in v2_rates:
                    row = v2_point(url, rate, args.duration_s, Path(tmp))
                    v2_rows.append({**row, "repeat": rep, "timer": "precise"})
                    print("v2", json.dumps({k: round(v, 3) for k, v in row.items()}),
                          flush=True)
    finally:
        stub.terminate()
        stub.wait(10)
        stub.stdout.close()
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    lines = ["# servelab bench: client overhead against the instant stub", "",
             f"{args.duration_s:g} s per run, {args.repeats} repeats per rate (interleaved); "
             f"median [min–max]. Event loop: {loop}. Server: executor/endpoint/stub_lean.py in "
             f"its own process. Host: {platform.node()}, {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f} at the end (shared machine). {args.note}", "",
             "added = client E2E − the stub's own time for the same request (matched by "
             "prompt / request id) = send path (the client's send stamp -> the stub read the "
             "request) + receive path (the stub wrote the answer -> the client read it); the "
             "send path also holds the stub's queue when requests leave in a burst. lag = send "
             "lag; preempted_per_s = the client's involuntary context switches per second; "
             "send timer precise = a timerfd at each send time, loop = the event loop's 1 ms "
             "timers.", ""]
    if llm_rows:
        lines += _table(f"Streamed (openai-completions, {args.output_tokens} output tokens, "
                        "one SSE chunk each)", llm_rows)
    if floor_rows:
        lines += _table("Floor: the plainest client (one blocking socket, busy-wait sends, "
                        "one request at a time), same requests and stub", floor_rows)
    if v2_rows:
        lines += _table("Request-level (kserve-v2, one item per request)", v2_rows)
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.tag}" if args.tag else ""
    (RESULTS / f"bench_client{suffix}.md").write_text(text)
    (RESULTS / f"bench_client{suffix}.json").write_text(json.dumps(
        {"llm": llm_rows, "v2": v2_rows, "floor": floor_rows, "versions": versions(),
         "host": platform.node(), "cpus": os.cpu_count(), "loop": loop,
         "note": args.note}, indent=1))


if __name__ == "__main__":
    main()
