"""``calibrate --endpoint`` separating the path outside the replica, and ``compare
--endpoint`` for request-level scenarios, against the local stub's batcher (a server whose
busy time and outside delay are known: ``batch:MAX:WINDOW:BASE:PER_ITEM:OUTSIDE``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

import sim
from executor.compare import rate_for_utilization
from executor.endpoint.compare_requests import PROBE_BURSTS, compare_request_endpoint
from executor.endpoint.request_calibrate import (
    burst_bodies,
    calibrate_endpoint,
    profile_service,
)
from executor.endpoint.server_info import EndpointError
from sim.scenario.payload import PayloadCfg
from tests.executor.endpoint.conftest import REPO, env, stub_batch_record

BASE_MS, PER_ITEM_MS, OUTSIDE_MS = 20.0, 5.0, 30.0
# the chance that a test's statistical checks fail one run of a calibration (or probe) that
# read the stub right: a false failure in 1 of 100 runs of each test (Bonferroni over its
# checks, Student's t at each sample's degrees of freedom)
FALSE_ALARM = 0.01
# how early asyncio may fire a timer: it runs every handle due within the clock's resolution
# (``BaseEventLoop._run_once``), so a sleep ends no earlier than asked less that
CLOCK_MS = time.get_clock_info("monotonic").resolution * 1e3
# the sweep's bisection stops when its bracket of rates is narrower than this (relative)
RATE_TOL = inspect.signature(rate_for_utilization).parameters["tol"].default


def se_median_ms(samples_ms: list[float] | np.ndarray) -> float:
    """The standard error of the samples' median (normal theory: 1.2533 × the standard
    deviation over √n; the deviation, not the MAD: a late timer's outlier widens it)."""
    v = np.asarray(samples_ms, dtype=float)
    return float(1.2533 * v.std(ddof=1) / math.sqrt(v.size))


def t_quantile(alpha: float, samples: int) -> float:
    """Student's t for a one-sided false alarm ``alpha`` at ``samples - 1`` degrees of
    freedom."""
    return float(stats.t.ppf(1 - alpha, samples - 1))


def stub_batches(stub_url: str, model: str) -> tuple[list[int], float]:
    """The stub's record of ``model``'s batches: their sizes, and the latest any of their
    timers fired (window or service), in ms: its event loop's worst lateness in this test."""
    record = stub_batch_record(stub_url, model)
    late_s = [*record["window_late_s"], *record["service_late_s"]]
    return record["sizes"], max(late_s, default=0.0) * 1e3


def request_lateness_ms(stub_url: str, model: str) -> np.ndarray:
    """Per request ``model`` answered (in the order answered), how late the stub's timers
    fired for it, in ms: its outside sleep's lateness plus its batch's window and service
    lateness, all recorded by the stub. On an idle batcher a request's latency is its sleeps
    as asked, its paths, and the largest of these over its batch (a batch with no window
    starts once its last member's outside sleep ended)."""
    record = stub_batch_record(stub_url, model)
    batch = np.asarray(record["request_batch"], dtype=int)
    per_batch_s = np.asarray(record["window_late_s"]) + np.asarray(record["service_late_s"])
    return (np.asarray(record["outside_late_s"]) + per_batch_s[batch]) * 1e3


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
    assert over["clamped_sizes"] == [] and over["from_size"] == 1
    _, late_ms = stub_batches(stub_url, stub_model("cal"))
    # one-sided checks: the outside time's floor, each size's busy floor and ceiling
    checks = 1 + 2 * 2
    check_paired_split(over, "1", late_ms, FALSE_ALARM / checks)
    for n in (1, 4):
        assert over["sizes"][str(n)]["queued_pairs"] >= 4
        # each size's samples were shifted to its paired busy time (a shift by a constant
        # moves the median by exactly that)
        assert prof.median_s(n) * 1e3 == pytest.approx(over["sizes"][str(n)]["busy_ms"],
                                                      rel=1e-9)
        check_paired_busy(over, n, late_ms, FALSE_ALARM / checks)
    # what the prediction adds is the outside time; lumped into the busy time (no
    # --server-max-batch-size) the busy time at batch 1 would be about 55 ms
    assert profile_service(prof, "p.json")["overheads"]["request_ms"] == over["request_ms"]
    lumped = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1], reps=3,
                                model=stub_model("lumped"), say=lambda line: None)
    # each sample is a lone request's whole latency: its two sleeps (outside, then its batch
    # of one) back to back, each no shorter than asked less the clock's resolution; a
    # calibration that separated the outside time anyway is 30 ms short
    assert min(lumped.samples_s[1]) * 1e3 >= BASE_MS + PER_ITEM_MS + OUTSIDE_MS - 2 * CLOCK_MS
    assert "overheads" not in profile_service(lumped, "p.json")


def check_paired_split(over: dict[str, Any], size: str, late_ms: float, alpha: float) -> None:
    """The outside time read off paired bursts of ``size`` (:func:`request_overhead`):
    each pair's sample is the first burst's mean latency less the gap between the two
    bursts' finishes. The first burst's latency holds the outside sleep (never early), the
    HTTP path both ways and its batch's service and lateness; the gap is the second batch's
    service and lateness plus the difference of the two bursts' return paths. So each sample
    is the outside sleep plus paths and the first batch's lateness (all >= 0), less the second
    batch's lateness (at most ``late_ms``, the stub's worst timer) and the return paths'
    difference (as often either way: both bursts' answers leave an idle batcher). The median
    then lies above OUTSIDE less that lateness, less Student's t for ``alpha`` times the
    median's standard error from the pairs' own spread (which holds the lateness spread too).
    A split that subtracted a batch too many, or the window from a full burst, is 25-100 ms
    short; a refused split reads 0.
    """
    outside = over["sizes"][size]["outside_samples_ms"]
    assert over["request_ms"] == pytest.approx(max(float(np.median(outside)), 0.0), rel=1e-9)
    floor_ms = OUTSIDE_MS - late_ms - t_quantile(alpha, len(outside)) * se_median_ms(outside)
    assert over["request_ms"] >= floor_ms, (outside, late_ms, floor_ms)


def check_paired_busy(over: dict[str, Any], n: int, late_ms: float, alpha: float) -> None:
    """The busy time of paired bursts of ``n``: each pair's gap between finishes is the
    second batch's sleep (never early) plus its lateness (at most ``late_ms``) plus the two
    bursts' return paths' difference (as often either way); the median of the gaps lies
    within that sleep and that sleep plus the lateness, give or take Student's t for
    ``alpha`` (each side) times the median's standard error from the pairs' spread. A busy
    time that kept the outside path (30 ms more) or a batch's worth too few is caught
    wherever the stub's loop was less late than that.
    """
    row = over["sizes"][str(n)]
    busy = row["busy_samples_ms"]
    assert len(busy) == row["queued_pairs"]
    assert row["busy_ms"] == pytest.approx(float(np.median(busy)), rel=1e-9)
    asked_ms = BASE_MS + PER_ITEM_MS * n
    err_ms = t_quantile(alpha, len(busy)) * se_median_ms(busy)
    assert asked_ms - err_ms - CLOCK_MS <= row["busy_ms"] <= asked_ms + late_ms + err_ms, (
        n, busy, late_ms, err_ms)


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
    bursts = prof.meta["endpoint"]["bursts"]
    # each burst's sample is its requests' mean latency: each request's outside sleep and its
    # batch's sleep back to back (each no earlier than asked less the clock's resolution).
    # The stub's record says whether every burst ran as one batch (the preflight's request,
    # one warm-up and 3 timed bursts per size): then a burst of n took n's sleep; a burst
    # split on an idle batcher (no window) still took at least a batch of one's
    sizes, _ = stub_batches(stub_url, stub_model(f"clamp{paired}"))
    whole = Counter(sizes) == Counter({1: 1 + 1 + 3, 4: 1 + 3})
    for n in (1, 4):
        sleeps_ms = OUTSIDE_MS + BASE_MS + PER_ITEM_MS * (n if whole else 1) - 2 * CLOCK_MS
        assert bursts[str(n)]["median_ms"] >= sleeps_ms, (n, bursts[str(n)], sizes)
    if paired:
        assert over["clamped_sizes"] == [1, 4]
        assert any("warning: the outside time exceeds 90%" in line for line in lines), lines
        for n in (1, 4):  # exactly a tenth of what the bursts took (the shift is a constant)
            assert prof.median_s(n) * 1e3 == pytest.approx(0.1 * bursts[str(n)]["median_ms"],
                                                          rel=1e-9), n
    else:
        assert over["request_ms"] == 0.0 and over["refused"]["request_ms"] == 1e4
        assert any("not separated" in line for line in lines), lines
        assert "overheads" not in profile_service(prof, "p.json")
        for n in (1, 4):  # the whole burst latency, unshifted
            assert prof.median_s(n) * 1e3 == pytest.approx(bursts[str(n)]["median_ms"],
                                                          rel=1e-9), n


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
    assert over["clamped_sizes"] == []
    _, late_ms = stub_batches(stub_url, model)
    # one-sided checks: the outside floor, size 8's busy floor and ceiling, sizes 1 and 2's
    checks = 1 + 2 + 2 * 2
    check_paired_split(over, "8", late_ms, FALSE_ALARM / checks)
    check_paired_busy(over, 8, late_ms, FALSE_ALARM / checks)
    # sizes 1 and 2 (not paired): their median (less the window) less the full burst's
    # outside time. Their median holds the outside sleep, the paths, the window's and the
    # batch's lateness (each at most late_ms) and their batch's sleep; the full burst's
    # outside time holds the outside sleep, the paths, its requests' spread in reaching the
    # batcher (the batch starts with the last: at most the send spread), its first batch's
    # lateness less its second's. So the busy time reads at most the spread and one lateness
    # short and at most three latenesses long, give or take Student's t times the two
    # medians' standard errors (the sizes' samples, shifted by a constant, and the pairs').
    # A busy time that kept the outside path (30 ms more) or took the window out twice is
    # caught wherever the stub's loop was less late than that
    spread_ms = prof.meta["endpoint"]["bursts"]["8"]["send_spread_max_ms"]
    outside = over["sizes"]["8"]["outside_samples_ms"]
    for n in (1, 2):
        samples_ms = np.asarray(prof.samples_s[n]) * 1e3
        busy_ms = prof.median_s(n) * 1e3
        asked_ms = BASE_MS + PER_ITEM_MS * n
        err_ms = t_quantile(FALSE_ALARM / checks, min(samples_ms.size, len(outside))) * (
            math.hypot(se_median_ms(samples_ms), se_median_ms(outside)))
        assert (asked_ms - spread_ms - late_ms - err_ms - 2 * CLOCK_MS <= busy_ms
                <= asked_ms + 3 * late_ms + err_ms), (n, busy_ms, spread_ms, late_ms, err_ms)


def test_compare_endpoint_writes_the_live_compare_files(stub_url: str, tmp_path: Path) -> None:
    model = stub_model("cmp")
    prof = calibrate_endpoint(stub_url, api="kserve-v2", sizes=[1, 4], reps=4,
                              model=model, window_ms=0, server_max_batch=4,
                              say=lambda line: None)
    path = prof.save(tmp_path / "stub.json")
    cal_requests = request_lateness_ms(stub_url, model).size  # the calibration's, all answered
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
    # The server did not change between calibration and probe: each probe's median burst
    # latency per size (PROBE_BURSTS bursts) and the calibration's (reps bursts, its
    # meta.bursts median_ms) measure the same sleeps and paths; they differ by how late the
    # stub's timers made each burst's requests and by the two medians' sampling error (the
    # spread of the calibration's bursts, shifted by a constant in its samples, standing in
    # for the probe's: the same distribution while the server is unchanged). The stub
    # records each request's lateness (its outside sleep's, its batch's window and service):
    # a burst's mean latency is its lateness-free value plus at most the largest of its
    # requests', so a median of bursts lies between the lateness-free median and that plus
    # the largest lateness of its phase (the calibration's requests; the compare's, probes
    # and live runs, after them in the stub's record). So the probe reads at most the
    # compare's largest lateness above the calibration and at most the calibration's below,
    # one side each. A ratio is the geometric mean of the two probes' measured (so between
    # them) over the profile's median plus the overhead; that prediction and the
    # calibration's median differ by what the split made of it (known: read off the
    # profile). Student's t at reps - 1 degrees of freedom, two sided, Bonferroni over both
    # probes of both sizes of both repeats. A probe that left the overhead out (ratio about
    # 2.2 at size 1: 65 ms high), took a window off a burst that did not wait it, or
    # compared a size with another's (1.3 or 0.77: 15-20 ms off) is caught wherever the
    # recorded lateness on that side is below that
    lateness_ms = request_lateness_ms(stub_url, model)
    cal_late_ms = float(lateness_ms[:cal_requests].max())
    cmp_late_ms = float(lateness_ms[cal_requests:].max())
    over_ms = prof.meta["endpoint"]["request_overhead"]["request_ms"]
    for probe in data["probes"]:
        ratios = probe["ratio_by_size"]
        assert set(ratios) == {"1", "4"}
        for n in (1, 4):
            cal_ms = prof.meta["endpoint"]["bursts"][str(n)]["median_ms"]
            predicted_ms = prof.median_s(n) * 1e3 + over_ms
            cal = np.asarray(prof.samples_s[n]) * 1e3
            t_probe = t_quantile(FALSE_ALARM / (2 * 2 * 2 * 2), cal.size)
            se_ms = 1.2533 * float(np.std(cal, ddof=1)) * math.sqrt(1 / PROBE_BURSTS
                                                                    + 1 / cal.size)
            probed_ms = ratios[str(n)] * predicted_ms
            assert (cal_ms - cal_late_ms - t_probe * se_ms <= probed_ms
                    <= cal_ms + cmp_late_ms + t_probe * se_ms), (
                n, probed_ms, cal_ms, cal_late_ms, cmp_late_ms, se_ms)
    rows = {r["metric"]: r for r in data["rows"]}
    assert math.isnan(rows["mean_batch_size"]["live_median"])  # not visible from outside
    # throughput: completions inside the window over its length, on one seeded schedule on
    # both sides, so no sampling error: every ok request that arrived (as scheduled) at
    # least its latency before the window's end and not before its start finishes inside
    # it, on either side; only those arriving within the longest latency before either
    # edge can land on one side of it in one run and on the other in another
    # (edge_count_bounds: each run's count, live and simulated, between the two counts).
    # A bench on another schedule (another seed: about sqrt(56) = 7 requests more or
    # fewer), one that dropped or failed requests, or a window of the wrong length is
    # caught wherever it moves a count past the few edge arrivals
    lo_n, hi_n, window_s = edge_count_bounds(out, data["drain_timeout_s"], sim_replications=3)
    low_rel, high_rel = lo_n / hi_n - 1, hi_n / lo_n - 1  # sim / live - 1, both in [lo, hi]
    assert low_rel * (1 + 1e-9) <= rows["throughput_rps"]["rel_error"] <= high_rel * (
        1 + 1e-9), (rows["throughput_rps"], lo_n, hi_n, window_s)
    # the latency: the simulator models this server exactly (outside delay included), so
    # the p50 error is the measurement's own noise plus how far the server's speed moved
    # while it ran (a loaded event loop makes sleeps late), which the probes saw
    moved = max(abs(r - 1) for p in data["probes"] for r in p["ratio_by_size"].values())
    assert abs(rows["latency_ms.p50"]["rel_error"]) <= 0.15 + moved, (rows["latency_ms.p50"],
                                                                       moved)


def edge_count_bounds(out: Path, drain_s: float, sim_replications: int
                      ) -> tuple[int, int, float]:
    """The fewest and the most completions any run of ``compare_request_endpoint``'s
    directory ``out`` may count in its window, from the seeded schedule and the longest
    latency any of them measured (each live repeat's, each simulated replication's,
    rerun with its own seed as ``executor.compare.predict`` ran it), asserting each run's
    count between them; and the window's length (s), one for all runs.

    A request counts when it finishes ok inside [warmup, horizon]. Arriving at ``a`` with
    a latency (from its scheduled time) of at most ``L``, it finishes in [a, a + L]: inside
    for ``warmup <= a <= horizon - L``, outside for ``a < warmup - L`` or ``a > horizon``.
    """
    counts: list[int] = []
    longest_s = 0.0
    windows_s: set[float] = set()
    schedule_s = None
    for live_dir in sorted(out.glob("live-*")):
        req = pd.read_parquet(live_dir / "requests.parquet").sort_values("id")
        summary = json.loads((live_dir / "summary.json").read_text())
        # the stub answers every request: a failed or unanswered one would leave a count
        # below the schedule's without an edge to blame
        assert (req["status"].astype(str) == "ok").all(), req["status"].value_counts()
        scheduled = req["scheduled_s"].to_numpy(float)
        schedule_s = scheduled if schedule_s is None else schedule_s
        np.testing.assert_array_equal(scheduled, schedule_s)  # one schedule for all
        longest_s = max(longest_s, float((req["finish_s"] - req["scheduled_s"]).max()))
        counts.append(int(summary["completions"]))
        windows_s.add(float(summary["window_s"]))
    assert schedule_s is not None
    for sim_dir in sorted(out.glob("sim-*")):
        i = int(sim_dir.name.split("-")[1])
        seeds = [None, *(i * 10_000 + j for j in range(1, sim_replications))]
        for seed in seeds:
            run = sim.run(sim_dir / "scenario.yaml", service_seed=seed,
                          drain_timeout_s=drain_s)
            req = run.requests.sort_values("id")
            assert (req["status"].astype(str) == "ok").all()
            np.testing.assert_array_equal(req["arrival_s"].to_numpy(float), schedule_s)
            longest_s = max(longest_s, float((req["finish_s"] - req["arrival_s"]).max()))
            counts.append(int(run.summary["completions"]))
            windows_s.add(float(run.summary["window_s"]))
    assert len(windows_s) == 1, windows_s
    window_s = windows_s.pop()
    lo_s = float(yaml.safe_load((out / "sim" / "scenario.yaml").read_text())["warmup_s"])
    hi_s = lo_s + window_s
    inner = int(np.sum((schedule_s >= lo_s) & (schedule_s <= hi_s - longest_s)))
    outer = int(np.sum((schedule_s >= lo_s - longest_s) & (schedule_s <= hi_s)))
    assert all(inner <= n <= outer for n in counts), (counts, inner, outer, longest_s)
    return inner, outer, window_s


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
        # busy rho of the time over a long run: the bisection (rate_for_utilization, one
        # seeded schedule of 20 000 requests, so each run is deterministic) stops with rho
        # crossed between two rates less than TOL apart and returns their geometric mean, so
        # the same runs at the rate TOL's square root either side straddle rho (the
        # utilisation rises with the rate, as the bisection assumes). A rate found on another
        # profile (say the overhead taken into the busy time: 55 ms against 25 at batch 1)
        # or for another rho lies outside that bracket
        half = math.sqrt(1 + RATE_TOL)
        util = {side: sim.run(yaml.safe_load(scenario.read_text()), overrides={
            "service": profile_service(prof, str(path)), "workload.rate_rps": rate[rho] * f,
            "workload.duration_s": None, "workload.n_requests": 20_000, "warmup_s": 0}
        ).summary["utilization"] for side, f in (("low", 1 / half), ("high", half))}
        assert util["low"] < rho <= util["high"], (rho, rate[rho], util)
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



def test_the_stub_records_each_requests_outside_lateness_and_batch() -> None:
    """The batch stub's per-request record (``outside_late_s``, ``request_batch``), read in
    process: a callback queued right behind the request (``call_soon``: it runs after the
    handler took its clock and started the 30 ms outside sleep, and before any timer of
    that pass) blocks the loop 60 ms, so the sleep ends no earlier than the block's end:
    its lateness is at least the block's measured length less the sleep, and at most the
    whole call's less the sleep (both exact, one clock). A record that missed the lateness
    (0) or kept it in ms reads 30 ms under, or about 1000 times over; a request filed under
    another batch's index breaks the indices [0, 1] (two lone requests, one after another).
    """
    from aiohttp import web

    from executor.endpoint.stub_v2 import StubV2

    model = "batch:1:0:1:0:30~rec"

    async def two_requests() -> tuple[StubV2, float, float]:
        stub = StubV2()
        marks: list[float] = []

        def block() -> None:
            marks.append(time.perf_counter())
            time.sleep(0.06)
            marks.append(time.perf_counter())

        start_s = time.perf_counter()
        task = asyncio.ensure_future(stub._behave(cast(web.Request, None), model, 1, True))
        asyncio.get_running_loop().call_soon(block)
        await task
        whole_s = time.perf_counter() - start_s
        await stub._behave(cast(web.Request, None), model, 1, True)
        return stub, marks[1] - marks[0], whole_s

    stub, block_s, whole_s = asyncio.run(two_requests())
    late_s = stub.outside_late_s[model]
    assert block_s - 0.03 <= late_s[0] <= whole_s - 0.03, (late_s, block_s, whole_s)
    assert len(late_s) == 2 and late_s[1] >= 0
    assert stub.request_batch[model] == [0, 1]
    assert stub.batchers[model].sizes == [1, 1]
