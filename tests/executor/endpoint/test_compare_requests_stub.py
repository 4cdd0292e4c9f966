"""``calibrate --endpoint`` separating the path outside the replica, and ``compare
--endpoint`` for request-level scenarios, against the local stub's batcher (a server whose
busy time and outside delay are known: ``batch:MAX:WINDOW:BASE:PER_ITEM:OUTSIDE``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
from executor.endpoint.compare_requests import compare_request_endpoint
from executor.endpoint.request_calibrate import (
    burst_bodies,
    calibrate_endpoint,
    profile_service,
)
from executor.endpoint.server_info import EndpointError
from sim.scenario.payload import PayloadCfg
from tests.executor.endpoint.conftest import REPO, env

BASE_MS, PER_ITEM_MS, OUTSIDE_MS = 20.0, 5.0, 30.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env(), cwd=REPO)


PAYLOAD = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 2]}]}


def stub_model(tag: str) -> str:
    """A batcher of at most 4 with no window (a burst of 1 or 4 is one batch either way)."""
    return f"batch:4:0:{BASE_MS:g}:{PER_ITEM_MS:g}:{OUTSIDE_MS:g}~{tag}"


def test_calibrate_separates_the_path_outside_the_replica(stub_url: str) -> None:
    prof = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1, 4], reps=6,
                              model=stub_model("cal"), window_ms=0, server_max_batch=4,
                              say=lambda line: None)
    over = prof.meta["endpoint"]["request_overhead"]
    # the outside delay is a sleep (never shorter than asked) plus the stub's HTTP path;
    # the busy time a sleep too: each at least what was asked, and the busy time no longer
    # than asked plus a loaded event loop's lateness (the outside time takes the rest)
    assert over["request_ms"] >= OUTSIDE_MS * 0.95 and over["clamped_sizes"] == []
    for n in (1, 4):
        busy_ms = prof.median_s(n) * 1e3
        asked_ms = BASE_MS + PER_ITEM_MS * n
        assert asked_ms * 0.95 <= busy_ms <= asked_ms + 0.5 * OUTSIDE_MS, (n, busy_ms)
        assert over["sizes"][str(n)]["queued_pairs"] >= 4
    # what the prediction adds is the outside time; lumped into the busy time (no
    # --server-max-batch-size) the busy time at batch 1 would be about 55 ms
    assert profile_service(prof, "p.json")["overheads"]["request_ms"] == over["request_ms"]
    lumped = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1], reps=3,
                                model=stub_model("lumped"), say=lambda line: None)
    assert lumped.median_s(1) * 1e3 >= BASE_MS + PER_ITEM_MS + OUTSIDE_MS * 0.95
    assert "overheads" not in profile_service(lumped, "p.json")


@pytest.mark.parametrize("paired", [False, True])
def test_an_outside_time_near_the_whole_latency_is_refused_or_clamped_and_said(
        stub_url: str, monkeypatch: pytest.MonkeyPatch, paired: bool) -> None:
    """An outside time (measured on full bursts) above 90% of the smallest size's latency:
    where that size has no busy time of its own the split is refused (the outside path stays
    in the busy times, request_ms 0); where it has one, each such size keeps 10% of its
    median as busy time, flagged and said; never a busy time <= 0.
    """
    from executor.endpoint import request_calibrate

    def huge(*args: object, **kwargs: object) -> dict[str, object]:
        sizes = {"1": {"busy_ms": 0.01, "outside_ms": 1e4, "queued_pairs": 3}} if paired else {}
        return {"request_ms": 1e4, "from_size": 4, "sizes": sizes,
                "not_paired": [4] if paired else [1, 4], "pairs": 3, "method": "test"}

    monkeypatch.setattr(request_calibrate, "request_overhead", huge)
    lines: list[str] = []
    prof = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1, 4], reps=3,
                              model=stub_model(f"clamp{paired}"), window_ms=0,
                              server_max_batch=4, say=lines.append)
    over = prof.meta["endpoint"]["request_overhead"]
    if paired:
        assert over["clamped_sizes"] == [1, 4]
        assert any("warning: the outside time exceeds 90%" in line for line in lines), lines
        for n in (1, 4):  # a tenth of what the bursts took (at least the stub's sleeps)
            assert 0.1 * (BASE_MS + PER_ITEM_MS * n + OUTSIDE_MS) * 0.95 <= (
                prof.median_s(n) * 1e3), n
    else:
        assert over["request_ms"] == 0.0 and over["refused"]["request_ms"] == 1e4
        assert any("not separated" in line for line in lines), lines
        assert "overheads" not in profile_service(prof, "p.json")
        for n in (1, 4):  # the whole burst latency: the stub's sleeps and its outside delay
            assert prof.median_s(n) * 1e3 >= (BASE_MS + PER_ITEM_MS * n + OUTSIDE_MS) * 0.95


def test_calibrate_separates_the_outside_path_with_a_long_window(stub_url: str) -> None:
    """A 100 ms window, longer than any batch (25 to 60 ms): bursts of 1 and 2 wait it even
    on an idle replica, so a second burst never queues behind the first; only the full
    burst of 8 pairs, and the smaller sizes take its outside time.
    """
    model = f"batch:8:100:{BASE_MS:g}:{PER_ITEM_MS:g}:{OUTSIDE_MS:g}~long"
    prof = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1, 2, 8], reps=6,
                              model=model, window_ms=100, server_max_batch=8,
                              say=lambda line: None)
    over = prof.meta["endpoint"]["request_overhead"]
    assert over["not_paired"] == [1, 2] and set(over["sizes"]) == {"8"}
    assert over["sizes"]["8"]["queued_pairs"] >= 4 and over["from_size"] == 8
    assert over["request_ms"] >= OUTSIDE_MS * 0.95 and over["clamped_sizes"] == []
    # a full burst's outside time also holds its requests' spread in reaching the batcher
    # (the batch starts with the last); a lone request's busy time reads that much short
    spread_ms = prof.meta["endpoint"]["bursts"]["8"]["send_spread_max_ms"]
    for n in (1, 2, 8):
        busy_ms = prof.median_s(n) * 1e3
        asked_ms = BASE_MS + PER_ITEM_MS * n
        assert asked_ms * 0.95 - spread_ms <= busy_ms <= asked_ms + 0.5 * OUTSIDE_MS, (
            n, busy_ms, spread_ms)


def test_compare_endpoint_writes_the_live_compare_files(stub_url: str, tmp_path: Path) -> None:
    model = stub_model("cmp")
    prof = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1, 4], reps=4,
                              model=model, window_ms=0, server_max_batch=4,
                              say=lambda line: None)
    path = prof.save(tmp_path / "stub.json")
    rate = round(0.4 / prof.median_s(1), 2)
    scenario = {"name": "stub-compare", "seed": 3, "service": {"kind": "constant", "ms": 1},
                "workload": {"kind": "poisson", "rate_rps": rate, "duration_s": 4},
                "policy": {"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 0,
                           "timer": "first"},
                "warmup_s": 0.5, "payload": {**PAYLOAD, "model": model}}
    out = tmp_path / "cmp"
    data = compare_request_endpoint(scenario, stub_url, out, api="kserve-v2", profile=path,
                                    repeats=2, sim_replications=3)
    assert json.loads((out / "compare.json").read_text())["repeats"] == 2
    assert (out / "report.html").is_file()
    for i in (1, 2):
        assert (out / f"live-{i}" / "probe.json").is_file()
        assert (out / f"live-{i}" / "probed-profile.json").is_file()
        assert (out / f"sim-{i}" / "prediction.json").is_file()
    for probe in data["probes"]:
        ratios = probe["ratio_by_size"]
        assert set(ratios) == {"1", "4"}
        # the server did not change between calibration and probe: ratios near 1 (a loaded
        # event loop makes sleeps late; the probe's four bursts per size see that too)
        assert all(0.7 < r < 1.6 for r in ratios.values()), ratios
    rows = {r["metric"]: r for r in data["rows"]}
    assert math.isnan(rows["mean_batch_size"]["live_median"])  # not visible from outside
    # throughput: the offered rate on both sides (Poisson count over 3.5 s, 4 sigma)
    assert abs(rows["throughput_rps"]["rel_error"]) <= 4 / math.sqrt(rate * 3.5)
    # the latency: the simulator models this server exactly (outside delay included), so
    # the p50 error is the measurement's own noise plus how far the server's speed moved
    # while it ran (a loaded event loop makes sleeps late), which the probes saw
    moved = max(abs(r - 1) for p in data["probes"] for r in p["ratio_by_size"].values())
    assert abs(rows["latency_ms.p50"]["rel_error"]) <= 0.15 + moved, (rows["latency_ms.p50"],
                                                                       moved)


def test_compare_endpoint_sweep_for_a_request_level_scenario(stub_url: str,
                                                              tmp_path: Path) -> None:
    """``compare SCENARIO --endpoint URL --api kserve-v2 --sweep ρ,...``: one
    ``rho-R/compare.json`` per load and ``fidelity.csv`` beside them, as the LLM sweep
    writes (the Verify page reads both); each load is the replica's utilisation the
    simulator predicts on the calibrated profile.
    """
    model = stub_model("sweep")
    prof = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1, 4], reps=4, model=model,
                              window_ms=0, server_max_batch=4, say=lambda line: None)
    path = prof.save(tmp_path / "stub.json")
    scenario = tmp_path / "sw.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "stub-sweep", "seed": 4, "service": {"kind": "constant", "ms": 1},
        "workload": {"kind": "poisson", "rate_rps": 5, "duration_s": 2.5},
        "policy": {"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 0,
                   "timer": "first"},
        "warmup_s": 0.5, "payload": {**PAYLOAD, "model": model}}))
    out = tmp_path / "sweep"
    proc = _cli("compare", str(scenario), "--endpoint", stub_url, "--api", "kserve-v2",
                "--profile", str(path), "--sweep", "0.3,0.6", "--repeats", "1", "--probe",
                "off", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "fidelity curve" in proc.stdout and "Traceback" not in proc.stderr
    frame = pd.read_csv(out / "fidelity.csv")
    assert set(frame["target_rho"]) == {0.3, 0.6}
    rate = frame.groupby("target_rho")["rate_rps"].first()
    assert rate[0.6] > rate[0.3] > 0
    for rho in (0.3, 0.6):
        data = json.loads((out / f"rho-{rho:g}" / "compare.json").read_text())
        assert data["kind"] == "request" and data["api"] == "kserve-v2"
        assert (out / f"rho-{rho:g}" / "live-1" / "requests.parquet").is_file()
        # the rate was found so that the simulator's replica, on the calibrated profile, is
        # busy rho of the time over a long run (the bisection stops within 1% of the rate)
        long_run = sim.run(yaml.safe_load(scenario.read_text()), overrides={
            "service": profile_service(prof, str(path)), "workload.rate_rps": rate[rho],
            "workload.duration_s": None, "workload.n_requests": 20_000, "warmup_s": 0})
        assert abs(long_run.summary["utilization"] - rho) <= 0.02, (rho, long_run.summary)
    assert {"throughput_rps", "latency_ms.p50"} <= set(frame["metric"])
    _verify_page_shows(out)
    bad = _cli("compare", str(scenario), "--endpoint", stub_url, "--api", "kserve-v2",
               "--profile", str(path), "--sweep", "1.2", "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr + bad.stdout
    assert "--sweep rho=1.2: must lie in (0, 1)" in " ".join((bad.stderr + bad.stdout).split())


def _verify_page_shows(sweep_dir: Path) -> None:
    """The Verify page reads the sweep: a load picker over the ``rho-R`` points, each
    point's table, and the fidelity curve."""
    testing = pytest.importorskip("streamlit.testing.v1")
    at = testing.AppTest.from_file(str(REPO / "dashboard" / "app_pages" / "verify.py"),
                                   default_timeout=120)
    at.run()
    at.text_input(key="verify-dir").set_value(str(sweep_dir)).run()
    assert not at.exception, at.exception
    assert at.selectbox(key="verify-load").options == ["rho-0.3", "rho-0.6"]
    assert {"latency_ms.p50", "throughput_rps"} <= set(at.dataframe[0].value["metric"])


def test_compare_endpoint_refuses_bad_input_in_one_line(stub_url: str, tmp_path: Path) -> None:
    scenario = {"name": "x", "seed": 1, "service": {"kind": "constant", "ms": 1},
                "workload": {"kind": "poisson", "rate_rps": 5, "duration_s": 1},
                "policy": {"kind": "none"}, "payload": {**PAYLOAD, "model": "instant"}}
    with pytest.raises(EndpointError, match="--api"):
        compare_request_endpoint(scenario, stub_url, tmp_path, api="grpc")
    with pytest.raises(EndpointError, match="--profile"):
        compare_request_endpoint(scenario, stub_url, tmp_path, api="kserve-v2")


def test_the_two_bursts_of_a_pair_send_the_same_inputs() -> None:
    """Paired bursts (the same key) carry the same inputs, each its own request ids; other
    bursts draw their own, and without keys the plan keeps one draw sequence.
    """
    payload = PayloadCfg(model="m", inputs=[{"name": "input", "datatype": "BYTES",
                                             "shape": [-1]}])
    plan = [(0.0, 2), (0.01, 2), (0.5, 2), (0.51, 2)]
    jobs, owner, bodies = burst_bodies("kserve-v2", payload, plan, 3, [0, 0, 1, 1])
    assert owner == [0, 0, 1, 1, 2, 2, 3, 3]
    data = [b["inputs"][0]["data"] for b in bodies]
    assert data[0:2] == data[2:4] and data[4:6] == data[6:8]
    assert data[0:2] != data[4:6]
    assert [b["id"] for b in bodies] == [str(j.index) for j in jobs] == [str(i) for i in
                                                                           range(8)]
    _, _, unkeyed = burst_bodies("kserve-v2", payload, plan, 3)
    assert [b["inputs"][0]["data"] for b in unkeyed][0:2] != \
        [b["inputs"][0]["data"] for b in unkeyed][2:4]

