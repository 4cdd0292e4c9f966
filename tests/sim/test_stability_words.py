"""The words shown for a stability verdict: "saturated" only near capacity."""

from __future__ import annotations

import sim
from sim.metrics.stability import busy_at_low_load, stability_note

BUSY = {"seed": 3, "service": {"kind": "linear", "base_ms": 2.0, "per_item_ms": 0.1},
        "workload": {"kind": "poisson", "rate_rps": 1500, "n_requests": 20_000},
        "policy": {"kind": "greedy", "max_batch_size": 32}, "warmup_s": 1}


def test_a_busy_device_at_low_load_is_described_as_such_not_as_saturated() -> None:
    summary = sim.run(BUSY).summary
    # the verdict itself is unchanged (the summary's fields are a contract) ...
    assert summary["stability"]["verdict"] == "saturated"
    assert summary["utilization"] >= 0.95 and summary["stability"]["rho_offered"] < 0.5
    # ... but what a person reads says what happens: small batches keep the device busy
    assert busy_at_low_load(summary)
    level, text = stability_note(summary)  # type: ignore[misc]
    assert level == "note" and "not saturated" in text and "busy" in text
    assert not text.startswith("saturated")


def test_near_capacity_is_still_called_saturated() -> None:
    near = {**BUSY, "service": {"kind": "constant", "ms": 1.0},
            "workload": {"kind": "constant", "rate_rps": 980, "n_requests": 20_000},
            "policy": {"kind": "none"}}
    summary = sim.run(near).summary
    assert summary["stability"]["verdict"] == "saturated"
    assert not busy_at_low_load(summary)
    level, text = stability_note(summary)  # type: ignore[misc]
    assert level == "warning" and text.startswith("saturated")


def test_full_batches_on_a_busy_device_are_the_limit_whatever_the_capacity_estimate() -> None:
    summary = sim.run(BUSY).summary
    summary["batch_utilization"] = 0.99  # e.g. a live device slower than its profile
    assert not busy_at_low_load(summary)
    assert stability_note(summary)[0] == "warning"  # type: ignore[index]
