"""Golden outputs of the simulator: a dozen scenarios over every policy, queue discipline,
router and the autoscalers, with digests of their tables and their summaries.

``python -m tests.sim.golden`` rewrites ``tests/sim/golden.json`` from the implementation as
it is; the test (``test_golden.py``) fails on any change of the same seed's output. Rewrite
it only for a change that is meant to change results, and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

import sim

GOLDEN = Path(__file__).with_name("golden.json")
SERVICE = {"kind": "gamma", "mean_ms": 8, "cv": 0.6}
CLASSES = [{"name": "interactive", "share": 0.3, "priority": 0, "slo_ms": 40},
           {"name": "batch", "share": 0.7, "priority": 1, "slo_ms": 400}]


def _case(policy: dict[str, Any], **extra: Any) -> dict[str, Any]:
    workload = extra.pop("workload", {"kind": "poisson", "rate_rps": 200, "n_requests": 4000})
    return {"seed": 11, "service": extra.pop("service", SERVICE), "workload": workload,
            "policy": policy, **extra}


SCENARIOS: dict[str, dict[str, Any]] = {
    "none-mm1": _case({"kind": "none"}, service={"kind": "exponential", "mean_ms": 4}),
    "greedy": _case({"kind": "greedy", "max_batch_size": 8}, workload={
        "kind": "gamma", "rate_rps": 400, "cv": 3, "n_requests": 4000}),
    "fixed-timeout": _case({"kind": "fixed", "batch_size": 4, "timeout_ms": 10}),
    "dynamic-request": _case({"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 4},
                             service={"kind": "linear", "base_ms": 3, "per_item_ms": 1,
                                      "cv": 0.3}),
    "dynamic-first-preferred": _case(
        {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 4, "timer": "first",
         "preferred_batch_sizes": [2, 4]},
        service={"kind": "linear", "base_ms": 3, "per_item_ms": 1, "cv": 0.3}),
    "aimd": _case({"kind": "aimd", "slo_ms": 30, "max_batch_size": 16},
                  service={"kind": "linear", "base_ms": 3, "per_item_ms": 1, "cv": 0.3}),
    "slo-edf": _case({"kind": "slo", "max_batch_size": 8}, slo_ms=30,
                     queue={"discipline": "edf"},
                     service={"kind": "linear", "base_ms": 3, "per_item_ms": 1, "cv": 0.3}),
    "priority-classes-bound": _case({"kind": "greedy", "max_batch_size": 4},
                                    classes=CLASSES, queue={"discipline": "priority",
                                                            "max_len": 30, "timeout_ms": 80}),
    "round-robin-3": _case({"kind": "greedy", "max_batch_size": 4}, replicas=3,
                           routing="round_robin", workload={
                               "kind": "poisson", "rate_rps": 600, "n_requests": 4000}),
    "p2c-mmpp": _case({"kind": "none"}, replicas=4, routing="p2c",
                                       workload={"kind": "mmpp", "rates_rps": [800, 100],
                                                 "mean_dwell_s": 0.5, "n_requests": 4000}),
    "jsq-concurrent": _case({"kind": "greedy", "max_batch_size": 4,
                             "max_concurrent_batches": 2}, replicas=2, routing="jsq",
                            workload={"kind": "poisson", "rate_rps": 500,
                                      "n_requests": 4000}),
    "least-work": _case({"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 2},
                        replicas=3, routing="least_work",
                        workload={"kind": "poisson", "rate_rps": 700, "n_requests": 4000}),
    "random": _case({"kind": "none"}, replicas=2, routing="random",
                    workload={"kind": "poisson", "rate_rps": 300, "n_requests": 4000}),
    "closed-loop": _case({"kind": "greedy", "max_batch_size": 8}, workload={
        "kind": "closed", "clients": 12, "think_ms": 20, "n_requests": 4000}),
    "fifo-bound-timeout": _case({"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 3},
                                queue={"max_len": 25, "timeout_ms": 40},
                                workload={"kind": "gamma", "rate_rps": 1100, "cv": 2,
                                          "n_requests": 4000}),
    "slo-fifo-drops": _case({"kind": "slo", "max_batch_size": 8}, slo_ms=25,
                            service={"kind": "linear", "base_ms": 3, "per_item_ms": 1,
                                     "cv": 0.3},
                            workload={"kind": "poisson", "rate_rps": 900, "n_requests": 4000}),
    "autoscaling-target": _case(
        {"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 2}, routing="jsq",
        workload={"kind": "sinusoid", "rate_rps": 300, "amplitude": 0.9, "period_s": 10,
                  "duration_s": 20},
        autoscaling={"kind": "target", "min_replicas": 1, "max_replicas": 4,
                     "target_ongoing_requests": 2, "upscale_delay_s": 0.5,
                     "downscale_delay_s": 2, "look_back_period_s": 1, "cold_start_s": 0.4,
                     "control_period_s": 0.2}),
    "autoscaling-scale-to-zero": _case(
        {"kind": "greedy", "max_batch_size": 4},
        workload={"kind": "sinusoid", "rate_rps": 150, "amplitude": 1.0, "period_s": 10,
                  "duration_s": 20},
        autoscaling={"kind": "concurrency", "min_replicas": 0, "max_replicas": 3,
                     "target_concurrency": 2, "stable_window_s": 2, "panic_window_s": 0.5,
                     "scale_to_zero_grace_s": 1, "cold_start_s": 0.3,
                     "control_period_s": 0.2}),
}


def digest(frame: pd.DataFrame) -> str:
    """A digest of a table's values (floats to 12 significant digits)."""
    text = frame.to_csv(index=False, float_format="%.12g")
    return hashlib.sha256(text.encode()).hexdigest()


def flat(summary: Any, prefix: str = "") -> dict[str, Any]:
    """Numeric and text leaves of a summary by dotted key (floats to 12 digits)."""
    out: dict[str, Any] = {}
    if isinstance(summary, dict):
        for key, value in summary.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    if isinstance(summary, list):
        for i, value in enumerate(summary):
            out.update(flat(value, f"{prefix}{i}."))
        return out
    key = prefix[:-1]
    if isinstance(summary, float):
        out[key] = None if not math.isfinite(summary) else float(f"{summary:.12g}")
    elif isinstance(summary, bool | int | str) or summary is None:
        out[key] = summary
    return out


def outputs(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the golden file holds for one scenario."""
    result = sim.run(cfg)
    summary = {k: v for k, v in result.summary.items() if k != "driver"}
    out = {"requests": digest(result.requests), "batches": digest(result.batches),
           "queue": digest(result.queue), "summary": flat(summary)}
    if result.replicas is not None:
        out["replicas"] = digest(result.replicas)
    return out


def main() -> None:
    data = {name: outputs(cfg) for name, cfg in SCENARIOS.items()}
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(data)} scenarios)")


if __name__ == "__main__":
    main()
