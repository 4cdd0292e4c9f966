"""``service.overheads.arrival_busy_ms`` / ``answer_busy_ms``: the server's front end takes
time from its running batch (``sim/drivers/contention.py``), checked against hand-computed
batch times and, batch by batch, against the rule on a whole Poisson run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sim
from calibration.profile import LatencyProfile
from sim.scenario.schema import ScenarioError, load_scenario


@pytest.fixture
def flat(tmp_path: Path) -> str:
    """A profile whose every batch (sizes 1-8) takes exactly 10 ms."""
    return str(LatencyProfile({b: np.full(5, 0.010) for b in range(1, 9)},
                              model={"name": "flat"}).save(tmp_path / "flat.json"))


def _dur(batches: Any) -> np.ndarray:
    """Each batch's time (s), in the frame's order."""
    return (batches["finish_s"] - batches["start_s"]).to_numpy()  # type: ignore[no-any-return]


def _scn(path: str, overheads: dict[str, float], **workload: Any) -> dict[str, Any]:
    return {"name": "contention", "seed": 3,
            "service": {"kind": "profile", "path": path, "deterministic": True,
                        "overheads": overheads},
            "workload": {"kind": "constant", "rate_rps": 250, "n_requests": 5, **workload},
            "policy": {"kind": "none"}, "warmup_s": 0}


def test_arrivals_during_a_batch_lengthen_it_to_the_fixed_point(flat: str) -> None:
    # sends at 0, 4, 8, 12, 16 ms; one request per batch; 2 ms per arrival during a batch.
    # batch 0 from 0: 10 ms takes in 4 and 8 -> 14, which takes in 12 -> 16, which takes in
    # 16 -> 18 (20 is past it): 18 ms. The next four were queued: each starts as the one
    # before ends and takes in what arrives after that.
    res = sim.run(_scn(flat, {"arrival_busy_ms": 2.0}))
    b = res.batches.sort_values("start_s")
    np.testing.assert_allclose(_dur(b), [0.018, 0.010, 0.010, 0.010,
                                                          0.010], atol=1e-12)
    plain = sim.run(_scn(flat, {})).batches.sort_values("start_s")
    np.testing.assert_allclose(_dur(plain), np.full(5, 0.010))


def test_answers_lengthen_only_a_batch_that_starts_at_once(flat: str) -> None:
    # 0, 4, 8, ... ms: the replica (10 ms per batch) never catches up, so from the second
    # batch on each starts as the one before ends: + 3 ms for its one answer
    res = sim.run(_scn(flat, {"answer_busy_ms": 3.0}))
    b = res.batches.sort_values("start_s")
    np.testing.assert_allclose(_dur(b), [0.010] + [0.013] * 4, atol=1e-12)
    # 50 ms apart: the replica is idle when each arrives, so no answer is being sent
    slow = sim.run(_scn(flat, {"answer_busy_ms": 3.0}, rate_rps=20))
    np.testing.assert_allclose(_dur(slow.batches), np.full(5, 0.010))


def test_every_batch_of_a_poisson_run_follows_the_rule(flat: str) -> None:
    scn = {"name": "contention", "seed": 7,
           "service": {"kind": "profile", "path": flat, "deterministic": True,
                       "overheads": {"arrival_busy_ms": 1.5, "answer_busy_ms": 0.5}},
           "workload": {"kind": "poisson", "rate_rps": 180, "duration_s": 20},
           "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 2,
                      "timer": "arrival"}, "warmup_s": 0}
    res = sim.run(scn)
    arrivals = np.sort(res.requests["arrival_s"].to_numpy())
    b = res.batches.sort_values("start_s").reset_index(drop=True)
    start, dur = b["start_s"].to_numpy(), _dur(b)
    size = b["size"].to_numpy()
    end = start + dur
    during = np.searchsorted(arrivals, end, "right") - np.searchsorted(arrivals, start, "right")
    at_once = np.r_[False, np.isclose(start[1:], end[:-1], rtol=0, atol=1e-12)]
    answers = np.r_[0, size[:-1]] * at_once
    np.testing.assert_allclose(dur, 0.010 + 0.0015 * during + 0.0005 * answers, atol=1e-12)
    assert during.sum() > 1000 and answers.sum() > 500  # the rule was exercised
    # slow batches come in runs: a batch after a long one is longer than after a short one
    long_before = dur[1:][dur[:-1] > np.median(dur)].mean()
    short_before = dur[1:][dur[:-1] <= np.median(dur)].mean()
    assert long_before > short_before
    # and the load it adds is what the rule says (utilisation above the plain run's)
    plain = sim.run(scn, {"service.overheads.arrival_busy_ms": 0,
                          "service.overheads.answer_busy_ms": 0}).summary
    assert res.summary["latency_ms"]["p99"] > plain["latency_ms"]["p99"]


def test_one_replica_running_one_batch_only(flat: str) -> None:
    scn = _scn(flat, {"arrival_busy_ms": 1.0})
    with pytest.raises(ScenarioError, match="arrival_busy_ms/answer_busy_ms: one replica"):
        load_scenario({**scn, "replicas": 2})
    with pytest.raises(ScenarioError, match=r"policy\.max_concurrent_batches: 1"):
        load_scenario({**scn, "policy": {"kind": "greedy", "max_batch_size": 4,
                                         "max_concurrent_batches": 2}})
    with pytest.raises(ScenarioError, match="arrival_busy_ms"):
        load_scenario(_scn(flat, {"arrival_busy_ms": -1.0}))
    load_scenario({**_scn(flat, {"request_ms": 1.0}), "replicas": 2})  # the others may
