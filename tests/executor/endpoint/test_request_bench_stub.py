"""servelab bench --api kserve-v2|http-json and calibrate --endpoint against the local stub:
the run directory, the request bodies, and a prediction checked against a server whose
behaviour the simulator models exactly (the stub's Ray-like batcher: timer from the first
request, sleep-based service), in the same run as the client's own overhead.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
from executor.endpoint.request_bench import bench_requests
from executor.endpoint.request_calibrate import calibrate_endpoint
from sim.scenario.payload import PayloadCfg
from tests.executor.endpoint.conftest import bench_cli
from tests.executor.endpoint.test_request_bad_input import write_rl_scenario


def test_kserve_run_directory(stub_url: str, tmp_path: Path) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml", n_requests=12, size=3)
    out = tmp_path / "run"
    proc = bench_cli(str(path), "--endpoint", stub_url, "--api", "kserve-v2", "--out",
                     str(out))
    assert proc.returncode == 0, proc.stderr
    for name in ("scenario.yaml", "requests.parquet", "batches.parquet", "queue.parquet",
                 "summary.json", "meta.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    requests = pd.read_parquet(out / "requests.parquet")
    assert summary["driver"] == meta["driver"] == "bench"
    assert summary["requests"] == summary["ok"] == 12 and summary["failed"] == 0
    assert summary["mean_batch_size"] is None and summary["queue_ms"]["p50"] is None
    assert pd.read_parquet(out / "batches.parquet").empty
    assert meta["server_model_metadata"]["name"] == "instant"
    assert (requests["size"] == 3).all() and (requests["finish_s"] > requests["arrival_s"]).all()
    # the client keeps the schedule (constant arrivals: 50, 100, … ms; sends on time)
    np.testing.assert_allclose(requests["scheduled_s"], (np.arange(12) + 1) / 20.0)
    assert requests["send_lag_s"].median() < 0.005


def test_http_json_template(stub_url: str, tmp_path: Path) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml", n_requests=4, size=2)
    result = bench_requests(path, stub_url, api="http-json", overrides=[
        "payload.path=/predict", "payload.body={model: 'instant', inputs: $texts, id: $id}"])
    assert result.summary["ok"] == 4
    assert result.meta["url"].endswith("/predict")


def _stub_batches(url: str, model: str) -> dict[str, list[float]]:
    """The stub batcher's batch sizes and its timers' lateness (s) per batch."""
    with urllib.request.urlopen(f"{url}/stub/batches/{model}") as resp:
        data: dict[str, list[float]] = json.loads(resp.read())
    return data


@pytest.mark.slow
def test_bench_agrees_with_simulate_on_a_batcher_the_simulator_models(stub_url: str,
                                                                      tmp_path: Path) -> None:
    # The stub's batcher: max 8, timer from the first request, 10 ms window, service
    # 4 ms + 2 ms per request (sleep); 60 requests/s keep a busy 2-core machine's HTTP path
    # far from saturation. What the simulator cannot know is this machine's HTTP and
    # event-loop overhead: the same schedule against the instant model measures it in this
    # run, and the prediction adds its mean. The stub's timers fire late on a busy event
    # loop, and it reports by how much: the prediction runs with the window and the service
    # time the stub really had.
    model = "batch:8:10:4:2~fid"
    path = write_rl_scenario(tmp_path / "s.yaml", model=model, kind="poisson", rate_rps=60,
                             n_requests=None, duration_s=8)
    instant = bench_requests(path, stub_url, api="kserve-v2", model="instant")
    measured = bench_requests(path, stub_url, api="kserve-v2")
    stub = _stub_batches(stub_url, model)
    sizes = np.asarray(stub["sizes"])
    window_late_ms = 1e3 * float(np.mean(stub["window_late_s"]))
    service_late_ms = 1e3 * float(np.mean(stub["service_late_s"]))
    predicted = sim.run(path, {"service": {"kind": "linear", "base_ms": 4 + service_late_ms,
                                           "per_item_ms": 2, "deterministic": True},
                               "policy.max_wait_ms": 10 + window_late_ms, "warmup_s": 1})

    def mean_se(result: sim.Result) -> tuple[float, float]:
        ok = result.requests[(result.requests["status"] == "ok")
                             & (result.requests["arrival_s"] >= 1)]
        lat = (ok["finish_s"] - ok["arrival_s"]).to_numpy() * 1e3
        return float(lat.mean()), float(lat.std(ddof=1) / math.sqrt(lat.size))

    overhead, se_o = mean_se(instant)
    got, se_m = mean_se(measured)
    want = predicted.summary["latency_ms"]["mean"] + overhead
    # the sampling error of both measured means (4 sigma), 1 ms for the client's wake-ups,
    # and the overlap of the two measured delays: the instant run's overhead already holds
    # part of the stub's busy-loop lateness (the same loop answers both), by an unknown share
    # of at most the smaller of the two
    late_ms = window_late_ms + service_late_ms
    tolerance = 4 * math.hypot(se_m, se_o) + 1.0 + min(overhead, late_ms)
    assert abs(got - want) <= tolerance, (got, want, tolerance, overhead, window_late_ms,
                                          service_late_ms)
    assert sizes.max() <= 8
    sim_batch = predicted.summary["mean_batch_size"]
    se_batch = float(sizes.std(ddof=1) / math.sqrt(sizes.size))
    assert abs(sizes.mean() - sim_batch) <= 4 * se_batch + 0.1 * sim_batch, (
        sizes.mean(), sim_batch, se_batch)


@pytest.mark.slow
def test_calibrate_endpoint_recovers_the_batch_curve(stub_url: str, tmp_path: Path) -> None:
    # service 4 ms + 2 ms per request, window 5 ms (subtracted below the max batch, 8)
    profile = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1, 2, 4, 8], reps=12,
                                 model="batch:8:5:4:2~cal", window_ms=5, server_max_batch=8,
                                 payload=PayloadCfg(), say=lambda line: None)
    med = {n: profile.median_s(n) * 1e3 for n in (1, 2, 4, 8)}
    # the per-request path (HTTP, event loop) is in every sample; the slope is the model's
    slope = (med[8] - med[1]) / 7
    assert 1.0 <= slope <= 3.5, med
    bursts = profile.meta["endpoint"]["bursts"]
    assert all(b["send_spread_ms"] < 5 for b in bursts.values()), bursts
    assert not any(b["probably_split"] for b in bursts.values()), bursts
    path = profile.save(tmp_path / "p.json")
    assert json.loads(path.read_text())["device"]["kind"] == "endpoint"
