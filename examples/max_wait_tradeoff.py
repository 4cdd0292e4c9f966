"""The max_wait knob under light and heavy load, and the sequential-client trap.

Under heavy load a short wait fills batches and pays; under light load it only adds latency.
With a single sequential client (closed loop, one request in flight) a batch can never fill,
so every request waits the full max_wait. Run from the repository root: python -m examples.max_wait_tradeoff [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.drivers.simulate import run

SERVICE = {"kind": "profile", "path": "builtin:mlp-cpu"}


def main(quick: bool = False) -> pd.DataFrame:
    waits = [0, 2, 10] if quick else [0, 1, 2, 5, 10, 20]
    duration = 3 if quick else 20
    loads = {"light (200 req/s)": {"kind": "poisson", "rate_rps": 200, "duration_s": duration},
             "heavy (3,000 req/s)": {"kind": "poisson", "rate_rps": 3000, "duration_s": duration},
             "1 sequential client": {"kind": "closed", "clients": 1, "think_ms": 5,
                                     "duration_s": duration}}
    rows = []
    for load, workload in loads.items():
        for wait in waits:
            s = run({"seed": 2, "service": SERVICE, "workload": workload, "warmup_s": 1,
                     "policy": {"kind": "dynamic", "max_batch_size": 16,
                                "max_wait_ms": wait}}).summary
            rows.append({"load": load, "max_wait_ms": wait, "throughput_rps": s["throughput_rps"],
                         "p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"],
                         "mean_batch": s["mean_batch_size"]})
    frame = pd.DataFrame(rows)
    show(frame, "dynamic batching: max_wait under three loads")
    return frame


if __name__ == "__main__":
    main(quick_from_argv())
