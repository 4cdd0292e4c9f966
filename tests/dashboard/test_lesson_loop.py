"""The serving-loop lesson steps the simulator's own core: same starts and finishes as sim.run."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit")

import sim
from dashboard.lesson_loop import describe, loop_scenario, trace_loop


@pytest.mark.parametrize(("rate", "batch", "wait_ms"), [(250.0, 4, 5.0), (600.0, 8, 0.0),
                                                         (50.0, 1, 20.0)])
def test_the_stepped_loop_matches_the_simulator(rate: float, batch: int, wait_ms: float) -> None:
    scenario = loop_scenario(10, rate, batch, wait_ms)
    snaps = trace_loop(scenario)
    arrive, start, finish = {}, {}, {}
    for snap in snaps:
        assert len(snap.started) <= batch
        assert len(snap.device) <= batch  # one batch on the device at a time
        for mapping, ids in ((arrive, snap.arrived), (start, snap.started),
                             (finish, snap.finished)):
            for r in ids:
                assert r not in mapping  # each request enqueued, started, returned once
                mapping[r] = snap.time_s
        assert not set(snap.queue) & set(snap.device)
    assert sorted(arrive) == sorted(start) == sorted(finish) == list(range(10))
    reference = sim.run(scenario).requests.set_index("id").sort_index()
    np.testing.assert_allclose([arrive[r] for r in range(10)], reference["arrival_s"])
    np.testing.assert_allclose([start[r] for r in range(10)], reference["start_s"])
    np.testing.assert_allclose([finish[r] for r in range(10)], reference["finish_s"])
    assert snaps[-1].queue == () and snaps[-1].device == ()


def test_the_events_read_as_the_loop() -> None:
    snaps = trace_loop(loop_scenario(10, 250.0, 4, 5.0))
    words = [describe(s, True) for s in snaps]
    assert words[0].startswith("enqueue #0")
    assert any("max wait ran out" in w for w in words)
    assert any("batch formed and sent to the model" in w for w in words)
    assert words[-1].startswith("results returned")
    assert all(describe(s, False) for s in snaps)
