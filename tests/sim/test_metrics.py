"""Metrics on hand-made tables with answers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim.metrics.summary import busy_s, queue_length_stats, summarize
from sim.metrics.window import Window


def tables():
    requests = pd.DataFrame({
        "id": [0, 1, 2, 3, 4],
        "arrival_s": [0.5, 1.0, 2.0, 3.0, 4.0],
        "start_s": [0.5, 1.0, 2.5, np.nan, np.nan],
        "finish_s": [1.0, 2.0, 3.5, 3.0, 4.1],
        "batch_id": [0, 1, 2, -1, -1],
        "replica": [0, 0, 0, -1, -1],
        "status": ["ok", "ok", "ok", "rejected", "timed_out"],
    })
    batches = pd.DataFrame({"batch_id": [0, 1, 2], "replica": [0, 0, 0],
                            "start_s": [0.5, 1.0, 2.5], "finish_s": [1.0, 2.0, 3.5],
                            "size": [1, 1, 1], "items": [1, 1, 1]})
    queue = pd.DataFrame({"time_s": [0.0, 2.0, 2.5, 3.0, 4.0], "queue": [0] * 5,
                          "length": [0, 1, 0, 1, 0]})
    return requests, batches, queue


def test_summary_by_hand() -> None:
    req, bat, q = tables()
    s = summarize(req, bat, q, Window(warmup_s=0.9, horizon_s=4.9, replicas=1,
                                      max_batch_size=4, slo_s=1.2,
                                      price_per_replica_hour=3.6), "sim")
    # window [0.9, 4.9] = 4 s; arrivals in it: ids 1..4
    assert s["requests"] == 4 and s["ok"] == 2
    assert s["offered_rps"] == pytest.approx(1.0)
    # completions inside the window: ids 0 (arrived before it, finished at 1.0), 1 and 2
    assert s["completions"] == 3
    assert s["throughput_rps"] == pytest.approx(0.75)
    # of those, latencies 0.5, 1.0 and 1.5 s; SLO 1.2 s -> 2 met
    assert s["goodput_rps"] == pytest.approx(0.5)
    assert s["error_rate"] == pytest.approx(0.5)
    assert s["error_rate_by_cause"] == {"rejected": 0.25, "timed_out": 0.25, "dropped": 0.0,
                                        "failed": 0.0}
    assert s["latency_ms"]["mean"] == pytest.approx(1250)
    assert s["latency_ms"]["p50"] == pytest.approx(1250)
    assert s["queue_ms"]["max"] == pytest.approx(500)
    # busy inside [0.9, 4.9]: [0.9,1] (clipped) + [1,2] + [2.5,3.5] = 2.1 s of 4
    assert s["utilization"] == pytest.approx(2.1 / 4)
    assert s["mean_batch_size"] == 1 and s["batch_utilization"] == pytest.approx(0.25)
    # queue: 1 during [2,2.5] and [3,4] -> 1.5 / 4
    assert s["queue_len"]["mean"] == pytest.approx(0.375)
    assert s["queue_len"]["max"] == 1
    # 3.6 $/h = 0.001 $/s at 0.75 req/s -> 1/750 $ per request
    assert s["cost_per_million_usd"] == pytest.approx(1e6 / 750)
    assert s["censored"] == 0 and s["latency_ms"]["censored"] == 0


def test_no_slo_means_no_goodput() -> None:
    req, bat, q = tables()
    s = summarize(req, bat, q, Window(warmup_s=0.9, horizon_s=4.9, replicas=1,
                                      max_batch_size=4), "sim")
    assert s["goodput_rps"] is None
    assert s["throughput_rps"] == pytest.approx(0.75)


def test_backlog_at_the_horizon_is_censored_and_not_throughput() -> None:
    # window [0, 4]; the run stopped at 5 s with id 2 running and id 3 still queued;
    # id 1 finished at 4.5, after the horizon: not a completion of the window
    requests = pd.DataFrame({
        "id": [0, 1, 2, 3],
        "arrival_s": [0.0, 1.0, 2.0, 3.0],
        "start_s": [0.0, 2.0, 4.5, np.nan],
        "finish_s": [2.0, 4.5, np.nan, np.nan],
        "batch_id": [0, 1, 2, -1], "replica": [0, 0, 0, -1],
        "status": ["ok", "ok", "in_flight", "in_flight"],
    })
    batches = pd.DataFrame({"batch_id": [0, 1, 2], "replica": [0, 0, 0],
                            "start_s": [0.0, 2.0, 4.5], "finish_s": [2.0, 4.5, np.nan],
                            "size": [1, 1, 1], "items": [1, 1, 1]})
    queue = pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 2.0, 3.0, 4.5], "queue": [0] * 6,
                          "length": [0, 1, 0, 1, 2, 1]})
    s = summarize(requests, batches, queue, Window(0.0, 4.0, 1, 1, end_s=5.0), "live")
    assert s["completions"] == 1 and s["throughput_rps"] == pytest.approx(0.25)
    assert s["offered_rps"] == pytest.approx(1.0)
    assert s["censored"] == 2 and s["in_flight"] == 2
    # latencies: 2.0, 3.5 (ok), and lower bounds 5-2 = 3, 5-3 = 2 for the censored
    assert s["latency_ms"]["censored"] == 2
    assert s["latency_ms"]["mean"] == pytest.approx(1e3 * (2.0 + 3.5 + 3.0 + 2.0) / 4)
    assert s["latency_ms"]["max"] == pytest.approx(3500)
    # queue waits: 0, 1 (ok), 2.5 (started at 4.5), 2 (never started: until 5)
    assert s["queue_ms"]["mean"] == pytest.approx(1e3 * (0 + 1 + 2.5 + 2) / 4)
    # in system: id0 [0,2], id1 [1,4], id2 [2,4], id3 [3,4] inside [0,4] -> 2+3+2+1 = 8 / 4
    assert s["in_system_mean"] == pytest.approx(2.0)


def test_busy_time_counts_overlaps_once() -> None:
    bat = pd.DataFrame({"replica": [0, 0, 0], "start_s": [0.0, 0.5, 3.0],
                        "finish_s": [1.0, 2.0, np.nan]})
    assert busy_s(bat, 0, 0.0, 4.0) == pytest.approx(2.0 + 1.0)


def test_queue_length_total_over_two_queues_and_p95() -> None:
    q = pd.DataFrame({"time_s": [0, 0, 1, 2, 3], "queue": [0, 1, 0, 1, 0],
                      "length": [0, 0, 2, 1, 0]})
    stats = queue_length_stats(q, 0.0, 4.0)
    # total: 0 on [0,1), 2 on [1,2), 3 on [2,3), 1 on [3,4)
    assert stats["mean"] == pytest.approx(1.5)
    assert stats["max"] == 3 and stats["p95"] == 3


def test_empty_window_gives_nan_not_errors() -> None:
    req, bat, q = tables()
    s = summarize(req.iloc[:0], bat.iloc[:0], q, Window(0, 1, 1, 1), "sim")
    assert s["requests"] == 0 and math.isnan(s["latency_ms"]["p99"])
