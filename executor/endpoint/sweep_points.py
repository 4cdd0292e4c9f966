"""The load sweep of ``compare --endpoint --sweep`` (LLM and request-level): one comparison
per target load ρ in ``rho-R/``, and every point's rows in ``fidelity.csv`` /
``fidelity.json``, which the Verify page reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import UserError
from sim.metrics.rundir import write_json

# a point: (ρ, its directory) -> (the fields its rows start with, its compare.json data)
Point = Callable[[float, Path], tuple[dict[str, Any], dict[str, Any]]]


def check_loads(rhos: Sequence[float], max_rho: float) -> None:
    """Raise a one-line :class:`UserError` for no load or a load outside ``(0, max_rho)``
    (callers check before any costly set-up).
    """
    if not rhos:
        raise UserError("--sweep: give at least one load, e.g. 0.3,0.6,0.8")
    for rho in rhos:
        if not (math.isfinite(rho) and 0 < rho < max_rho):
            raise UserError(f"--sweep rho={rho:g}: must lie in (0, {max_rho:g})")


def sweep_loads(rhos: Sequence[float], max_rho: float, out_dir: str | Path, point: Point,
                meta: dict[str, Any]) -> pd.DataFrame:
    """Run ``point`` at each load (checked by :func:`check_loads`), write ``fidelity.csv``
    and ``fidelity.json`` (``meta`` and the rows) and return the rows.
    """
    check_loads(rhos, max_rho)
    out = Path(out_dir)
    rows: list[dict[str, Any]] = []
    for rho in rhos:
        fields, data = point(rho, out / f"rho-{rho:g}")
        rows += [{"target_rho": rho, **fields, "offered_rps": data["offered_rps"], **row}
                 for row in data["rows"]]
    frame = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "fidelity.csv", index=False)
    write_json(out / "fidelity.json", {**meta, "rows": rows})
    return frame
