"""The same mean rate at burstiness CV 1, 2 and 4: queue length, P99 and rejections.

Gamma inter-arrival gaps keep the mean rate and raise the variance; a bounded queue turns
bursts into rejections instead of unbounded waits. Run from the repository root: python -m examples.burstiness [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.drivers.simulate import run


def main(quick: bool = False) -> pd.DataFrame:
    rows = []
    duration = 5 if quick else 60
    for cv in [1, 2, 4]:
        for max_len in [None, 32]:
            s = run({"seed": 4, "service": {"kind": "profile", "path": "builtin:mlp-cpu"},
                     "workload": {"kind": "gamma", "rate_rps": 2000, "cv": cv,
                                  "duration_s": duration},
                     "policy": {"kind": "dynamic", "max_batch_size": 16, "max_wait_ms": 1},
                     "queue": {"max_len": max_len}, "warmup_s": 1}).summary
            rows.append({"cv": cv, "queue_bound": max_len or "none",
                         "queue_len_mean": s["queue_len"]["mean"],
                         "queue_len_max": s["queue_len"]["max"], "p99_ms": s["latency_ms"]["p99"],
                         "rejected_frac": s["error_rate_by_cause"]["rejected"]})
    frame = pd.DataFrame(rows)
    show(frame, "2,000 req/s with growing burstiness", digits=3)
    return frame


if __name__ == "__main__":
    main(quick_from_argv())
