"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
AZURE_TRACE = REPO / "servelab" / "data" / "azure_llm_2023_conv.csv"


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


@dataclass
class Want:
    """An autoscaler that wants whatever the test sets (for fleet tests)."""

    n: int
    initial_replicas: int = 1

    def desired(self, view: Any) -> int:
        return self.n


@pytest.fixture
def small_scenario() -> dict[str, Any]:
    return scenario()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device is present."""
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_main_module() -> Iterator[None]:
    """Give every test the real ``__main__`` back afterwards.

    Streamlit's script runner (the dashboard tests, and the Verify page run at the end of
    ``test_llm_live.py``'s sweep test) installs its page module as ``sys.modules["__main__"]``
    and never puts the real one back. multiprocessing's spawn re-runs ``__main__``'s file in
    each child, so a later test that spawns workers (dask's LocalCluster) re-ran the page
    there and failed ("Nanny failed to start worker process").
    """
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main
