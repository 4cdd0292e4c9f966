"""Fixtures for the calibration tests: a fake runner (no torch) and torch (skips without)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from calibration.model_runners import InfeasibleBatch


class FakeRunner:
    """Sleeps nothing; records the sizes it was asked to run; fails above a size."""

    name = "fake"
    device = "cpu"

    def __init__(self, oom_at: int | None = None, interrupt_after: int | None = None) -> None:
        self.oom_at, self.interrupt_after = oom_at, interrupt_after
        self.calls: list[int] = []

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        return [0] * n

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        n = len(payloads)
        if self.oom_at is not None and n >= self.oom_at:
            raise InfeasibleBatch(f"CUDA out of memory at {n}")
        self.calls.append(n)
        if self.interrupt_after is not None and len(self.calls) > self.interrupt_after:
            raise KeyboardInterrupt
        return None

    def describe(self) -> dict[str, Any]:
        return {"model": {"name": "fake"}, "device": {"kind": "cpu", "name": "cpu"},
                "dtype": "fp32", "threads": 1}


@pytest.fixture
def fake_runner() -> Callable[..., FakeRunner]:
    """Builds a :class:`FakeRunner` (``oom_at``, ``interrupt_after``)."""
    return FakeRunner


@pytest.fixture
def torch() -> Any:
    """The torch module; the test is skipped where torch is not installed."""
    return pytest.importorskip("torch")
