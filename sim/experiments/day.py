"""Resident vs on demand over a day of traffic: the comparison behind the course lesson, the
autoscaling benchmark and the example.

A "day" is a sinusoid from no traffic (night) to twice the mean (the afternoon peak),
compressed to ``day_s`` seconds; the same arrival schedule is served by fixed fleets and by
autoscalers, and each run reports what it costs (from the replica-seconds held) and what its
tail is.
"""

from __future__ import annotations

from typing import Any

import sim

#: The fleets compared: fixed replicas, Ray Serve's target policy, Knative's KPA with scale
#: to zero (knobs in the scenario's ``autoscaling:`` names).
DAY_CONFIGS: dict[str, dict[str, Any] | int] = {
    "fixed 1": 1,
    "fixed 2": 2,
    "fixed 4": 4,
    "target (Ray Serve)": {"kind": "target", "min_replicas": 1, "max_replicas": 4,
                           "target_ongoing_requests": 2, "upscale_delay_s": 3,
                           "downscale_delay_s": 30, "look_back_period_s": 5},
    "concurrency, scale to zero (Knative)": {
        "kind": "concurrency", "min_replicas": 0, "max_replicas": 4, "target_concurrency": 2,
        "stable_window_s": 30, "panic_window_s": 3, "scale_to_zero_grace_s": 15},
}


def day_scenario(fleet: dict[str, Any] | int, *, mean_rps: float = 60.0,
                 day_s: float = 1200.0, days: float = 1.0, cold_start_s: float = 10.0,
                 profile: str = "builtin:minilm-cpu", seed: int = 1,
                 price_per_replica_hour: float = 1.0) -> dict[str, Any]:
    """The day-shaped scenario served by ``fleet`` (a replica count or an ``autoscaling``
    section; ``cold_start_s`` is used when the profile has no measured cold starts).
    """
    scenario: dict[str, Any] = {
        "name": "day", "seed": seed, "service": {"kind": "profile", "path": profile},
        "workload": {"kind": "sinusoid", "rate_rps": mean_rps, "amplitude": 1.0,
                     "period_s": day_s, "duration_s": day_s * days},
        "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5},
        "routing": "shared", "warmup_s": 0.0, "slo_ms": 500.0,
        "price_per_replica_hour": price_per_replica_hour}
    if isinstance(fleet, int):
        scenario["replicas"] = fleet
    else:
        scenario["autoscaling"] = {**fleet, "cold_start_s": cold_start_s,
                                   "control_period_s": 1.0}
    return scenario


def day_row(name: str, result: sim.Result) -> dict[str, Any]:
    """One line of the comparison."""
    s = result.summary
    return {"fleet": name, "cost_per_million_usd": s["cost_per_million_usd"],
            "p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"],
            "goodput_share": (s["goodput_rps"] / s["throughput_rps"]
                              if s["throughput_rps"] else float("nan")),
            "replicas_mean": s["replica_seconds"] / s["window_s"] if s["window_s"] else 0.0,
            "replicas_max": s.get("replicas", {}).get("max", result.scenario.fleet_size),
            "cold_starts": s["cold_starts"], "cold_start_waits": s["cold_start_waits"],
            "cold_start_tail_share": s.get("cold_start_tail_share", 0.0),
            "verdict": s["stability"]["verdict"]}


def compare_day(configs: dict[str, dict[str, Any] | int] | None = None,
                **knobs: Any) -> tuple[list[dict[str, Any]], dict[str, sim.Result]]:
    """Simulate every fleet on the same day; return the rows and the results."""
    results = {name: sim.run(day_scenario(fleet, **knobs))
               for name, fleet in (configs or DAY_CONFIGS).items()}
    return [day_row(n, r) for n, r in results.items()], results
