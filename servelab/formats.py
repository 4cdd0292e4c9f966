"""Table formats of a run directory: ``--format csv`` rewrites its Parquet tables as CSV."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def tables_to_csv(run_dir: Path) -> list[Path]:
    """Rewrite every ``*.parquet`` table of ``run_dir`` as ``*.csv`` (same columns, same rows;
    categoricals as their labels) and remove the Parquet file; return the CSV paths.
    """
    written: list[Path] = []
    for path in sorted(Path(run_dir).glob("*.parquet")):
        target = path.with_suffix(".csv")
        pd.read_parquet(path).to_csv(target, index=False)
        path.unlink()
        written.append(target)
    return written
