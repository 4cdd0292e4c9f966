"""The simulator's prefix cache against a real vLLM's: replay a slice of the shipped
hash-block chat trace (``builtin:synthetic_chat_blksz_16.jsonl``, Bailian format, 16-token
blocks) against vLLM's CPU build with automatic prefix caching on and off, and compare with the
simulator's prediction for the server's block size (128 on the CPU backend: 8 trace blocks per
server block) and KV capacity.

For each setting (caching on, then off) the script starts the server (the tiny model,
``servelab server install vllm``'s environment) on a loopback port, calibrates once from the
first server (``calibrate --endpoint``: step model and overheads, used for both predictions),
then runs ``--repeats`` bench runs, each with new block contents (``content_seed``) so each
starts from a cold cache for its own content. Compared: the server's own
``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` (deltas over the run)
against the simulator's, TTFT P50/P99 and E2E P50. Targets: hit rate within 2 percentage
points, TTFT P50 within 10%.

Usage: python benchmarks/prefix_vllm.py [--seconds 45] [--repeats 2] [--budget-s 40]
Writes benchmarks/results/prefix_vllm.md and prefix_vllm.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.endpoint.calibrate import calibrate_endpoint, endpoint_overrides  # noqa: E402
from executor.endpoint.prefix_check import (  # noqa: E402
    linear_service,
    matched_scenario,
    predicted,
    replay,
    server_cache,
)
from executor.endpoint.servers import VllmServer, ensure_vllm, free_port  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SERVER_ARGS = ("--max-num-seqs", "64", "--max-num-batched-tokens", "2048")
METRICS = ("ttft_ms.p50", "ttft_ms.p99", "e2e_ms.p50")


def trace_scenario(seconds: float) -> dict[str, Any]:
    """The first ``seconds`` of the synthetic Bailian-format chat trace (prompt + output
    fit the tiny model's 4,096-token context there).
    """
    return {"name": "prefix-vllm", "seed": 0, "service": {"kind": "llm_linear", "base_ms": 1},
            "workload": {"kind": "hash_trace",
                         "path": "builtin:synthetic_chat_blksz_16.jsonl",
                         "duration_s": seconds},
            "policy": {"kind": "vllm", "max_num_seqs": 64, "max_num_batched_tokens": 2048},
            "warmup_s": 0}


def pick(summary: dict[str, Any], dotted: str) -> float:
    """``summary['a']['b']`` for ``a.b``."""
    head, tail = dotted.split(".")
    return float(summary[head][tail])


def run_setting(caching: bool, args: argparse.Namespace, profile: Path | None
                ) -> tuple[dict[str, Any], Path]:
    """Start the server with caching on or off, (calibrate,) predict and replay."""
    flags = SERVER_ARGS if caching else (*SERVER_ARGS, "--no-enable-prefix-caching")
    server = VllmServer(ensure_vllm(), port=free_port(), args=flags)
    name = "on" if caching else "off"
    print(f"[{name}] starting vLLM {' '.join(flags)} …", flush=True)
    server.start()
    try:
        if profile is None:
            profile = args.out / "profile.json"
            args.out.mkdir(parents=True, exist_ok=True)
            calibrate_endpoint(server.url, profile, budget_s=args.budget_s, reps=5,
                               max_num_seqs=64, max_num_batched_tokens=2048,
                               say=lambda m: print(f"[{name}] {m}", flush=True))
        cache = server_cache(server.url)
        if cache["enable_prefix_caching"] != caching:
            raise SystemExit(f"server reports enable_prefix_caching "
                             f"{cache['enable_prefix_caching']}, wanted {caching}")
        stored = matched_scenario(trace_scenario(args.seconds), cache,
                                  endpoint_overrides(profile))
        sim_stored, _ = predicted(stored)
        scn = matched_scenario(trace_scenario(args.seconds), cache, {
            "service": linear_service(profile)})
        sim, sim_cache = predicted(scn)
        runs = []
        for rep in range(args.repeats):
            t0 = time.perf_counter()
            live, live_cache = replay(scn, server.url, content_seed=1000 + rep)
            row = {"rep": rep, **live_cache,
                   **{m: pick(live.summary, m) for m in METRICS},
                   "ok": int(live.summary["ok"]), "requests": int(live.summary["requests"]),
                   "client_cpu_share": live.summary["client"]["cpu_share"],
                   "send_lag_p99_ms": live.summary["client"]["send_lag_ms"].get("p99")}
            runs.append(row)
            print(f"[{name}] run {rep}: hit rate {row['hit_rate']:.4f}, TTFT p50 "
                  f"{row['ttft_ms.p50']:.1f} ms ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    finally:
        server.stop()
    return {"caching": caching, "server_args": list(flags), "server_cache": cache,
            "sim": {**sim_cache, **{m: pick(sim.summary, m) for m in METRICS},
                    "requests": int(sim.summary["requests"])},
            "sim_stored_profile": {m: pick(sim_stored.summary, m) for m in METRICS},
            "service": scn.service.model_dump(), "runs": runs}, profile


def table(settings: list[dict[str, Any]]) -> list[str]:
    """Markdown: per setting and metric, sim, the runs' median and range, error, target."""
    lines = ["| caching | metric | sim | vLLM median | vLLM runs | error | target | met | "
             "stored-profile sim (error) |", "|---|---|---|---|---|---|---|---|---|"]
    for s in settings:
        name = "on" if s["caching"] else "off"
        for metric in ("hit_rate", *METRICS):
            vals = [r[metric] for r in s["runs"]]
            med = statistics.median(vals)
            sim = s["sim"][metric]
            runs = ", ".join(f"{v:.4g}" for v in vals)
            if metric == "hit_rate":
                if not s["caching"]:
                    lines.append(f"| {name} | hit rate | – (no lookups) | {med:.4g} | {runs} "
                                 "| – | – | – | – |")
                    continue
                err = 100 * (sim - med)
                lines.append(f"| {name} | hit rate | {100 * sim:.2f}% | {100 * med:.2f}% | "
                             f"{runs} | {err:+.2f} pp | ±2 pp | "
                             f"{'yes' if abs(err) <= 2 else 'no'} | same |")
                continue
            err = sim / med - 1
            target = "±10%" if metric == "ttft_ms.p50" else "–"
            met = ("yes" if abs(err) <= 0.10 else "no") if metric == "ttft_ms.p50" else "–"
            stored = s["sim_stored_profile"][metric]
            lines.append(f"| {name} | {metric} | {sim:.4g} | {med:.4g} | {runs} | "
                         f"{100 * err:+.1f}% | {target} | {met} | {stored:.4g} "
                         f"({100 * (stored / med - 1):+.1f}%) |")
    return lines


def fit_text(meta: dict[str, Any]) -> str:
    """The cached-prefix fit in words."""
    fit = (meta.get("cached_prefill") or {}).get("fit")
    if not fit:
        return "no cached-prefix probe in the profile"
    return (f"{fit['a_ms']:.2f} ms + {fit['ms_per_new_token']:.4f} ms per new token + "
            f"{fit['ms_per_context_pair']:.3g} ms per new × cached token + "
            f"{fit['ms_per_sq']:.3g} ms per new token², R² {fit['r2']:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=40.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/servelab-prefix-vllm"))
    ap.add_argument("--tag", default="", help="suffix for the result files")
    args = ap.parse_args()
    t0 = time.perf_counter()
    settings = []
    profile: Path | None = None
    for caching in (True, False):
        setting, profile = run_setting(caching, args, profile)
        settings.append(setting)
    meta = json.loads(profile.read_text())["meta"] if profile else {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"prefix_vllm{args.tag}"
    command = "fgrun python benchmarks/prefix_vllm.py " + " ".join(sys.argv[1:])
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"command": command, "seconds": args.seconds, "repeats": args.repeats,
         "wall_s": time.perf_counter() - t0,
         "cached_prefill": meta.get("cached_prefill"), "endpoint_fit": meta.get("endpoint_fit"),
         "settings": settings},
        indent=1, default=str))
    cache = settings[0]["server_cache"]
    lines = [
        "# Prefix caching against a real vLLM (CPU build 0.32.0, tiny random-weight Llama)", "",
        f"Command: `{command}` (under `fgrun`: CPU priority over the other jobs on this "
        f"shared 2-core VM; {platform.machine()}). Trace: the first {args.seconds:g} s of "
        "`builtin:synthetic_chat_blksz_16.jsonl` (synthetic, Bailian format, 16-token "
        f"blocks), {settings[0]['sim']['requests']} requests; prompts realise the block ids. "
        f"Server: block size {cache['block_size']}, {cache['num_blocks']} usable KV blocks "
        f"(the simulator gets the same), {' '.join(SERVER_ARGS)}. Step model: "
        "`calibrate --endpoint` once on the first server (caching on), used as its own "
        "linear fits (`prefix_check.linear_service`: decode terms from `meta.endpoint_fit`, "
        "prefill terms from its cached-prefix probe `meta.cached_prefill`: "
        f"{fit_text(meta)}). The last column is the stored profile itself "
        "(`service.kind: llm_profile`: grid interpolation, extended from the grid's edge, "
        "plus its `e` per new × cached token). "
        f"{args.repeats} runs per setting, each with new block contents (a cold cache). "
        "Hit rate = the server's `vllm:prefix_cache_hits_total / "
        "vllm:prefix_cache_queries_total` over the run (tokens; new requests only, as "
        "vLLM counts) against the simulator's. Error: sim − vLLM median (pp) for the hit "
        f"rate, sim / vLLM median − 1 otherwise. Wall time: {time.perf_counter() - t0:.0f} s.",
        "", *table(settings)]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
