"""``service.overheads`` on request-level scenarios: a per-request delay outside the queue."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import sim
from sim.scenario.llm import LlmOverheadsCfg
from sim.scenario.schema import OverheadsCfg, ScenarioError, load_scenario

BASE = {"name": "overheads", "seed": 3,
        "service": {"kind": "profile", "path": "builtin:minilm-cpu"},
        "workload": {"kind": "poisson", "rate_rps": 30, "duration_s": 20},
        "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5, "timer": "first"},
        "warmup_s": 1}


def test_the_overhead_adds_to_every_latency_and_leaves_the_queue_alone() -> None:
    plain = sim.run(BASE)
    slowed = sim.run(BASE, {"service.overheads": {"request_ms": 40}})
    # the batches (sizes, starts, busy time) are the same: the queue never saw the overhead
    pd.testing.assert_frame_equal(plain.batches, slowed.batches)
    assert slowed.summary["utilization"] == plain.summary["utilization"]
    assert slowed.summary["mean_batch_size"] == plain.summary["mean_batch_size"]
    # every answer reaches the client 40 ms later
    delta = (slowed.requests["finish_s"] - plain.requests["finish_s"]).to_numpy()
    np.testing.assert_allclose(delta, 0.040, atol=1e-12)
    for q in ("p50", "p99", "mean"):
        assert slowed.summary["latency_ms"][q] == pytest.approx(
            plain.summary["latency_ms"][q] + 40.0, abs=1e-6)
    # a lean run keeps full records (meta says why) and gives the same summary
    lean = sim.run(BASE, {"service.overheads": {"request_ms": 40}}, records="summary")
    assert "overheads" in lean.meta["records_note"]
    assert lean.summary["latency_ms"]["p50"] == slowed.summary["latency_ms"]["p50"]


def test_overheads_are_refused_for_a_closed_loop_and_shared_with_the_llm_services() -> None:
    closed = {**BASE, "workload": {"kind": "closed", "clients": 4, "think_ms": 10,
                                   "duration_s": 5}}
    with pytest.raises(ScenarioError, match=r"service\.overheads"):
        load_scenario(closed, {"service.overheads": {"request_ms": 5}})
    with pytest.raises(ScenarioError, match="request_ms"):
        load_scenario(BASE, {"service.overheads": {"request_ms": -1}})
    assert issubclass(LlmOverheadsCfg, OverheadsCfg)  # one mechanism, the LLM adds a term
