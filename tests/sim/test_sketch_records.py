"""``records: sketch``: the latency samples as fixed-size log-bucket counts. Everything but
the percentiles equals a full-records run's summary; each percentile is within the stated
bound (:data:`sim.metrics.folds.SKETCH_REL_ERROR` relative, or
:data:`sim.metrics.folds.SKETCH_FLOOR_S`) of numpy's exact one, over the golden scenarios with
and without a backlog at the stop.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sim
import sim.metrics.summary_sink as summary_sink
from sim.metrics.folds import PERCENTILES, SKETCH_FLOOR_S, SKETCH_REL_ERROR, BinnedSamples
from tests.sim.golden import SCENARIOS, flat
from tests.sim.traced import peak_traced_bytes

REL = 1e-9  # sums folded in chunks (as in test_summary_records)
PCT = tuple(PERCENTILES)
FLOOR_MS = SKETCH_FLOOR_S * 1e3


def _within_bound(exact: float, sketch: float, floor: float) -> bool:
    # the stated bound, plus the rounding of one interpolation and one product (ulps)
    return abs(sketch - exact) <= max(SKETCH_REL_ERROR * abs(exact), floor) + 4e-16 * abs(exact)


def _samples(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if kind == "lognormal-wide":  # nine decades
        return rng.lognormal(mean=-6.0, sigma=3.0, size=n)
    if kind == "exponential-with-zeros":  # queue waits: many exact zeros
        values = rng.exponential(0.01, n)
        values[rng.random(n) < 0.4] = 0.0
        return values
    if kind == "tiny":  # below the floor
        return rng.uniform(0.0, 3e-9, n)
    return np.full(n, 0.0123)  # "constant"


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 100_001])
@pytest.mark.parametrize("kind", ["lognormal-wide", "exponential-with-zeros", "tiny",
                                  "constant"])
def test_sketch_percentiles_are_within_the_stated_bound(kind: str, n: int) -> None:
    rng = np.random.default_rng(n)
    values = _samples(kind, rng, n)
    sketch = BinnedSamples()
    for part in np.array_split(values, 5):  # fed in chunks, as a run feeds it
        sketch.extend(part)
    exact = np.percentile(values, list(PERCENTILES.values()))
    got = sketch.percentiles_s(list(PERCENTILES.values()))
    for p, x, y in zip(PERCENTILES, exact.tolist(), got, strict=True):
        assert _within_bound(x, y, SKETCH_FLOOR_S), (p, x, y)
    assert sketch.n == n and sketch.max_s == values.max() and sketch.min_s == values.min()
    assert math.isclose(sketch.mean_s(), float(values.mean()), rel_tol=1e-12, abs_tol=1e-18)


def test_the_bound_is_not_loose_and_the_buckets_really_approximate() -> None:
    # the check above could pass with a sloppy bound: the worst error over many percentiles
    # of a wide sample comes within a factor of 3 of the bound, and is not zero
    values = np.random.default_rng(3).lognormal(-6.0, 2.0, 200_000)
    sketch = BinnedSamples()
    sketch.extend(values)
    percents = list(np.linspace(1, 99, 197))
    exact = np.percentile(values, percents)
    rel = np.abs(np.array(sketch.percentiles_s(percents)) - exact) / exact
    assert SKETCH_REL_ERROR / 3 < rel.max() <= SKETCH_REL_ERROR


def test_a_merged_sketch_is_the_sketch_of_both() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.exponential(0.002, 5000), rng.lognormal(0.0, 1.0, 3000)
    one, two, both = BinnedSamples(), BinnedSamples(), BinnedSamples()
    one.extend(a)
    two.extend(b)
    both.extend(np.concatenate((a, b)))
    merged = one.merged(two)
    assert merged.n == both.n and merged.zeros == both.zeros
    assert merged.percentiles_s([50, 99]) == both.percentiles_s([50, 99])
    assert one.merged(BinnedSamples()).percentiles_s([50]) == one.percentiles_s([50])


def test_a_sketch_refuses_negative_or_nan_samples() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        BinnedSamples().extend(np.array([0.1, -1e-3]))
    with pytest.raises(ValueError, match="non-negative"):
        BinnedSamples().extend(np.array([0.1, math.nan]))


def _differences(full: dict[str, Any], sketch: dict[str, Any]) -> list[str]:
    a, b = flat(full), flat(sketch)
    bad = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, float) and isinstance(y, float) and key.endswith(PCT):
            if not (math.isnan(x) and math.isnan(y)) and not _within_bound(x, y, FLOOR_MS):
                bad.append(f"{key}: {x} vs {y}")
        elif isinstance(x, float) and isinstance(y, float):
            if not math.isclose(x, y, rel_tol=REL, abs_tol=1e-12) and not (
                    math.isnan(x) and math.isnan(y)):
                bad.append(f"{key}: {x} != {y}")
        elif x != y:
            bad.append(f"{key}: {x} != {y}")
    return bad


@pytest.mark.parametrize("drain", [None, 0.0], ids=["drained", "stopped-at-horizon"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_sketch_records_give_the_full_summary_within_the_bound(
        name: str, drain: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summary_sink, "FLUSH_ROWS", 50)  # many folds per run
    cfg = dict(SCENARIOS[name], warmup_s=1.0)
    full = sim.run(cfg, drain_timeout_s=drain)
    sketch = sim.run(cfg, drain_timeout_s=drain, records="sketch")
    assert not _differences(full.summary, sketch.summary)
    fallback = cfg.get("autoscaling") is not None or cfg["workload"]["kind"] == "closed"
    assert sketch.meta["records"] == ("full" if fallback else "sketch")


def test_sketch_percentiles_really_differ_from_the_exact_ones() -> None:
    # the equality above is not vacuous: the sketch's percentiles are not the exact values
    cfg = dict(SCENARIOS["random"], warmup_s=1.0)
    full = sim.run(cfg).summary["latency_ms"]
    sketch = sim.run(cfg, records="sketch").summary["latency_ms"]
    assert any(full[p] != sketch[p] for p in PCT)
    assert full["max"] == sketch["max"] and full["censored"] == sketch["censored"]


def test_a_sketch_sweep_and_run_directory(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app
    from sim.experiments import sweep

    grid = {"policy.max_batch_size": [2, 8]}
    rows = sweep(SCENARIOS["greedy"], grid, seeds=1, workers=1, records="sketch")
    exact = sweep(SCENARIOS["greedy"], grid, seeds=1, workers=1)
    assert rows["records"].tolist() == ["sketch", "sketch"]
    for key in ("latency_ms.p50", "latency_ms.p99", "queue_ms.p99"):
        for x, y in zip(exact[key].tolist(), rows[key].tolist(), strict=True):
            assert _within_bound(x, y, FLOOR_MS), (key, x, y)
    assert rows["completions"].tolist() == exact["completions"].tolist()
    path = tmp_path / "greedy.json"
    path.write_text(json.dumps(SCENARIOS["greedy"]))
    out = tmp_path / "run"
    done = CliRunner().invoke(app, ["simulate", str(path), "--records", "sketch", "-q",
                                    "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "scenario.yaml",
                                                     "summary.json"]
    assert json.loads((out / "meta.json").read_text())["records"] == "sketch"
    bad = CliRunner().invoke(app, ["simulate", str(path), "--records", "sketchy"])
    assert bad.exit_code == 2 and "'full', 'summary', 'sketch'" in bad.output


def _peak_bytes(n: int, records: str) -> int:
    cfg = {"seed": 1, "service": {"kind": "linear", "base_ms": 5, "per_item_ms": 0.5},
           "workload": {"kind": "poisson", "rate_rps": 1100, "n_requests": n},
           "policy": {"kind": "dynamic", "max_batch_size": 16, "max_wait_ms": 5}}
    return peak_traced_bytes(cfg, records)


def test_sketch_records_keep_about_a_dozen_bytes_per_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What grows with the run: arrival (8) and status (1) for the simulation itself, and
    # the arrival schedule's build. The sketches, flush buffers and fold temporaries are a
    # fixed size, so the slope between two run lengths is what a request costs; small
    # flushes keep the fixed part from hiding it. Measured: 9.9 bytes per request (sketch),
    # 36 (exact summary: its 24 bytes of latency, wait and service samples on top).
    monkeypatch.setattr(summary_sink, "FLUSH_ROWS", 4096)
    n = 200_000
    sketch = (_peak_bytes(2 * n, "sketch") - _peak_bytes(n, "sketch")) / n
    summary = (_peak_bytes(2 * n, "summary") - _peak_bytes(n, "summary")) / n
    assert sketch <= 16, sketch
    assert summary - sketch >= 20, (summary, sketch)  # the samples, 24 bytes, are gone
