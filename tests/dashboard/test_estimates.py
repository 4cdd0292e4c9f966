"""The order-statistic intervals the LLM page shows under its percentiles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dashboard.estimates import fmt_ci, quantile_ci


@pytest.mark.parametrize(("n", "q"), [(300, 0.5), (300, 0.99), (1000, 0.9), (60, 0.5)])
def test_coverage_is_at_least_the_level(n: int, q: float) -> None:
    """Over 2,000 seeded exponential samples the interval holds the true quantile at least
    95% of the time, less three binomial standard errors of the estimate (0.015).
    """
    rng = np.random.default_rng(31)
    truth = -math.log(1 - q)  # the exponential's q quantile
    trials = 2000
    hits = 0
    for _ in range(trials):
        low, high = quantile_ci(rng.exponential(size=n), q)
        hits += low <= truth <= high
    assert hits / trials >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / trials)


def test_too_few_samples_leave_an_end_open() -> None:
    low, high = quantile_ci(np.arange(1.0, 101.0), 0.99)  # 100 samples cannot bound P99 above
    assert math.isinf(high) and low < 100
    assert fmt_ci(low, high).startswith("95% CI ≥")
    assert all(math.isnan(v) for v in quantile_ci(np.array([]), 0.5))
    assert fmt_ci(2.0, 5.5, 1) == "95% CI 2.0–5.5"
    with pytest.raises(ValueError, match=r"q: 1\.5"):
        quantile_ci(np.ones(3), 1.5)
