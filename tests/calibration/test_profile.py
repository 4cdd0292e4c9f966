"""LatencyProfile: round trip, interpolation, sampling and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.profile import (
    LatencyProfile,
    ProfileError,
    builtin_profiles,
    load_profile,
    profile_summary,
)


def make() -> LatencyProfile:
    return LatencyProfile(samples_s={1: np.array([0.010, 0.011, 0.012]),
                                     4: np.array([0.020, 0.022, 0.024])},
                          model={"name": "toy"}, device={"kind": "cpu"})


def test_round_trip(tmp_path) -> None:
    p = make()
    path = p.save(tmp_path / "p.json")
    q = load_profile(path)
    assert q.batch_sizes == [1, 4]
    assert np.array_equal(q.samples_s[4], p.samples_s[4])
    assert q.model == {"name": "toy"} and q.device == {"kind": "cpu"}


def test_interpolation_and_scaled_bootstrap() -> None:
    p = make()
    assert p.median_s(1) == pytest.approx(0.011)
    assert p.median_s(2) == pytest.approx(0.011 + (0.022 - 0.011) / 3)
    # size 2 bootstraps from size 1 (nearest), scaled by the median ratio
    scale = p.median_s(2) / 0.011
    rng = np.random.default_rng(0)
    draws = {round(p.sample_s(2, rng) / scale, 9) for _ in range(200)}
    assert draws == {0.010, 0.011, 0.012}


def test_outside_range_is_an_error_unless_extrapolating() -> None:
    with pytest.raises(ProfileError, match="outside the measured range"):
        make().median_s(8)
    ext = LatencyProfile(samples_s=make().samples_s, extrapolate=True)
    # straight line through (1, 11 ms) and (4, 22 ms)
    assert ext.median_s(7) == pytest.approx(0.022 + 3 * 0.011 / 3)


def test_builtin_profiles_load() -> None:
    assert "synthetic-demo" in builtin_profiles()
    p = load_profile("builtin:synthetic-demo")
    assert p.meta["synthetic"] is True and p.max_batch_size == 64
    rows = profile_summary(p)
    assert rows[0]["batch_size"] == 1 and rows[0]["p5_ms"] <= rows[0]["median_ms"]


@pytest.mark.parametrize(("data", "text"), [
    ({"schema_version": 2, "samples_s": {"1": [0.1]}}, "schema_version"),
    ({"schema_version": 1}, "samples_s"),
    ({"schema_version": 1, "samples_s": {"x": [0.1]}}, "not a batch size"),
    ({"schema_version": 1, "samples_s": {"1": []}}, "non-empty"),
    ({"schema_version": 1, "samples_s": {"1": [-0.1]}}, "> 0"),
    ({"schema_version": 1, "samples_s": {"1": ["a"]}}, "list of numbers"),
    ({"schema_version": 1, "batch_sizes": [1, 2], "samples_s": {"1": [0.1]}}, "batch_sizes"),
    ([1, 2], "JSON object"),
])
def test_corrupt_profiles_name_the_problem(tmp_path, data, text) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=text):
        load_profile(path)


def test_not_json(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{nope")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(path)
