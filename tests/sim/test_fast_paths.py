"""The simulator's bulk paths keep the policy contract and the metric definitions.

A FIFO queue hands a batch taken from its head over without checking each id, and writes a
run of consecutive ids as column slices; every other decision is checked id by id. The
summary statistics over long runs are taken in chunks. These tests pin both to the plain
definitions.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import sim.metrics.folds as folds
import sim.metrics.summary as metrics
from sim.drivers.engine import SimPyDriver
from sim.scenario.service import ConstantService
from sim.serving.core import ServingCore
from sim.serving.dispatch import PolicyError
from sim.serving.records import RequestTable
from sim.serving.sources import ScheduleSource
from sim.serving.types import WAIT, Decision, QueueView, ReplicaView


class Scripted:
    """Dispatches the ids ``pick(queue ids)`` chooses, once at least ``wait_for`` wait."""

    max_concurrent_batches = 1

    def __init__(self, pick, wait_for: int = 3, max_batch_size: int = 8) -> None:  # type: ignore[no-untyped-def]
        self.pick = pick
        self.wait_for = wait_for
        self.max_batch_size = max_batch_size

    def decide(self, now_s: float, queue: QueueView, replica: ReplicaView) -> Decision:
        ids = queue.ids()
        if len(ids) < self.wait_for:  # the rest goes at 1 s
            return WAIT if not ids else Decision(wake_at_s=1.0) if now_s < 1.0 else \
                Decision(dispatch=tuple(ids))
        return Decision(dispatch=tuple(self.pick(ids)))

    def on_batch_done(self, now_s: float, batch_size: int, service_s: float) -> None:
        """No feedback."""


def run_core(policy: Scripted, arrivals_s: list[float]) -> ServingCore:
    table = RequestTable(np.array(arrivals_s))
    core = ServingCore(table, ScheduleSource(table), [policy])
    SimPyDriver(core, ConstantService(5.0)).run()
    core.check_invariants()
    return core


ARRIVALS = [0.0, 0.001, 0.002, 0.003, 0.004, 0.005]


def test_a_head_batch_in_another_order_is_served_in_that_order() -> None:
    core = run_core(Scripted(lambda ids: [ids[1], ids[0], ids[2]]), ARRIVALS)
    req = core.table.to_frame()
    assert (req["status"] == "ok").all()
    first = req.set_index("id").loc[[0, 1, 2], "batch_id"]
    assert first.nunique() == 1
    assert list(core.batches.to_frame()["size"][:1]) == [3]


def test_a_batch_that_skips_the_head_leaves_the_head_waiting() -> None:
    core = run_core(Scripted(lambda ids: ids[1:3]), ARRIVALS)
    req = core.table.to_frame().set_index("id")
    assert (req["status"] == "ok").all()
    assert req.loc[1, "batch_id"] == req.loc[2, "batch_id"] != req.loc[0, "batch_id"]
    assert req.loc[0, "start_s"] > req.loc[1, "start_s"]


def test_a_duplicate_id_in_a_head_batch_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="twice"):
        run_core(Scripted(lambda ids: [ids[0], ids[0], ids[1]]), ARRIVALS)


def test_an_id_that_is_not_waiting_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="not waiting"):
        run_core(Scripted(lambda ids: [ids[0], ids[1], 99]), ARRIVALS)


def test_above_max_batch_size_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="max_batch_size"):
        run_core(Scripted(lambda ids: ids, wait_for=3, max_batch_size=2), ARRIVALS)


def test_a_change_at_the_same_instant_held_for_no_time() -> None:
    # two arrivals at 1 s are dispatched at that instant (lengths 1 and 2 for zero seconds);
    # another waits from 2 s to 3 s: the longest queue that held for any time is 1
    q = pd.DataFrame({"time_s": [0.0, 1.0, 1.0, 1.0, 2.0, 3.0], "queue": [0] * 6,
                      "length": [0, 1, 2, 0, 1, 0]})
    stats = metrics.queue_length_stats(q, 0.0, 4.0)
    assert stats["max"] == 1
    assert stats["mean"] == pytest.approx(0.25)
    assert stats["p95"] == 1


def random_tables(seed: int, n: int = 5000) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.01, n))
    start = arrival + rng.exponential(0.02, n)
    finish = start + rng.exponential(0.005, n)
    finish[rng.random(n) < 0.01] = np.nan
    requests = pd.DataFrame({"arrival_s": arrival, "finish_s": finish})
    batches = pd.DataFrame({"replica": np.zeros(n, dtype=np.int16), "start_s": start,
                            "finish_s": finish})
    times = np.sort(np.round(rng.uniform(0, arrival[-1], 3 * n), 3))  # with repeats
    queue = pd.DataFrame({"time_s": times, "queue": np.zeros(times.size, dtype=np.int16),
                          "length": rng.integers(0, 40, times.size)})
    return requests, batches, queue


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_statistics_in_chunks_equal_the_whole(seed: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    requests, batches, queue = random_tables(seed)
    lo, hi = 5.0, float(requests["arrival_s"].iloc[-1]) - 1.0
    whole = (metrics.queue_length_stats(queue, lo, hi),
             metrics.busy_s(batches, 0, lo, hi),
             metrics.in_system_mean(requests, lo, hi, hi + 1.0))
    monkeypatch.setattr(folds, "CHUNK", 7)
    chunked = (metrics.queue_length_stats(queue, lo, hi),
               metrics.busy_s(batches, 0, lo, hi),
               metrics.in_system_mean(requests, lo, hi, hi + 1.0))
    assert chunked[0]["max"] == whole[0]["max"] and chunked[0]["p95"] == whole[0]["p95"]
    assert chunked[0]["mean"] == pytest.approx(whole[0]["mean"], rel=1e-12)
    assert chunked[1] == pytest.approx(whole[1], rel=1e-12)
    assert chunked[2] == pytest.approx(whole[2], rel=1e-12)


def test_queue_statistics_match_a_direct_integration() -> None:
    _, _, queue = random_tables(4, 400)
    lo, hi = 0.5, 3.5
    times, lengths = queue["time_s"].to_numpy(), queue["length"].to_numpy()
    grid = np.linspace(lo, hi, 300_001)[:-1] + 0.5e-5  # midpoints of 10 us steps
    level = np.where(np.searchsorted(times, grid, side="right") > 0,
                     lengths[np.maximum(np.searchsorted(times, grid, side="right") - 1, 0)], 0)
    stats = metrics.queue_length_stats(queue, lo, hi)
    assert stats["mean"] == pytest.approx(level.mean(), rel=2e-3)
    assert stats["max"] == level.max()
    assert stats["p95"] == pytest.approx(np.percentile(level, 95, method="inverted_cdf"),
                                         abs=1)
    assert math.isfinite(stats["mean"])


def test_a_fifo_queue_does_not_keep_the_ids_it_served() -> None:
    # a long run's served ids would otherwise stay behind the head: ~40 bytes per request
    arrivals = np.cumsum(np.random.default_rng(5).exponential(0.01, 20_000))
    table = RequestTable(arrivals)
    core = ServingCore(table, ScheduleSource(table), [Scripted(lambda ids: ids[:1], 1)])
    SimPyDriver(core, ConstantService(9.0)).run()
    fifo = core.queues[0]
    assert len(fifo._ids) <= 2 * 1024 + 2  # type: ignore[attr-defined]
    assert core.check_invariants()["ok"] == 20_000
