"""Workloads: rates and shapes against their definitions, trace loading, determinism."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from sim.scenario.workloads import (
    ClosedLoop,
    Constant,
    GammaArrivals,
    Mmpp,
    Poisson,
    Sinusoid,
    Trace,
    WorkloadError,
)
from tests.conftest import AZURE_TRACE, SHARED_DATA


def gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(np.concatenate(([0.0], times)))


def test_poisson_rate_and_exponential_gaps() -> None:
    n = 200_000
    t = Poisson(rate_rps=500, n_requests=n).schedule(np.random.default_rng(1)).arrival_s
    g = gaps(t)
    # mean gap 2 ms with standard error 2ms/sqrt(n); CV of exponential gaps is 1
    assert abs(g.mean() - 0.002) < 4 * 0.002 / math.sqrt(n)
    assert g.std() / g.mean() == pytest.approx(1.0, abs=0.01)


def test_duration_bound_and_same_seed_same_schedule() -> None:
    w = Poisson(rate_rps=100, duration_s=30)
    a = w.schedule(np.random.default_rng(7)).arrival_s
    b = w.schedule(np.random.default_rng(7)).arrival_s
    assert np.array_equal(a, b) and a.max() < 30 and np.all(np.diff(a) >= 0)
    # count ~ Poisson(3000): within 4 sd
    assert abs(a.size - 3000) < 4 * math.sqrt(3000)


def test_constant_is_evenly_spaced() -> None:
    t = Constant(rate_rps=4, duration_s=2).schedule(np.random.default_rng(0)).arrival_s
    assert t.tolist() == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_requested_cv(cv: float) -> None:
    t = GammaArrivals(rate_rps=100, cv=cv, n_requests=200_000).schedule(
        np.random.default_rng(2)).arrival_s
    g = gaps(t)
    assert g.mean() == pytest.approx(0.01, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.05)


def test_mmpp_long_run_rate_and_burstiness() -> None:
    w = Mmpp(rates_rps=[1000, 100], mean_dwell_s=[0.5, 1.5], duration_s=2000)
    t = w.schedule(np.random.default_rng(3)).arrival_s
    assert t.size / 2000 == pytest.approx(325, rel=0.05)
    counts = np.bincount((t / 0.1).astype(int))
    assert counts.var() / counts.mean() > 5  # far burstier than Poisson (dispersion 1)


def test_sinusoid_follows_its_rate_curve() -> None:
    w = Sinusoid(rate_rps=1000, amplitude=0.8, period_s=10, duration_s=200)
    t = w.schedule(np.random.default_rng(4)).arrival_s
    phase = (t % 10) / 10
    peak = np.mean((phase > 0.2) & (phase < 0.3))  # around sin = 1
    trough = np.mean((phase > 0.7) & (phase < 0.8))  # around sin = -1
    # mean of sin over a phase window [a, b] is (cos 2πa - cos 2πb) / (2π (b - a))
    mean_sin = (math.cos(0.4 * math.pi) - math.cos(0.6 * math.pi)) / (0.2 * math.pi)
    expected = (1 + 0.8 * mean_sin) / (1 - 0.8 * mean_sin)
    n_peak, n_trough = peak * t.size, trough * t.size
    se = expected * math.sqrt(1 / n_peak + 1 / n_trough)
    assert abs(peak / trough - expected) < 4 * se
    assert t.size / 200 == pytest.approx(1000, rel=0.02)


def test_azure_trace_loads_and_scales() -> None:
    path = AZURE_TRACE if AZURE_TRACE.exists() else SHARED_DATA / "azure_llm_2023_conv.csv"
    base = Trace(str(path)).schedule(np.random.default_rng(0))
    rows = len(path.read_text().splitlines()) - 1
    assert len(base) == rows > 19_000 and base.arrival_s[0] == 0.0
    assert 3400 < base.arrival_s[-1] <= 3600  # about one hour
    slow = Trace(str(path), time_scale=2).schedule(np.random.default_rng(0))
    assert np.allclose(slow.arrival_s, 2 * base.arrival_s)
    double = Trace(str(path), rate_scale=2).schedule(np.random.default_rng(0))
    assert len(double) == 2 * len(base)
    half = Trace(str(path), rate_scale=0.5).schedule(np.random.default_rng(0))
    assert abs(len(half) - len(base) / 2) < 4 * math.sqrt(len(base) * 0.25)
    sized = Trace(str(path), size_column="ContextTokens", n_requests=100).schedule(
        np.random.default_rng(0))
    assert len(sized) == 100 and sized.size.min() >= 1 and sized.size.max() > 100


def test_trace_with_numeric_seconds(tmp_path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("ts,n\n10.0,2\n10.5,1\n12.0,3\n")
    s = Trace(str(f), timestamp_column="ts", size_column="n").schedule(np.random.default_rng(0))
    assert s.arrival_s.tolist() == [0.0, 0.5, 2.0] and s.size.tolist() == [2, 1, 3]


def test_an_unsorted_trace_is_refused_with_the_row(tmp_path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("ts\n10.5\n10.0\n12.0\n")
    with pytest.raises(WorkloadError, match=r"ts.*go back in time \(data row 2: 10.0 after 10.5"):
        Trace(str(f), timestamp_column="ts")


@pytest.mark.parametrize(("make", "field"), [
    (lambda: Poisson(rate_rps=-1, duration_s=1), "rate_rps"),
    (lambda: Poisson(rate_rps=1), "duration_s"),
    (lambda: GammaArrivals(rate_rps=1, cv=0, duration_s=1), "cv"),
    (lambda: Mmpp(rates_rps=[1], mean_dwell_s=1, duration_s=1), "rates_rps"),
    (lambda: Mmpp(rates_rps=[1, 2], mean_dwell_s=[1], duration_s=1), "mean_dwell_s"),
    (lambda: Sinusoid(rate_rps=1, amplitude=2, duration_s=1), "amplitude"),
    (lambda: Trace("/nonexistent.csv"), "path"),
    (lambda: ClosedLoop(clients=0, duration_s=1), "clients"),
    (lambda: Poisson(rate_rps=1, duration_s=1, priority_mix=[0.5, 0.6]), "priority_mix"),
])
def test_bad_parameters_name_the_field(make, field) -> None:
    with pytest.raises(WorkloadError, match=field):
        make()


def test_trace_errors(tmp_path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("when,x\nyesterday-ish,1\n")
    with pytest.raises(WorkloadError, match="timestamp_column"):
        Trace(str(f))
    with pytest.raises(WorkloadError, match="cannot parse"):
        Trace(str(f), timestamp_column="when")
    with pytest.raises(WorkloadError, match="size_column"):
        Trace(str(f), timestamp_column="x", size_column="nope")


def test_a_schedule_of_one_size_keeps_no_size_column() -> None:
    # 50M requests must fit in 2 GiB: the schedule holds arrival (8 bytes) and priority (1)
    # per request while the request table copies it; one size for every request is a
    # read-only broadcast, not 8 bytes more
    n = 1_000_000
    tracemalloc.start()
    try:
        sched = Poisson(1000.0, n_requests=n, size=3).schedule(np.random.default_rng(0))
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept <= 10 * n, kept / n
    assert len(sched) == n and int(sched.size[-1]) == 3 and sched.size.shape == (n,)
    with pytest.raises(ValueError, match="read-only"):
        sched.size[0] = 2
