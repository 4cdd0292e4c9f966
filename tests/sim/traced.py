"""Peak traced memory of a simulator run (the memory tests of the lean record modes)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import sim


def peak_traced_bytes(cfg: dict[str, Any], records: str) -> int:
    """The peak of Python-traced allocations (numpy's included) while ``sim.run`` runs."""
    tracemalloc.start()
    try:
        sim.run(cfg, records=records)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
