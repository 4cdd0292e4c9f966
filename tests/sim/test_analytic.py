"""The simulator against textbook queueing results (M/M/1, M/D/1, M/M/c).

Each check runs independent replications (different seeds), takes the mean of the
per-replication estimates and asserts it lies within 4 standard errors of the formula
(a false alarm about once in 16,000 runs). The standard error must also be small against the
value, so the test can fail on a real error of a few percent.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import sim

MEAN_SERVICE_MS = 1.0


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in M/M/c (offered load a = lambda / mu)."""
    rho = offered / servers
    top = offered**servers / math.factorial(servers) / (1 - rho)
    bottom = sum(offered**k / math.factorial(k) for k in range(servers)) + top
    return top / bottom


def replicate(service: dict, rate_rps: float, replicas: int, reps: int, n: int,
              warmup_s: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per-replication mean queue wait (ms) and P(wait > t_ms) at t = theory mean."""
    waits, tails = [], []
    for seed in range(reps):
        result = sim.run({
            "seed": 100 + seed, "service": service,
            "workload": {"kind": "poisson", "rate_rps": rate_rps, "n_requests": n},
            "policy": {"kind": "none"}, "replicas": replicas, "warmup_s": warmup_s,
        })
        req = result.requests
        req = req[req["arrival_s"] >= warmup_s]
        wait_ms = (req["start_s"] - req["arrival_s"]).to_numpy() * 1e3
        waits.append(wait_ms.mean())
        tails.append(wait_ms)
    return np.array(waits), tails


def within(estimates: np.ndarray, expected: float, max_rel_se: float) -> None:
    mean = float(estimates.mean())
    se = float(estimates.std(ddof=1) / math.sqrt(estimates.size))
    assert se < max_rel_se * expected, f"too noisy to test: se={se:.4g} for {expected:.4g}"
    z = abs(mean - expected) / se
    assert z < 4, f"mean {mean:.4g} vs theory {expected:.4g} (se {se:.3g}, {z:.1f} se)"


CASES = [
    pytest.param(0.5, 8, 40_000, id="rho=0.5"),
    pytest.param(0.9, 8, 150_000, id="rho=0.9", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("rho", "reps", "n"), CASES)
def test_mm1_mean_wait_and_wait_tail(rho: float, reps: int, n: int) -> None:
    mu = 1e3 / MEAN_SERVICE_MS
    lam = rho * mu
    expected_wq_ms = rho / (mu - lam) * 1e3
    warmup_s = 2000 / mu
    waits, samples = replicate({"kind": "exponential", "mean_ms": MEAN_SERVICE_MS}, lam, 1,
                                  reps, n, warmup_s)
    within(waits, expected_wq_ms, 0.05)
    # P(W > t) = rho * exp(-(mu - lambda) t) at t = the mean wait
    t_s = expected_wq_ms / 1e3
    tail_expected = rho * math.exp(-(mu - lam) * t_s)
    tails = np.array([np.mean(s > expected_wq_ms) for s in samples])
    within(tails, tail_expected, 0.05)


@pytest.mark.parametrize(("rho", "reps", "n"), CASES)
def test_md1_pollaczek_khinchine(rho: float, reps: int, n: int) -> None:
    mu = 1e3 / MEAN_SERVICE_MS
    lam = rho * mu
    expected_wq_ms = rho * MEAN_SERVICE_MS / (2 * (1 - rho))
    waits, _ = replicate({"kind": "constant", "ms": MEAN_SERVICE_MS}, lam, 1, reps, n,
                            2000 / mu)
    within(waits, expected_wq_ms, 0.05)


@pytest.mark.parametrize(("rho", "reps", "n"), CASES)
def test_mmc_erlang_c_shared_queue(rho: float, reps: int, n: int) -> None:
    servers = 3
    mu = 1e3 / MEAN_SERVICE_MS
    lam = rho * mu * servers
    expected_wq_ms = erlang_c(servers, lam / mu) / (servers * mu - lam) * 1e3
    waits, _ = replicate({"kind": "exponential", "mean_ms": MEAN_SERVICE_MS}, lam, servers,
                            reps, n, 2000 / mu)
    within(waits, expected_wq_ms, 0.06)
