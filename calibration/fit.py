"""Fit ``latency = a + b * batch`` (in two pieces where the curve bends), with R².

Used for reports and explicit extrapolation only; the simulator samples the measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares (a, b, sse) of y = a + b x."""
    if x.size == 1:
        return float(y[0]), 0.0, 0.0
    b, a = np.polyfit(x, y, 1)
    sse = float(np.sum((y - (a + b * x)) ** 2))
    return float(a), float(b), sse


def fit_curve(batch_sizes: Sequence[float], latency_s: Sequence[float]) -> dict[str, Any]:
    """Fit medians against batch size.

    Returns:
        ``{"kind": "linear", "a_ms", "b_ms_per_item", "r2"}``, or for a bent curve
        ``{"kind": "piecewise", "breakpoint", "pieces": [{"a_ms", "b_ms_per_item",
        "from", "to"}, ...], "r2"}``. Two pieces are used when they remove more than half of
        the straight line's squared error and each piece spans at least 3 sizes.
    """
    x = np.asarray(batch_sizes, dtype=float)
    y = np.asarray(latency_s, dtype=float) * 1e3
    order = np.argsort(x)
    x, y = x[order], y[order]
    sst = float(np.sum((y - y.mean()) ** 2)) or 1e-30
    a, b, sse = _line(x, y)
    best: dict[str, Any] = {"kind": "linear", "a_ms": a, "b_ms_per_item": b,
                            "r2": 1 - sse / sst}
    best_sse = sse
    for k in range(3, x.size - 2):
        a1, b1, s1 = _line(x[:k], y[:k])
        a2, b2, s2 = _line(x[k - 1:], y[k - 1:])
        if s1 + s2 < 0.5 * sse and s1 + s2 < best_sse:
            best_sse = s1 + s2
            best = {"kind": "piecewise", "breakpoint": float(x[k - 1]),
                    "pieces": [{"a_ms": a1, "b_ms_per_item": b1, "from": float(x[0]),
                                "to": float(x[k - 1])},
                               {"a_ms": a2, "b_ms_per_item": b2, "from": float(x[k - 1]),
                                "to": float(x[-1])}],
                    "r2": 1 - best_sse / sst}
    return best

