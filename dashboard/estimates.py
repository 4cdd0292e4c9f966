"""Confidence intervals for the percentiles the dashboard shows from short runs.

The dashboard answers a knob within a second by simulating short horizons; a percentile of a
few hundred requests is an estimate, so the pages show it with a distribution-free interval
from order statistics: with ``n`` samples, the ``q`` quantile lies between the ``l``-th and
the ``u``-th smallest with probability at least ``level``, where ``l`` and ``u`` come from
the Binomial(n, q) distribution (Hahn & Meeker, *Statistical Intervals*, 2nd ed., §5.2).
It assumes independent samples; requests that queue behind each other are correlated, so
the true uncertainty is wider, and the pages say so.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom


def quantile_ci(values: np.ndarray, q: float, level: float = 0.95) -> tuple[float, float]:
    """Order-statistic interval for the ``q`` quantile of ``values``.

    Args:
        values: Samples (NaNs are ignored).
        q: Quantile in (0, 1), e.g. 0.99.
        level: Coverage, e.g. 0.95.

    Returns:
        (low, high); an end is inf (or -inf) when there are too few samples to bound it
        on that side, and both are nan without samples.

    Raises:
        ValueError: ``q`` or ``level`` outside (0, 1).
    """
    if not 0 < q < 1:
        raise ValueError(f"q: {q} is not in (0, 1)")
    if not 0 < level < 1:
        raise ValueError(f"level: {level} is not in (0, 1)")
    x = np.sort(np.asarray(values, dtype=float)[~np.isnan(values)])
    n = x.size
    if n == 0:
        return math.nan, math.nan
    alpha = (1 - level) / 2
    # P(X < l) <= alpha and P(X >= u) <= alpha for X ~ Binomial(n, q): x[l-1] <= Q <= x[u-1]
    lo_rank = int(binom.ppf(alpha, n, q))  # 1-based rank of the lower end
    hi_rank = int(binom.ppf(1 - alpha, n, q)) + 1
    low = float(x[lo_rank - 1]) if lo_rank >= 1 else -math.inf
    high = float(x[hi_rank - 1]) if hi_rank <= n else math.inf
    return low, high


def fmt_ci(low: float, high: float, digits: int = 0) -> str:
    """``95% CI 180–260`` (``≥ 180`` when the upper end is unbounded)."""
    if math.isnan(low):
        return "no samples"
    if math.isinf(high):
        return f"95% CI ≥ {low:,.{digits}f}" if math.isfinite(low) else "95% CI unbounded"
    if math.isinf(low):
        return f"95% CI ≤ {high:,.{digits}f}"
    return f"95% CI {low:,.{digits}f}–{high:,.{digits}f}"
