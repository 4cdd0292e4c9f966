"""The device probe keeps to its time budget, with stand-in runners whose timing is known."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from calibration.profile import LatencyProfile
from executor.probe import _saturated, probe
from executor.testing import SleepRunner, precise_sleep

SIZES = [1, 2, 4, 8, 16]


def linear_ms(n: float) -> float:
    return 6.0 + 1.5 * n


def make_profile(cold: bool = False) -> LatencyProfile:
    """Samples within ±1% of 6 + 1.5 n ms; with ``cold``, size 1 also measured after idling."""
    rng = np.random.default_rng(0)
    return LatencyProfile(
        samples_s={b: linear_ms(b) / 1e3 * rng.uniform(0.99, 1.01, 40) for b in SIZES},
        cold_samples_s={1: 1.2 * linear_ms(1) / 1e3 * rng.uniform(0.99, 1.01, 20)}
        if cold else {},
        model={"name": "sleep"}, device={"kind": "cpu", "name": "cpu"},
        meta={"threads": 1, "cold": {"idle_ms": 40.0}} if cold else {"threads": 1})


class SlowPayloads(SleepRunner):
    """A stand-in whose payload preparation (outside the model call, inside each batch's
    dispatch interval) takes ``prep_s`` per batch: what the probe's old plan left out.
    """

    def __init__(self, prep_s: float) -> None:
        super().__init__(lambda n: 1.3 * linear_ms(n) / 1e3)
        self.prep_s = prep_s

    def payloads(self, n: int, rng: np.random.Generator) -> Sequence[Any]:
        precise_sleep(self.prep_s)
        return [None] * n


def _late_s(runner: SleepRunner, first: int) -> float:
    """How much longer than the median of their size the calls from ``first`` on took, in
    all (s): the lateness a loaded machine added to the probe's batches beyond the typical
    batch its plan is learned from."""
    took = np.asarray(runner.took_s[first:])
    sizes = np.asarray(runner.sizes[first:])
    return float(sum(np.clip(took[sizes == n] - np.median(took[sizes == n]), 0, None).sum()
                     for n in np.unique(sizes)))


def start_up_s(runner: SleepRunner) -> float:
    """What one short live run costs on this machine now beyond its batches' sleeps."""
    began = time.perf_counter()
    before = len(runner.took_s)
    _saturated(runner, 1, 3, seed=0)
    return time.perf_counter() - began - sum(runner.took_s[before:])


@pytest.mark.parametrize(("runner", "cold"), [
    (SleepRunner(lambda n: 1.3 * linear_ms(n) / 1e3), False),
    (SlowPayloads(prep_s=0.012), False),
    (SleepRunner(lambda n: 1.3 * linear_ms(n) / 1e3), True),
], ids=["sleep", "slow-payloads", "cold"])
@pytest.mark.parametrize("budget_s", [0.6, 1.5])
def test_probe_keeps_to_its_budget(runner: SleepRunner, cold: bool, budget_s: float) -> None:
    prof = make_profile(cold)
    before_s = start_up_s(runner)  # this machine's live-run start-up, measured now
    first = len(runner.took_s)
    result = probe(runner, prof, SIZES, budget_s=budget_s)
    late_s = _late_s(runner, first)
    after_s = start_up_s(runner)  # and again once the probe is done
    # within the budget, give or take one live run's start-up measured in this same test,
    # just before and just after the probe (the plan's estimate of it comes from the
    # probe's first timing; a loaded machine varies it between the two: the larger of
    # the two measurements brackets it), and the time the probe's own batches ran past
    # what the plan, learned from typical batches, expected of them (late_s: a loaded
    # machine wakes a sleep late; on a loaded run the probe overran budget + start-up by
    # 16 ms). A plan that left the start-up out overruns by one per size run (5 sizes: 5
    # x ~17 ms), caught wherever the batches' lateness stays below that
    print(f"probe budget {budget_s} s: wall {result.wall_s:.4f} s, start-up "
          f"{max(before_s, after_s) * 1e3:.1f} ms, batches late {late_s * 1e3:.1f} ms")
    assert result.wall_s <= budget_s + max(before_s, after_s) + late_s, (
        result.wall_s, before_s, after_s, late_s)
    # and it used the budget: the smallest size ran (it always does: the size a light load
    # dispatches most; each size has its own scale, the sizes left out the nearest one's)
    assert min(SIZES) in result.model_median_s
    assert result.budget_s == budget_s
    assert result.to_dict()["budget_s"] == budget_s
    if budget_s >= 1.5:  # room for more than the minimum: more sizes, more batches
        assert len(result.model_median_s) >= 2
        assert sum(result.reps.values()) >= 16
        if cold:
            assert result.cold_reps >= 3


def test_a_budget_below_one_first_timing_runs_the_minimum_only() -> None:
    runner = SleepRunner(lambda n: 1.3 * linear_ms(n) / 1e3)
    result = probe(runner, make_profile(), SIZES, budget_s=0.01)
    # the first timing and one run of 3 timed batches of the smallest size: nothing more
    assert list(result.model_median_s) == [1]
    assert result.reps[1] == 3
    assert runner.calls == 3 + 5
