"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
AZURE_TRACE = REPO / "examples" / "data" / "azure_llm_2023_conv.csv"


def scenario(**overrides: Any) -> dict[str, Any]:
    """A small valid scenario dict; keyword arguments replace whole sections."""
    base: dict[str, Any] = {
        "name": "test",
        "seed": 3,
        "service": {"kind": "constant", "ms": 10},
        "workload": {"kind": "poisson", "rate_rps": 50, "n_requests": 500},
        "policy": {"kind": "none"},
    }
    base.update(overrides)
    return base


@pytest.fixture
def small_scenario() -> dict[str, Any]:
    return scenario()
