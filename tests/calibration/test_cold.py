"""Cold samples: measured after an idle gap, drawn by the simulator after replica idle time."""

from __future__ import annotations

import json

import numpy as np
import pytest

import sim
from calibration.measure import calibrate
from calibration.profile import LatencyProfile, ProfileError, load_profile
from sim.scenario.service import ProfileService
from tests.calibration.conftest import FakeRunner


def two_speed_profile() -> LatencyProfile:
    return LatencyProfile(samples_s={1: np.full(5, 0.010), 4: np.full(5, 0.016)},
                          cold_samples_s={1: np.full(5, 0.020), 4: np.full(5, 0.030)},
                          model={"name": "toy"}, meta={"cold": {"idle_ms": 50, "after_ms": 10}})


def test_cold_samples_round_trip_and_validate(tmp_path) -> None:
    path = two_speed_profile().save(tmp_path / "p.json")
    again = load_profile(path)
    assert again.cold_after_s == pytest.approx(0.010)
    assert np.allclose(again.cold_samples_s[4], 0.030)
    data = json.loads(path.read_text())
    data["cold_samples_s"]["8"] = [0.1]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="cold_samples_s"):
        load_profile(path)


def test_service_draws_cold_samples_after_idle_time() -> None:
    service = ProfileService(two_speed_profile(), np.random.default_rng(0))
    assert service.sample_s(1, idle_s=0.0) == pytest.approx(0.010)
    assert service.sample_s(1, idle_s=0.009) == pytest.approx(0.010)
    assert service.sample_s(1, idle_s=0.010) == pytest.approx(0.020)
    # interpolated size 2: nearest cold size (1), scaled by the warm medians 12/10
    assert service.sample_s(2, idle_s=1.0) == pytest.approx(0.020 * 0.012 / 0.010)
    warm_only = ProfileService(LatencyProfile(samples_s={1: np.full(3, 0.01)}))
    assert warm_only.sample_s(1, idle_s=5.0) == pytest.approx(0.01)


def test_engine_passes_replica_idle_time(tmp_path) -> None:
    path = two_speed_profile().save(tmp_path / "p.json")
    base = {"service": {"kind": "profile", "path": str(path)}, "policy": {"kind": "none"}}
    sparse = sim.run({**base, "workload": {"kind": "constant", "rate_rps": 10,
                                           "n_requests": 20}})
    busy = sim.run({**base, "workload": {"kind": "constant", "rate_rps": 1000,
                                         "n_requests": 20}})
    service = lambda r: (r.batches["finish_s"] - r.batches["start_s"]).round(6)  # noqa: E731
    assert (service(sparse) == 0.020).all()  # 100 ms apart: every batch starts cold
    # 1 ms apart with 10 ms batches: the queue never empties, every batch starts warm (the
    # first one after only 1 ms of idle, below the 10 ms threshold)
    assert (service(busy) == 0.010).all()


def test_calibration_measures_cold_samples() -> None:
    result = calibrate(FakeRunner(), [1, 2], reps=4, warmup=1, cold_idle_s=0.001, cold_reps=3)
    assert result.profile is not None
    assert {b: len(s) for b, s in result.profile.cold_samples_s.items()} == {1: 3, 2: 3}
    assert result.profile.meta["cold"] == {"idle_ms": 1.0, "after_ms": 10.0, "reps": 3}
