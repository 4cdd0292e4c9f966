"""The same seed gives the same output as the committed golden file (``tests/sim/golden.py``):
tables and summaries of a dozen scenarios over every policy, discipline, router and the
autoscalers. A speed-up must keep them exactly.
"""

from __future__ import annotations

import json

import pytest

from tests.sim.golden import GOLDEN, SCENARIOS, outputs

EXPECTED = json.loads(GOLDEN.read_text())


def test_the_golden_file_covers_every_scenario() -> None:
    assert set(EXPECTED) == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_seed_same_output_as_the_golden_file(name: str) -> None:
    got, want = outputs(SCENARIOS[name]), EXPECTED[name]
    changed = sorted(k for k in set(got["summary"]) | set(want["summary"])
                     if got["summary"].get(k) != want["summary"].get(k))
    assert not changed, {k: (want["summary"].get(k), got["summary"].get(k))
                         for k in changed[:8]}
    for table in ("requests", "batches", "queue", "replicas"):
        assert got.get(table) == want.get(table), f"{name}: {table} table changed"
