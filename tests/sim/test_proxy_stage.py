"""``service.overheads.proxy_in_ms`` / ``proxy_out_ms``: an HTTP proxy (Ray Serve's one
asyncio loop) as a single-server FIFO stage in front of the replica's queue, checked against
hand-computed departures and a whole request log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sim
from calibration.profile import LatencyProfile
from sim.drivers.proxy_stage import fifo_departures, outbound_departures
from sim.scenario.schema import ScenarioError, load_scenario


def test_fifo_departures_follow_lindleys_recursion() -> None:
    # three at once leave 2 ms apart; one that comes after the stage emptied waits for nobody
    np.testing.assert_allclose(fifo_departures(np.array([0.0, 0.0, 0.0, 0.010]), 0.002),
                               [0.002, 0.004, 0.006, 0.012])
    # 1 ms apart with a 2 ms cost: each waits for the one before (0.002, 0.004, 0.006), and
    # the stage has caught up by the fourth (arrives 0.0065 > 0.006)
    np.testing.assert_allclose(fifo_departures(np.array([0.0, 0.001, 0.002, 0.0065]), 0.002),
                               [0.002, 0.004, 0.006, 0.0085])
    # the recursion, step by step, on random arrivals
    rng = np.random.default_rng(5)
    a = np.sort(rng.uniform(0, 0.1, 200))
    d, last = [], -np.inf
    for t in a:
        last = max(t, last) + 0.0007
        d.append(last)
    np.testing.assert_allclose(fifo_departures(a, 0.0007), d, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(fifo_departures(a, 0.0), a)
    with pytest.raises(ValueError, match="non-decreasing"):
        fifo_departures(np.array([0.002, 0.001]), 0.001)
    with pytest.raises(ValueError, match="cost_s"):
        fifo_departures(a, -1.0)


def test_outbound_serves_answers_in_the_order_their_batches_ended() -> None:
    # requests 0 and 2 ended together (one batch), 1 earlier, 3 never (NaN stays NaN)
    out = outbound_departures(np.array([0.010, 0.004, 0.010, np.nan]), 0.003)
    np.testing.assert_allclose(out, [0.013, 0.007, 0.016, np.nan])


@pytest.fixture
def scn(tmp_path: Path) -> dict[str, Any]:
    """Four sends 1 ms apart, a replica whose every batch (sizes 1-4) takes exactly 1 ms."""
    path = LatencyProfile({b: np.full(5, 0.001) for b in (1, 2, 3, 4)},
                          model={"name": "flat"}).save(tmp_path / "flat.json")
    return {"name": "proxy", "seed": 1,
            "service": {"kind": "profile", "path": str(path), "deterministic": True},
            "workload": {"kind": "constant", "rate_rps": 1000, "n_requests": 4},
            "policy": {"kind": "none"}, "warmup_s": 0}


def test_the_core_sees_requests_when_the_proxy_lets_them_go(scn: dict[str, Any]) -> None:
    # sends 1 ms apart; the proxy takes 2 ms of each on the way in, so the replica's queue
    # sees them 2 ms apart; 1 ms of service each; each answer takes 0.5 ms on the way out
    # (the outbound stage is idle between them) plus a 3 ms pure delay
    res = sim.run(scn, {"service.overheads": {"proxy_in_ms": 2, "proxy_out_ms": 0.5,
                                              "request_ms": 3}})
    r = res.requests.sort_values("id")
    sent = r["arrival_s"].to_numpy()
    np.testing.assert_allclose(np.diff(sent), 0.001, atol=1e-12)
    seen = fifo_departures(sent, 0.002)
    np.testing.assert_allclose(seen - sent[0], [0.002, 0.004, 0.006, 0.008], atol=1e-12)
    np.testing.assert_allclose(r["start_s"], seen, atol=1e-12)
    np.testing.assert_allclose(res.batches["start_s"], seen, atol=1e-12)
    np.testing.assert_allclose(r["finish_s"], seen + 0.001 + 0.0005 + 0.003, atol=1e-12)
    # latency: 2 + 1 + 0.5 + 3 ms for the first, 1 ms more queueing at the proxy for each next
    np.testing.assert_allclose((r["finish_s"] - r["arrival_s"]) * 1e3,
                               [6.5, 7.5, 8.5, 9.5], atol=1e-9)
    assert res.summary["latency_ms"]["max"] == pytest.approx(9.5)


def test_answers_of_one_batch_leave_the_proxy_one_after_another(scn: dict[str, Any]) -> None:
    # four sends 1 us apart; greedy batching up to 4; the inbound stage lets them go 1 ms
    # apart and each batch takes 1 ms, so the replica is free each time one is let in: four
    # batches of 1 where the sends alone would have made one batch of 4
    res = sim.run(scn, {"workload.rate_rps": 1e6, "policy": {"kind": "greedy",
                                                            "max_batch_size": 4},
                        "service.overheads": {"proxy_in_ms": 1, "proxy_out_ms": 2}})
    r = res.requests.sort_values("id")
    seen = fifo_departures(r["arrival_s"].to_numpy(), 0.001)
    # the replica is free whenever a request is let in (each batch ends as the next arrives)
    assert res.batches["size"].tolist() == [1, 1, 1, 1]
    np.testing.assert_allclose(res.batches["start_s"], seen, atol=1e-12)
    # the answers leave 2 ms apart, the first 2 ms after its batch ended: the outbound
    # stage is the bottleneck (2 ms each against 1 ms between batch ends)
    np.testing.assert_allclose(r["finish_s"], seen[0] + 0.001 + 0.002 * np.arange(1, 5),
                               atol=1e-12)


def test_proxy_costs_are_validated_and_need_an_open_loop(scn: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError, match="proxy_in_ms"):
        load_scenario(scn, {"service.overheads": {"proxy_in_ms": -1}})
    # a lean run keeps full records (the stage rewrites arrival and finish times)
    lean = sim.run(scn, {"service.overheads": {"proxy_in_ms": 1}}, records="summary")
    assert "overheads" in lean.meta["records_note"]
    # zero costs change nothing
    plain, zero = sim.run(scn), sim.run(scn, {"service.overheads": {"proxy_in_ms": 0}})
    assert plain.summary["latency_ms"] == zero.summary["latency_ms"]
