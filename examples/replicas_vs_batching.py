"""One replica with batching against N replicas without: latency and cost per million.

Priced at 1.20 USD per replica-hour (set your own). Batching buys throughput from the same
device; replicas buy it with more devices. Run from the repository root: python -m examples.replicas_vs_batching [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.drivers.simulate import run


def main(quick: bool = False) -> pd.DataFrame:
    duration = 3 if quick else 30
    setups = {"1 replica, dynamic batching (max 32, 2 ms)":
              (1, {"kind": "dynamic", "max_batch_size": 32, "max_wait_ms": 2})}
    for n in ([2, 3] if quick else [2, 3, 4, 6]):
        setups[f"{n} replicas, no batching"] = (n, {"kind": "none"})
    rows = []
    for label, (replicas, policy) in setups.items():
        s = run({"seed": 5, "service": {"kind": "profile", "path": "builtin:mlp-cpu"},
                 "workload": {"kind": "poisson", "rate_rps": 2500, "duration_s": duration},
                 "policy": policy, "replicas": replicas, "warmup_s": 1,
                 "price_per_replica_hour": 1.2}).summary
        rows.append({"setup": label, "throughput_rps": s["throughput_rps"],
                     "p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"],
                     "utilization": s["utilization"],
                     "usd_per_million": s["cost_per_million_usd"]})
    frame = pd.DataFrame(rows)
    show(frame, "2,500 req/s on builtin:mlp-cpu")
    return frame


if __name__ == "__main__":
    main(quick_from_argv())
