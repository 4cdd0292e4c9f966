"""Ray Serve's autoscaler against servelab's ``target`` autoscaler, a short version of
``benchmarks/fidelity_rayserve_autoscale.py``: a sleep-model deployment (its service time does
not depend on CPU contention) with an ``autoscaling_config`` and a controlled start-up delay,
driven by ``servelab bench`` on a short burst day; Ray's replica counts read from its
controller into the bench run directory; servelab predicts the same day.

The bounds are wider than the benchmark's targets: a short day has few control periods, and
on a loaded machine Ray's proxy and controller share the cores with everything else (the
benchmark runs with CPU priority). They still fail if servelab's rule differed from Ray's in
kind: no scale-up, a scale-up count off by more than one, or replica-seconds off by more
than the 0.25 s polling and the measured cold start's spread allow.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from executor.endpoint.autoscale_check import AutoscaleDay, errors, run_days

pytestmark = pytest.mark.slow


def test_ray_serve_autoscales_as_servelab_predicts(tmp_path: Path) -> None:
    from executor.endpoint.rayserve import ensure_ray

    day = AutoscaleDay(phases=((3.0, 4.0), (10.0, 40.0), (12.0, 4.0)))
    (row,) = run_days(ensure_ray(), day, tmp_path, runs=1)
    live, pred = row["live"], row["predicted"]
    assert live["failed"] == 0
    replicas = pd.read_csv(Path(row["run_dir"]) / "ray_replicas.csv")
    assert {"time_s", "running", "starting", "held"} <= set(replicas.columns)
    assert live["max_replicas"] >= 2 and pred["max_replicas"] >= 2  # both scaled up
    err = errors(row)
    assert abs(err["upscales"]) <= 1, (live, pred)
    # replica-seconds: the polling (0.25 s per upscale and downscale, up to 3 replicas each)
    # and the cold start's spread over the run's upscales bound how far a faithful
    # prediction can be off; 30% of this short day's replica-seconds covers both here
    starts = row["cold_start_s"]["measured"]
    spread_s = (max(starts) - min(starts)) if len(starts) > 1 else 0.0
    slack_s = 2 * 3 * 0.25 + 3 * spread_s
    assert abs(pred["replica_seconds"] - live["replica_seconds"]) <= max(
        0.3 * live["replica_seconds"], slack_s), (live, pred, starts)
