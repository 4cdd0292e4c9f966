"""How many replicas for 1,000 req/s at P99 <= 100 ms with minilm-cpu?

Each replica serves all-MiniLM-L6-v2 on one CPU thread (builtin:minilm-cpu, ~65 req/s alone);
dynamic batching (max 8, 5 ms) in front, one shared queue. Priced at 0.05 USD per
replica-hour (one core). Run from the repository root: python -m examples.capacity_planning [--quick]
"""

from __future__ import annotations

from typing import Any

from examples._common import quick_from_argv
from sim.experiments.capacity import replicas_needed


def main(quick: bool = False) -> dict[str, Any]:
    target = 200.0 if quick else 1000.0
    scenario = {"name": "capacity", "seed": 9,
                "service": {"kind": "profile", "path": "builtin:minilm-cpu"},
                "workload": {"kind": "poisson", "rate_rps": target,
                             "duration_s": 5 if quick else 30},
                "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5},
                "warmup_s": 1, "price_per_replica_hour": 0.05}
    answer = replicas_needed(scenario, target, {"p99_ms": 100}, seeds=1 if quick else 3,
                             workers=1)
    print(f"{answer['replicas']} replicas hold P99 <= 100 ms at {target:g} req/s "
          f"(P99 {answer['latency_ms.p99']:.1f} ms, "
          f"{answer['cost_per_million_usd']:.3f} USD per million requests); tried "
          f"{answer['tried']}")
    return answer


if __name__ == "__main__":
    main(quick_from_argv())
