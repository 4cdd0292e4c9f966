"""``records: summary``: a run that keeps only what its summary needs gives the same summary
as a run with full records, over every policy, discipline and router of the golden set, with
a warm-up, with a backlog at the stop (censored requests), and folding in small chunks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim
import sim.metrics.summary_sink as summary_sink
from sim.metrics.summary import fold_queue, queue_length_stats, summarize
from sim.scenario.schema import ScenarioError
from tests.sim.golden import SCENARIOS, flat
from tests.sim.traced import peak_traced_bytes

# Sums folded chunk by chunk round differently from one sum over the whole column: a few
# ulps, i.e. ~1e-16 relative, times the cancellation of a difference (Little's-law gap,
# trend). Counts, percentiles and maxima are the same values and compare exactly.
REL = 1e-9
EXACT = ("p50", "p90", "p95", "p99", "p999", "max", "censored")


def _same(full: dict[str, Any], lean: dict[str, Any]) -> list[str]:
    a, b = flat(full), flat(lean)
    bad = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, float) and isinstance(y, float) and not key.endswith(EXACT):
            if not math.isclose(x, y, rel_tol=REL, abs_tol=1e-12):
                bad.append(f"{key}: {x} != {y}")
        elif x != y:
            bad.append(f"{key}: {x} != {y}")
    return bad


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summary_sink, "FLUSH_ROWS", 50)  # fold many times in each run


@pytest.mark.parametrize("drain", [None, 0.0], ids=["drained", "stopped-at-horizon"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_summary_records_give_the_full_records_summary(name: str, drain: float | None,
                                                        small_chunks: None) -> None:
    cfg = dict(SCENARIOS[name], warmup_s=1.0)
    full = sim.run(cfg, drain_timeout_s=drain)
    lean = sim.run(cfg, drain_timeout_s=drain, records="summary")
    assert not _same(full.summary, lean.summary)
    autoscaled = cfg.get("autoscaling") is not None
    closed_by_count = cfg["workload"]["kind"] == "closed"
    assert lean.meta["records"] == ("full" if autoscaled or closed_by_count else "summary")
    if lean.meta["records"] == "summary":
        assert lean.requests.empty and lean.batches.empty and lean.queue.empty
    else:
        assert "records_note" in lean.meta


def test_the_backlog_case_is_really_censored_and_folded_in_chunks(small_chunks: None) -> None:
    # the comparison above must cover the hard case: a backlog at the stop, many folds
    cfg = dict(SCENARIOS["random"], warmup_s=1.0)
    lean = sim.run(cfg, drain_timeout_s=0.0, records="summary")
    assert lean.summary["censored"] > 100
    assert lean.summary["latency_ms"]["censored"] == lean.summary["censored"]
    assert lean.summary["completions"] > 40 * summary_sink.FLUSH_ROWS


def test_a_closed_loop_with_a_duration_keeps_summary_records(small_chunks: None) -> None:
    cfg = {"seed": 4, "service": {"kind": "gamma", "mean_ms": 8, "cv": 0.6},
           "workload": {"kind": "closed", "clients": 12, "think_ms": 20, "duration_s": 8},
           "policy": {"kind": "greedy", "max_batch_size": 8}, "warmup_s": 1.0}
    full, lean = sim.run(cfg), sim.run(cfg, records="summary")
    assert lean.meta["records"] == "summary"
    assert not _same(full.summary, lean.summary)


def test_sizes_and_deadlines_that_vary_are_kept(small_chunks: None, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    times = np.cumsum(rng.exponential(1 / 300, 3000))
    path = tmp_path / "trace.csv"
    pd.DataFrame({"ts": times, "n": rng.integers(1, 7, times.size)}).to_csv(path, index=False)
    cfg = {"seed": 2, "service": {"kind": "linear", "base_ms": 3, "per_item_ms": 1, "cv": 0.3},
           "workload": {"kind": "trace", "path": str(path), "timestamp_column": "ts",
                        "size_column": "n"},
           "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 4},
           "slo_ms": 30, "queue": {"discipline": "edf"}}
    full, lean = sim.run(cfg), sim.run(cfg, records="summary")
    assert full.summary["mean_batch_items"] > 2 * full.summary["mean_batch_size"]
    assert full.summary["goodput_rps"] < full.summary["throughput_rps"]
    assert not _same(full.summary, lean.summary)


def test_an_unknown_records_mode_is_refused_by_name() -> None:
    with pytest.raises(ScenarioError, match=r"records: 'partial' is not one of \['full', "
                                            r"'summary', 'sketch'\]"):
        sim.run(SCENARIOS["greedy"], records="partial")


def test_the_scenario_file_can_ask_for_summary_records() -> None:
    lean = sim.run({**SCENARIOS["greedy"], "records": "summary"})
    assert lean.meta["records"] == "summary" and lean.requests.empty
    assert sim.run({**SCENARIOS["greedy"], "records": "summary"},
                   records="full").meta["records"] == "full"  # the argument wins
    with pytest.raises(ScenarioError,
                       match="records: Input should be 'full', 'summary' or 'sketch'"):
        sim.load_scenario({**SCENARIOS["greedy"], "records": "some"})


def test_a_summary_run_directory_has_no_tables(tmp_path: Path) -> None:
    result = sim.run(SCENARIOS["greedy"], records="summary")
    out = result.write(tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "scenario.yaml",
                                                     "summary.json"]


def test_summary_records_keep_a_few_dozen_bytes_per_request() -> None:
    # what a summary-only run keeps per request: arrival (8) and status (1) for the
    # simulation itself, latency, wait and service samples (24) for exact percentiles;
    # buffers of FLUSH_ROWS rows and the schedule's build come on top, and do not grow
    n = 200_000
    cfg = {"seed": 1, "service": {"kind": "exponential", "mean_ms": 1},
           "workload": {"kind": "poisson", "rate_rps": 900, "n_requests": n},
           "policy": {"kind": "none"}}
    lean = peak_traced_bytes(cfg, "summary")
    full = peak_traced_bytes(cfg, "full")
    fixed = 8 * 2**20  # the flush buffers and the folds' chunk temporaries
    assert lean <= 40 * n + fixed, lean / n
    assert full > 2.5 * lean  # (full records: ~140 bytes per request and more)


def test_sweeps_keep_summary_records_by_default() -> None:
    from sim.experiments import sweep

    rows = sweep(SCENARIOS["greedy"], {"policy.max_batch_size": [4]}, seeds=1, workers=1)
    assert rows["records"].tolist() == ["summary"]
    full = sweep(SCENARIOS["greedy"], {"policy.max_batch_size": [4]}, seeds=1, workers=1,
                 records="full")
    assert full["records"].tolist() == ["full"]
    same = [c for c in rows.columns if c not in ("wall_s", "records")
            and rows[c].dtype.kind == "f"]
    assert np.allclose(rows[same].to_numpy(float), full[same].to_numpy(float), rtol=REL,
                       equal_nan=True)


def test_the_queue_fold_in_chunks_equals_the_whole() -> None:
    # a queue series folded a chunk at a time (as a summary-only run does) gives the
    # statistics of the whole series; rows with repeated instants, two queues
    rng = np.random.default_rng(5)
    times = np.sort(np.round(rng.uniform(0, 50, 6000), 2))
    queue = pd.DataFrame({"time_s": times, "queue": rng.integers(0, 2, times.size),
                          "length": rng.integers(0, 30, times.size)})
    lo, hi = 3.0, 45.0
    whole = fold_queue(queue, lo, hi)
    from sim.metrics.folds import QueueFold

    parts = QueueFold(lo, hi, 10)
    for a in range(0, len(queue), 777):
        chunk = queue.iloc[a:a + 777]
        parts.add(chunk["time_s"].to_numpy(), chunk["queue"].to_numpy(),
                  chunk["length"].to_numpy())
    parts.close()
    assert parts.steps.stats()["max"] == whole.steps.stats()["max"]
    assert parts.steps.stats()["p95"] == whole.steps.stats()["p95"]
    assert parts.steps.stats()["mean"] == pytest.approx(whole.steps.stats()["mean"], rel=1e-12)
    assert np.allclose(parts.steps.segment_means(), whole.steps.segment_means(), rtol=1e-12)
    assert queue_length_stats(queue, lo, hi) == whole.steps.stats()


def test_summarize_refuses_an_unknown_status_by_name() -> None:
    from sim.metrics.window import Window

    requests = pd.DataFrame({"arrival_s": [0.0], "start_s": [0.1], "finish_s": [0.2],
                             "status": ["lost"]})
    empty_batches = pd.DataFrame({"replica": [], "start_s": [], "finish_s": [], "size": [],
                                  "items": []})
    empty_queue = pd.DataFrame({"time_s": [], "queue": [], "length": []})
    with pytest.raises(ValueError, match=r"status: unknown values \['lost'\]"):
        summarize(requests, empty_batches, empty_queue, Window(0.0, 1.0, 1, 1), "sim")


def test_views_kept_alive_elsewhere_do_not_break_the_flushes(
        small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # a profiler that samples frames (Dask's worker has one) keeps a returned frame's
    # arguments alive: here, the numpy views each fold was given. An array.array with a
    # live view cannot be resized, so the flushes must replace their buffers, not resize
    from sim.metrics import folds

    held: list[Any] = []
    for cls in (folds.RequestFold, folds.BatchFold, folds.QueueFold):
        original = cls.add

        def holding(self: Any, *args: Any, _original: Any = original, **kw: Any) -> None:
            held.append(args)
            _original(self, *args, **kw)

        monkeypatch.setattr(cls, "add", holding)
    cfg = SCENARIOS["dynamic-request"]
    lean = sim.run(cfg, records="summary")
    assert len(held) > 3 * 4000 / summary_sink.FLUSH_ROWS
    monkeypatch.undo()
    assert not _same(sim.run(cfg).summary, lean.summary)
