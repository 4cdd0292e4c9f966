"""Simulator speed and memory against the targets of the speed issue, in one run.

Cases (all timed in the same run, so the ratios share the machine's state):
  * lean SimPy reference: M/M/1 at rho = 0.9, one server process, one timeout per customer,
    inter-arrival and service draws precomputed with numpy (the floor of a SimPy model);
  * servelab M/M/1 at rho = 0.9 (policy none, exponential 1 ms service): engine only
    (``meta.wall_s``) and whole process (``servelab simulate ... --out DIR`` in a fresh
    process: start-up, simulation, summary, run directory);
  * Ciw M/M/1 at rho = 0.9;
  * dynamic batching at heavy load (max batch 16, max wait 5 ms, 5 ms + 0.5 ms/item at
    1,100 req/s: mean batch about 12): engine and whole process;
  * the dashboard's re-simulation: ``builtin:dyn-demo`` stretched to 200,000 requests
    (what a knob move on the Explore page runs);
  * peak memory (VmHWM of a fresh process) of ``sim.run`` with full records at 1M and 5M
    M/M/1 requests, and with ``records="summary"`` and ``records="sketch"`` at 5M and 50M,
    less the idle import (with the sketch's P99 against the exact one of the same run);
  * the whole process with ``--records summary`` (no tables to write);
  * each speed case twice, in plain Python and with the optional compiled build
    (``servelab compile``; skipped when no current build is present, or built first with
    ``--build``), every case in a fresh process (``SERVELAB_PURE_PYTHON=1`` for plain);
  * the floor that the policy contract sets: one SimPy event (a callback chain of timeouts,
    the cheapest SimPy use) plus one policy call per decision (``NoBatching.decide`` on a
    real queue view, returning a ``Decision``), per mode, and the M/M/1 ratio to the lean
    reference that a simulator with free bookkeeping would reach.

Usage: python benchmarks/sim_speed.py [--n 1000000] [--ciw-n 200000] [--mem-n 1000000,5000000]
       [--mem-summary-n 5000000,50000000] [--mem-sketch-n 5000000,50000000] [--build]
Writes benchmarks/results/sim_speed.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

MM1: dict[str, Any] = {"seed": 1, "service": {"kind": "exponential", "mean_ms": 1.0},
                       "workload": {"kind": "poisson", "rate_rps": 900},
                       "policy": {"kind": "none"}}
DYN: dict[str, Any] = {"seed": 1, "service": {"kind": "linear", "base_ms": 5, "per_item_ms": 0.5},
                       "workload": {"kind": "poisson", "rate_rps": 1100},
                       "policy": {"kind": "dynamic", "max_batch_size": 16, "max_wait_ms": 5}}
DASHBOARD_N = 200_000


def with_n(cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """A copy of ``cfg`` sending ``n`` requests."""
    out: dict[str, Any] = json.loads(json.dumps(cfg))
    out["workload"]["n_requests"] = n
    return out


def lean_simpy(n: int, rate_rps: float = 900.0, mean_s: float = 1e-3, seed: int = 1) -> dict:
    """The lean SimPy M/M/1: one server process, one timeout per customer."""
    import numpy as np
    import simpy

    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, n)).tolist()
    service = rng.exponential(mean_s, n).tolist()
    wait = [0.0] * n
    env = simpy.Environment()

    def server(env: simpy.Environment):  # type: ignore[no-untyped-def]
        for i in range(n):
            a = arrival[i]
            start = a if a > env.now else env.now
            wait[i] = start - a
            yield env.timeout(start + service[i] - env.now)

    env.process(server(env))
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    return {"n": n, "wall_s": wall, "rps": n / wall, "mean_wait_ms": sum(wait) / n * 1e3}


def run_sim(cfg: dict[str, Any], n: int, records: str = "full") -> dict[str, Any]:
    """``sim.run`` in this process: engine and total time of the call."""
    import sim

    t0 = time.perf_counter()
    result = sim.run(with_n(cfg, n), records=records)
    wall = time.perf_counter() - t0
    done = sum(result.meta["status_counts"].values())
    return {"n": done, "records": result.meta["records"], "wall_s": wall,
            "engine_s": result.meta["wall_s"], "rps_total": done / wall,
            "rps_engine": done / result.meta["wall_s"],
            "p99_ms": result.summary["latency_ms"]["p99"],
            "utilization": result.summary["utilization"],
            "mean_batch": result.summary["mean_batch_size"],
            "mean_wait_ms": result.summary["queue_ms"]["mean"]}


def _env(pure: bool) -> dict[str, str]:
    """The environment of a case's process: plain Python, or the compiled build if present."""
    env = {k: v for k, v in os.environ.items() if k != "SERVELAB_PURE_PYTHON"}
    if pure:
        env["SERVELAB_PURE_PYTHON"] = "1"
    return env


def whole_process(cfg: dict[str, Any], n: int, records: str = "full",
                  pure: bool = True) -> dict[str, Any]:
    """``servelab simulate SCENARIO --out DIR -q`` in a fresh process, timed from outside."""
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(with_n(cfg, n)))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "servelab.cli", "simulate", str(path), "--out",
                        str(Path(tmp) / "run"), "-q", "--records", records], check=True,
                       cwd=ROOT, capture_output=True, env=_env(pure))
        wall = time.perf_counter() - t0
        meta = json.loads((Path(tmp) / "run" / "meta.json").read_text())
    return {"n": n, "records": records, "wall_s": wall, "rps": n / wall,
            "engine_s": meta["wall_s"], "compiled": len(meta["compiled"])}


def run_ciw(n: int) -> dict[str, Any]:
    """Ciw's M/M/1 at the same load (same units: ms)."""
    import ciw

    net = ciw.create_network(arrival_distributions=[ciw.dists.Exponential(rate=0.9)],
                             service_distributions=[ciw.dists.Exponential(rate=1.0)],
                             number_of_servers=[1])
    ciw.seed(1)
    q = ciw.Simulation(net)
    t0 = time.perf_counter()
    q.simulate_until_max_customers(n, method="Finish")
    wall = time.perf_counter() - t0
    recs = q.get_all_records()
    return {"n": len(recs), "wall_s": wall, "rps": len(recs) / wall,
            "mean_wait_ms": sum(r.waiting_time for r in recs) / len(recs)}


def dashboard_resim() -> dict[str, Any]:
    """The Explore page's re-simulation of builtin:dyn-demo at the dashboard's cap."""
    import sim

    scenario = sim.load_scenario("builtin:dyn-demo")
    duration_s = DASHBOARD_N / scenario.workload.rate_rps  # type: ignore[union-attr]
    t0 = time.perf_counter()
    result = sim.run("builtin:dyn-demo", overrides={"workload.duration_s": duration_s})
    wall = time.perf_counter() - t0
    return {"n": len(result.requests), "wall_s": wall, "engine_s": result.meta["wall_s"],
            "mean_batch": result.summary["mean_batch_size"]}


def contract_floor(n: int = 300_000) -> dict[str, float]:
    """Per-decision cost of what the contract cannot do without, in this process's mode:
    one SimPy event (timeouts chained by callbacks, the driver's cheapest use of SimPy) and
    one policy call (``NoBatching.decide`` on a real FIFO queue's view, a ``Decision`` back).
    """
    import numpy as np
    import simpy

    from sim.serving.policies.simple import NoBatching
    from sim.serving.queues import FifoQueue
    from sim.serving.records import RequestTable
    from sim.serving.types import ReplicaView

    delays = np.random.default_rng(1).exponential(1e-3, n).tolist()
    env = simpy.Environment()
    left = [n]

    def again(event: simpy.Event) -> None:
        left[0] -= 1
        if left[0]:
            nxt = env.timeout(delays[left[0]], None)
            nxt.callbacks.append(again)

    first = env.timeout(delays[0], None)
    first.callbacks.append(again)
    t0 = time.perf_counter()
    env.run()
    event_s = (time.perf_counter() - t0) / n

    queue = FifoQueue(RequestTable(np.zeros(4)), 0)
    queue.push(0)
    policy, view, replica = NoBatching(), queue.view, ReplicaView(0)
    t0 = time.perf_counter()
    for _ in range(n):
        policy.decide(0.0, view, replica)
    policy_s = (time.perf_counter() - t0) / n
    return {"event_us": event_s * 1e6, "policy_us": policy_s * 1e6}


_MODE_CASES = """
import json, sys
sys.path.insert(0, '.')
from benchmarks.sim_speed import MM1, DYN, run_sim, dashboard_resim, contract_floor, lean_simpy
from sim import native
n = int(sys.argv[1])
out = {"lean": lean_simpy(n), "mm1": run_sim(MM1, n), "dynamic": run_sim(DYN, n),
       "dashboard": dashboard_resim(), "floor": contract_floor(),
       "compiled": native.compiled_modules()}
print(json.dumps(out))
"""


def mode_cases(n: int, pure: bool) -> dict[str, Any]:
    """The in-process speed cases (with the lean reference again) in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", _MODE_CASES, str(n)], capture_output=True,
                          text=True, cwd=ROOT, check=True, env=_env(pure))
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    lean_us = 1e6 / out["lean"]["rps"]
    floor = out["floor"]
    floor["bound_ratio"] = lean_us / (floor["event_us"] + floor["policy_us"])
    return out


_HWM = ("def hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM'):\n"
        "            return int(line.split()[1]) / 1024\n")


def peak_memory_mb(n: int, records: str = "full") -> dict[str, Any]:
    """``sim.run`` of n M/M/1 requests in a fresh process; its peak RSS (VmHWM, which,
    unlike ru_maxrss, is not inherited from the parent across fork and exec).
    """
    code = (_HWM + "import json,sys;sys.path.insert(0,'.')\n"
            "from benchmarks.sim_speed import run_sim, MM1\n"
            f"r=run_sim(MM1,{n},{records!r})\n"
            "r['maxrss_mb']=hwm()\n"
            "print(json.dumps(r))")
    base = (_HWM + "import json,sim,sim.drivers.simulate\n"
            "print(json.dumps({'maxrss_mb':hwm()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True, env=_env(True))
    idle = subprocess.run([sys.executable, "-c", base], capture_output=True, text=True,
                          cwd=ROOT, check=True, env=_env(True))
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["baseline_mb"] = json.loads(idle.stdout.strip().splitlines()[-1])["maxrss_mb"]
    row["bytes_per_request"] = (row["maxrss_mb"] - row["baseline_mb"]) * 2**20 / n
    return row


def _versions() -> dict[str, str]:
    from sim.metrics.rundir import versions

    out = versions()
    try:
        from importlib import metadata
        out["ciw"] = metadata.version("ciw")
    except Exception:
        out["ciw"] = "not installed"
    return out


def _mode_rows(name: str, m: dict[str, Any], mm1_cli: dict[str, Any],
               dyn_cli: dict[str, Any]) -> list[str]:
    """The cases table's rows of one mode."""
    lean, mm1, dyn, dash = m["lean"], m["mm1"], m["dynamic"], m["dashboard"]
    return [
        f"| {name} | lean SimPy M/M/1 rho=0.9 (reference) | {lean['n']:,} | "
        f"{lean['wall_s']:.2f} | – | {lean['rps']:,.0f} | 1 | {lean['mean_wait_ms']:.3f} |",
        f"| {name} | servelab M/M/1 rho=0.9, `sim.run` | {mm1['n']:,} | {mm1['wall_s']:.2f} | "
        f"{mm1['rps_total']:,.0f} | {mm1['rps_engine']:,.0f} | {mm1['mean_batch']:.2f} | "
        f"{mm1['mean_wait_ms']:.3f} |",
        f"| {name} | servelab M/M/1, `servelab simulate --out` | {mm1_cli['n']:,} | "
        f"{mm1_cli['wall_s']:.2f} | {mm1_cli['rps']:,.0f} | "
        f"{mm1_cli['n'] / mm1_cli['engine_s']:,.0f} | 1 | – |",
        f"| {name} | dynamic max 16 / 5 ms, `sim.run` | {dyn['n']:,} | {dyn['wall_s']:.2f} | "
        f"{dyn['rps_total']:,.0f} | {dyn['rps_engine']:,.0f} | {dyn['mean_batch']:.2f} | "
        f"{dyn['mean_wait_ms']:.3f} |",
        f"| {name} | dynamic max 16, `servelab simulate --out` | {dyn_cli['n']:,} | "
        f"{dyn_cli['wall_s']:.2f} | {dyn_cli['rps']:,.0f} | "
        f"{dyn_cli['n'] / dyn_cli['engine_s']:,.0f} | – | – |",
        f"| {name} | dashboard: builtin:dyn-demo at 200k | {dash['n']:,} | "
        f"{dash['wall_s']:.2f} | {dash['n'] / dash['wall_s']:,.0f} | "
        f"{dash['n'] / dash['engine_s']:,.0f} | {dash['mean_batch']:.2f} | – |",
    ]


def _speed_targets(m: dict[str, Any], mm1_cli: dict[str, Any], dyn_cli: dict[str, Any],
                   ciw_row: dict[str, Any]) -> list[tuple[str, str, float, bool]]:
    """(target, wanted, measured, met) of the speed targets in one mode."""
    lean_rps = m["lean"]["rps"]
    engine = m["mm1"]["rps_engine"] / lean_rps
    whole = mm1_cli["rps"] / lean_rps
    ciw = mm1_cli["rps"] / ciw_row["rps"]
    return [
        ("M/M/1 engine / lean SimPy", ">= 0.8", engine, engine >= 0.8),
        ("M/M/1 whole process / lean SimPy", ">= 0.5", whole, whole >= 0.5),
        ("M/M/1 whole process / Ciw", ">= 5", ciw, ciw >= 5),
        ("dynamic max 16, whole process req/s", ">= 500,000", dyn_cli["rps"],
         dyn_cli["rps"] >= 500_000),
        ("dashboard dyn-demo 200k re-simulation, s", "<= 0.5", m["dashboard"]["wall_s"],
         m["dashboard"]["wall_s"] <= 0.5),
    ]


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--ciw-n", type=int, default=200_000)
    ap.add_argument("--mem-n", default="1000000,5000000")
    ap.add_argument("--mem-summary-n", default="5000000,50000000")
    ap.add_argument("--mem-sketch-n", default="5000000,50000000")
    ap.add_argument("--build", action="store_true",
                    help="make the compiled build first (servelab compile) and keep it")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from sim import native
    from sim.metrics.folds import SKETCH_REL_ERROR

    if args.build:
        native.build()
    has_build = bool(native.extension_paths()) and not native.stale_modules()

    plain = mode_cases(args.n, pure=True)
    mm1_cli = whole_process(MM1, args.n)
    dyn_cli = whole_process(DYN, args.n)
    compiled = mode_cases(args.n, pure=False) if has_build else None
    mm1_cli_c = whole_process(MM1, args.n, pure=False) if has_build else None
    dyn_cli_c = whole_process(DYN, args.n, pure=False) if has_build else None
    ciw_row = run_ciw(args.ciw_n)
    mm1_lean_cli = whole_process(MM1, args.n, "summary")
    dyn_lean_cli = whole_process(DYN, args.n, "summary")
    mems = [peak_memory_mb(int(n)) for n in args.mem_n.split(",") if n]
    lean_mems = [peak_memory_mb(int(n), "summary") for n in args.mem_summary_n.split(",") if n]
    sketch_mems = [peak_memory_mb(int(n), "sketch") for n in args.mem_sketch_n.split(",") if n]

    speed = _speed_targets(plain, mm1_cli, dyn_cli, ciw_row)
    speed_c = (_speed_targets(compiled, mm1_cli_c, dyn_cli_c, ciw_row)
               if compiled is not None and mm1_cli_c is not None and dyn_cli_c is not None
               else None)
    speed_rows = []
    for i, (name, want, got, ok) in enumerate(speed):
        if speed_c is None:
            speed_rows.append(f"| {name} | {want} | {_fmt(got)} | {'yes' if ok else 'no'} "
                              "| not built | – |")
        else:
            got_c, ok_c = speed_c[i][2], speed_c[i][3]
            speed_rows.append(f"| {name} | {want} | {_fmt(got)} | {'yes' if ok else 'no'} | "
                              f"{_fmt(got_c)} | {'yes' if ok_c else 'no'} |")
    targets: list[tuple[str, str, str, bool]] = []
    big = max(mems, key=lambda m: m["n"]) if mems else None
    if big is not None:
        targets.append((f"peak bytes / request, full records, {big['n']:,}", "<= 150",
                        f"{big['bytes_per_request']:.0f}", big["bytes_per_request"] <= 150))
    for m in lean_mems:
        targets.append((f"peak bytes / request, summary records, {m['n']:,}", "<= 24",
                        f"{m['bytes_per_request']:.0f}", m["bytes_per_request"] <= 24))
    for m in sketch_mems:
        targets.append((f"peak bytes / request, sketch records, {m['n']:,}", "<= 24",
                        f"{m['bytes_per_request']:.0f}", m["bytes_per_request"] <= 24))
    for m in lean_mems + sketch_mems:
        if m["n"] >= 50_000_000:
            targets.append((f"{m['n']:,} requests, {m['records']} records: peak RSS",
                            "<= 2048 MiB", f"{m['maxrss_mb']:.0f} MiB",
                            m["maxrss_mb"] <= 2048))
    exact_p99 = {m["n"]: m["p99_ms"] for m in mems + lean_mems}
    for m in sketch_mems:
        if m["n"] in exact_p99:
            m["p99_rel_error"] = abs(m["p99_ms"] - exact_p99[m["n"]]) / exact_p99[m["n"]]
            targets.append((f"sketch P99 against the exact one, {m['n']:,}",
                            f"<= {SKETCH_REL_ERROR:.3g} (the stated bound)",
                            f"{m['p99_rel_error']:.2g}", m["p99_rel_error"] <= SKETCH_REL_ERROR))

    floors = [("plain Python", plain)] + ([("compiled", compiled)] if compiled else [])
    case_rows = _mode_rows("plain", plain, mm1_cli, dyn_cli)
    if compiled is not None and mm1_cli_c is not None and dyn_cli_c is not None:
        case_rows += _mode_rows("compiled", compiled, mm1_cli_c, dyn_cli_c)
    lines = [
        "# Simulator speed",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}; one run, all cases in the same run "
        f"({time.strftime('%Y-%m-%d %H:%M')}). This VM is shared: compare the ratios, "
        "not the absolute rates, between runs. Each mode's cases run in a fresh process, "
        "with the lean SimPy reference timed again in that process; \"compiled\" is the "
        "optional build (`servelab compile`).",
        "",
        "## Speed targets",
        "",
        "| target | wanted | plain Python | met | compiled | met |",
        "|---|---|---:|:---:|---:|:---:|",
        *speed_rows,
        "",
        "## Memory targets (plain Python)",
        "",
        "| target | wanted | measured | met |",
        "|---|---|---:|:---:|",
        *[f"| {name} | {want} | {got} | {'yes' if ok else 'no'} |"
          for name, want, got, ok in targets],
        "",
        "## The floor the policy contract sets (M/M/1: one decision per request)",
        "",
        "| mode | one SimPy event µs | one policy call µs | lean SimPy µs / customer | "
        "best M/M/1 engine / lean with free bookkeeping |",
        "|---|---:|---:|---:|---:|",
        *[f"| {name} | {m['floor']['event_us']:.3f} | {m['floor']['policy_us']:.3f} | "
          f"{1e6 / m['lean']['rps']:.3f} | {m['floor']['bound_ratio']:.2f} |"
          for name, m in floors],
        "",
        "## Cases",
        "",
        "| mode | case | requests | wall s | req/s (whole) | req/s (engine) | mean batch | "
        "mean wait ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *case_rows,
        f"| plain | Ciw M/M/1 rho=0.9 | {ciw_row['n']:,} | {ciw_row['wall_s']:.2f} | "
        f"{ciw_row['rps']:,.0f} | – | 1 | {ciw_row['mean_wait_ms']:.3f} |",
        f"| plain | servelab M/M/1, `simulate --records summary --out` | "
        f"{mm1_lean_cli['n']:,} | {mm1_lean_cli['wall_s']:.2f} | {mm1_lean_cli['rps']:,.0f} "
        f"| {mm1_lean_cli['n'] / mm1_lean_cli['engine_s']:,.0f} | 1 | – |",
        f"| plain | dynamic max 16, `simulate --records summary --out` | "
        f"{dyn_lean_cli['n']:,} | {dyn_lean_cli['wall_s']:.2f} | {dyn_lean_cli['rps']:,.0f} "
        f"| {dyn_lean_cli['n'] / dyn_lean_cli['engine_s']:,.0f} | – | – |",
        "",
        "Theory for the M/M/1 mean wait: 9.000 ms.",
        "",
        "| M/M/1 requests | records | peak RSS MiB | idle import MiB | bytes / request | "
        "wall s | P99 ms |",
        "|---:|---|---:|---:|---:|---:|---:|",
        *[f"| {m['n']:,} | {m['records']} | {m['maxrss_mb']:.0f} | {m['baseline_mb']:.0f} | "
          f"{m['bytes_per_request']:.0f} | {m['wall_s']:.0f} | {m['p99_ms']:.6f} |"
          for m in mems + lean_mems + sketch_mems],
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sim_speed.md").write_text(text)
    (RESULTS / "sim_speed.json").write_text(json.dumps(
        {"config": {"mm1": MM1, "dynamic": DYN, "n": args.n, "ciw_n": args.ciw_n,
                    "dashboard_n": DASHBOARD_N},
         "machine": {"processor": platform.processor() or platform.machine(),
                     "python": platform.python_version(), "device": "cpu"},
         "versions": _versions(),
         "plain": plain, "compiled": compiled, "mm1_whole": mm1_cli, "dynamic_whole": dyn_cli,
         "mm1_whole_compiled": mm1_cli_c, "dynamic_whole_compiled": dyn_cli_c,
         "ciw": ciw_row, "mm1_whole_summary": mm1_lean_cli,
         "dynamic_whole_summary": dyn_lean_cli,
         "memory": mems + lean_mems + sketch_mems,
         "speed_targets": [{"target": t[0], "wanted": t[1], "plain": t[2], "met": t[3],
                            "compiled": None if speed_c is None else speed_c[i][2],
                            "met_compiled": None if speed_c is None else speed_c[i][3]}
                           for i, t in enumerate(speed)],
         "targets": [{"target": t[0], "wanted": t[1], "measured": t[2], "met": t[3]}
                     for t in targets]}, indent=2))


if __name__ == "__main__":
    main()
