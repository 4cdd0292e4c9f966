"""Shared queue vs round robin vs JSQ vs power-of-two under skewed service times.

Four replicas, gamma service times with CV 3 (a few very slow batches): a router that ignores
load parks requests behind the slow ones. Run from the repository root: python -m examples.routing [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.experiments import sweep


def main(quick: bool = False) -> pd.DataFrame:
    base = {"seed": 6, "service": {"kind": "gamma", "mean_ms": 10, "cv": 3},
            "workload": {"kind": "poisson", "rate_rps": 320,
                         "n_requests": 5_000 if quick else 100_000},
            "policy": {"kind": "none"}, "replicas": 4, "warmup_s": 2}
    frame = sweep(base, {"routing": ["shared", "round_robin", "random", "jsq", "p2c",
                                     "least_work"]}, seeds=1 if quick else 3, workers=1)
    table = frame.groupby("routing", sort=False)[
        ["latency_ms.mean", "latency_ms.p99", "queue_ms.mean"]].mean().reset_index()
    show(table, "4 replicas at 80% load, gamma service CV 3")
    return table


if __name__ == "__main__":
    main(quick_from_argv())
