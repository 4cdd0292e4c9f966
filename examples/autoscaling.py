"""For this day of traffic, which target_ongoing_requests and downscale_delay_s minimise cost
with P99 <= the SLO?

A compressed "day" (sim.experiments.day: a sinusoid from no traffic at night to twice the
mean at the peak) served by all-MiniLM-L6-v2 on CPU replicas (builtin:minilm-cpu, ~65 req/s
each) behind Ray Serve's target policy, with a 10 s cold start per new replica. A low
target or a long downscale delay keeps more replicas (cost); a high target or a short delay
lets the queue grow during a burst while new replicas load (P99). The sweep finds the
cheapest pair that still meets the SLO.
Run: python -m examples.autoscaling [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.experiments import sweep
from sim.experiments.day import DAY_CONFIGS, day_scenario

SLO_P99_MS = 500.0


def main(quick: bool = False) -> pd.DataFrame:
    base = day_scenario(DAY_CONFIGS["target (Ray Serve)"], day_s=400.0 if quick else 1200.0)
    grid = {"autoscaling.target_ongoing_requests": [1, 2, 4] if quick else [0.5, 1, 2, 3, 4],
            "autoscaling.downscale_delay_s": [5, 60] if quick else [5, 15, 30, 60, 120]}
    frame = sweep(base, grid, seeds=1, workers=1)
    if (frame["error"] != "").any():
        raise RuntimeError(frame.loc[frame["error"] != "", "error"].iloc[0])
    table = frame[[*grid, "cost_per_million_usd", "latency_ms.p99", "replicas.mean",
                   "cold_starts", "cold_start_waits"]].reset_index(drop=True)
    table["meets_slo"] = table["latency_ms.p99"] <= SLO_P99_MS
    show(table, f"target autoscaling over a day (P99 SLO {SLO_P99_MS:g} ms)")
    meeting = table[table["meets_slo"]]
    if meeting.empty:
        print("no setting meets the SLO: raise max_replicas or shorten the cold start")
    else:
        best = meeting.loc[meeting["cost_per_million_usd"].idxmin()]
        print(f"cheapest within the SLO: target_ongoing_requests "
              f"{best['autoscaling.target_ongoing_requests']:g}, downscale_delay_s "
              f"{best['autoscaling.downscale_delay_s']:g} -> "
              f"{best['cost_per_million_usd']:.2f} USD per million, P99 "
              f"{best['latency_ms.p99']:.0f} ms")
    return table


if __name__ == "__main__":
    main(quick_from_argv())
