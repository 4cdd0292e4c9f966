"""Regenerate the shipped synthetic multi-turn chat trace
``servelab/data/synthetic_chat_blksz_16.jsonl`` (seed 32; Bailian format, synthetic).

Run: ``python -m benchmarks.make_synthetic_chat``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from sim.scenario.synthetic_chat import synthetic_chat_trace, write_jsonl

SEED = 32


def main() -> None:
    """Write the trace and print its size."""
    rows = synthetic_chat_trace(np.random.default_rng(SEED), sessions=400)
    path = Path(str(resources.files("servelab") / "data" / "synthetic_chat_blksz_16.jsonl"))
    write_jsonl(rows, path)
    print(f"{len(rows)} requests -> {path}")


if __name__ == "__main__":
    main()
