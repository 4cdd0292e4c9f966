"""Simulator speed: requests per second of wall time, against Ciw, and peak memory.

Cases (all in one run, so the ratios share the machine's state):
  (a) M/M/1 at rho = 0.9 (policy none, exponential 1 ms service);
  (b) dynamic batching (max 8, wait 2 ms) on linear 5 ms + 1 ms/item at device
      utilisation ~0.6;
  Ciw M/M/1 at rho = 0.9 for the ratio;
  peak memory (max RSS of a fresh process) at 1M and 5M requests of case (a).

Usage: python benchmarks/sim_speed.py [--n 1000000] [--mem-n 1000000,5000000] [--ciw-n 200000]
Writes benchmarks/results/sim_speed.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

MM1 = {"seed": 1, "service": {"kind": "exponential", "mean_ms": 1.0},
       "workload": {"kind": "poisson", "rate_rps": 900}, "policy": {"kind": "none"}}
DYN = {"seed": 1, "service": {"kind": "linear", "base_ms": 5, "per_item_ms": 1},
       "workload": {"kind": "poisson", "rate_rps": 130},
       "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 2}}


def run_sim(cfg: dict, n: int) -> dict:
    import sim

    cfg = json.loads(json.dumps(cfg))
    cfg["workload"]["n_requests"] = n
    t0 = time.perf_counter()
    result = sim.run(cfg)
    wall = time.perf_counter() - t0
    return {"n": n, "wall_s": wall, "engine_s": result.meta["wall_s"],
            "rps_total": n / wall, "rps_engine": n / result.meta["wall_s"],
            "utilization": result.summary["utilization"],
            "mean_batch": result.summary["mean_batch_size"],
            "mean_wait_ms": result.summary["queue_ms"]["mean"]}


def run_ciw(n: int) -> dict:
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


_HWM = ("def hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM'):\n"
        "            return int(line.split()[1]) / 1024\n")


def peak_memory_mb(n: int) -> dict:
    """Run case (a) with n requests in a fresh process; report its peak RSS (VmHWM, which,
    unlike ru_maxrss, is not inherited from the parent across fork and exec).
    """
    code = (_HWM + "import json,sys;sys.path.insert(0,'.')\n"
            "from benchmarks.sim_speed import run_sim, MM1\n"
            f"r=run_sim(MM1,{n})\n"
            "r['maxrss_mb']=hwm()\n"
            "print(json.dumps(r))")
    base = (_HWM + "import json,sim,sim.runner\n"
            "print(json.dumps({'maxrss_mb':hwm()}))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, check=True)
    idle = subprocess.run([sys.executable, "-c", base], capture_output=True, text=True,
                          cwd=root, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["baseline_mb"] = json.loads(idle.stdout.strip().splitlines()[-1])["maxrss_mb"]
    row["bytes_per_request"] = (row["maxrss_mb"] - row["baseline_mb"]) * 2**20 / n
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--ciw-n", type=int, default=200_000)
    ap.add_argument("--mem-n", default="1000000,5000000")
    args = ap.parse_args()
    rows = []
    mm1 = run_sim(MM1, args.n)
    rows.append(("(a) M/M/1 rho=0.9", mm1))
    dyn = run_sim(DYN, args.n)
    rows.append(("(b) dynamic max8/2ms, rho~0.6", dyn))
    ciw_row = run_ciw(args.ciw_n)
    mems = [peak_memory_mb(int(n)) for n in args.mem_n.split(",") if n]
    ratio = mm1["rps_total"] / ciw_row["rps"]

    lines = [
        "# Simulator speed",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}; one run, all cases in the same process "
        f"({time.strftime('%Y-%m-%d %H:%M')}).",
        "",
        "| case | requests | wall s | req/s (whole run) | req/s (engine only) | utilisation |"
        " mean batch | mean wait ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(f"| {name} | {r['n']:,} | {r['wall_s']:.2f} | {r['rps_total']:,.0f} | "
                     f"{r['rps_engine']:,.0f} | {r['utilization']:.3f} | {r['mean_batch']:.2f} | "
                     f"{r['mean_wait_ms']:.3f} |")
    lines.append(f"| Ciw M/M/1 rho=0.9 | {ciw_row['n']:,} | {ciw_row['wall_s']:.2f} | "
                 f"{ciw_row['rps']:,.0f} | – | – | 1 | {ciw_row['mean_wait_ms']:.3f} |")
    lines += ["", f"servelab / Ciw on M/M/1 (whole run): **{ratio:.1f}x** "
              "(theory mean wait 9.000 ms).", "",
              "| M/M/1 requests | peak RSS MB | idle import MB | bytes / request |",
              "|---:|---:|---:|---:|"]
    for m in mems:
        lines.append(f"| {m['n']:,} | {m['maxrss_mb']:.0f} | {m['baseline_mb']:.0f} | "
                     f"{m['bytes_per_request']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sim_speed.md").write_text(text)
    (RESULTS / "sim_speed.json").write_text(json.dumps(
        {"sim": dict(rows), "ciw": ciw_row, "memory": mems, "ratio_vs_ciw": ratio}, indent=2))


if __name__ == "__main__":
    main()
