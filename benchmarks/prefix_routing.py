"""Cache-aware routing against join-shortest-queue and round robin, with prefix caching on.

Two synthetic traces (no real Bailian slice could be shipped; servelab/data/README.md):

* ``chat``: the shipped multi-turn chat trace (``builtin:synthetic_chat_blksz_16.jsonl``),
  arrivals compressed by ``time_scale`` to load 4 replicas; each chat's history is cached
  where its earlier turns ran, so following it raises the hit rate.
* ``hot``: one 3,000-token system prompt shared by every request (single turns, 16 sessions
  per second): every replica can cache it, so affinity gains little, and a loose load bound
  (``balance_abs_threshold`` 64) piles requests on the replica that cached it first.

Prints a table and writes ``benchmarks/results/prefix_routing.{csv,md}``. Simulated, seeded:
the numbers are the same on any machine. Run: ``python -m benchmarks.prefix_routing``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import sim.llm
from sim.scenario.synthetic_chat import synthetic_chat_trace, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SCENARIO = "builtin:llm-prefix-cache"
ROUTERS = [("round_robin", 8), ("jsq", 8), ("prefix_affinity", 8), ("prefix_affinity", 64)]


def hot_trace(path: Path) -> Path:
    """The hot-prefix trace (seed 1)."""
    rows = synthetic_chat_trace(np.random.default_rng(1), sessions=800, session_rate_rps=16.0,
                                system_prompts=1, system_tokens_mean=3000, mean_turns=1.0,
                                user_tokens_mean=100, output_tokens_mean=100)
    return write_jsonl(rows, path)


def run_case(trace: str, label: str, time_scale: float) -> list[dict[str, object]]:
    """One trace and load under every router."""
    rows: list[dict[str, object]] = []
    for routing, bound in ROUTERS:
        r = sim.llm.run(SCENARIO, {"replicas": 4, "routing": routing,
                                   "workload.path": trace, "workload.time_scale": time_scale,
                                   "policy.num_gpu_blocks": 1024,
                                   "prefix_affinity.balance_abs_threshold": bound})
        s = r.summary
        per_replica = r.requests.groupby("replica").size().reindex(range(4), fill_value=0)
        rows.append({"trace": label, "time_scale": time_scale,
                     "routing": routing + (f" (bound {bound})" if routing ==
                                           "prefix_affinity" else ""),
                     "hit_rate_pct": round(100 * s["prefix_cache"]["hit_rate"], 1),
                     "ttft_p50_ms": round(s["ttft_ms"]["p50"], 1),
                     "ttft_p99_ms": round(s["ttft_ms"]["p99"], 1),
                     "e2e_p50_ms": round(s["e2e_ms"]["p50"], 1),
                     "requests_per_replica": "/".join(map(str, per_replica.tolist()))})
    return rows


def markdown(table: pd.DataFrame) -> str:
    """A GitHub table (no tabulate dependency)."""
    lines = ["| " + " | ".join(table.columns) + " |",
             "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(
        index=False)]
    return "\n".join(lines)


def main() -> None:
    """Run every case, print and write the table."""
    rows: list[dict[str, object]] = []
    rows += run_case("builtin:synthetic_chat_blksz_16.jsonl", "chat", 0.35)
    rows += run_case("builtin:synthetic_chat_blksz_16.jsonl", "chat", 0.25)
    with tempfile.TemporaryDirectory() as tmp:
        rows += run_case(str(hot_trace(Path(tmp) / "hot.jsonl")), "hot", 1.0)
    table = pd.DataFrame(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    table.to_csv(RESULTS / "prefix_routing.csv", index=False)
    text = ("# Prefix-affinity routing vs jsq and round robin (4 replicas, prefix caching on, "
            "1024 blocks of 16 tokens each; simulated)\n\n" + markdown(table)
            + "\n")
    (RESULTS / "prefix_routing.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
