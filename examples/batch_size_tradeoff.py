"""Throughput and P99 against max batch size at a fixed load (the core lesson).

The MLP profile (builtin:mlp-cpu) was measured on this project's 2-core machines: one request
costs ~0.7 ms alone but ~0.1 ms per item in a batch of 64, so batching decides whether the
replica keeps up at all. Run from the repository root:
python -m examples.batch_size_tradeoff [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.experiments import sweep

BASE = {"name": "batch-size", "seed": 1, "service": {"kind": "profile", "path": "builtin:mlp-cpu"},
        "workload": {"kind": "poisson", "rate_rps": 2500, "duration_s": 20},
        "policy": {"kind": "greedy", "max_batch_size": 1}, "warmup_s": 2, "slo_ms": 20}


def main(quick: bool = False) -> pd.DataFrame:
    sizes = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32, 64]
    frame = sweep({**BASE, "workload": {**BASE["workload"], "duration_s": 3 if quick else 20}},
                  {"policy.max_batch_size": sizes}, seeds=1 if quick else 3, workers=1)
    table = frame.groupby("policy.max_batch_size")[
        ["throughput_rps", "latency_ms.p50", "latency_ms.p99", "mean_batch_size",
         "utilization"]].mean().reset_index()
    show(table, "greedy batching at 2,500 req/s on builtin:mlp-cpu")
    return table


if __name__ == "__main__":
    main(quick_from_argv())
