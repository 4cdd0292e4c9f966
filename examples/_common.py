"""Helpers shared by the examples: printing a table and the quick (test-sized) switch."""

from __future__ import annotations

import sys

import pandas as pd
from rich.console import Console
from rich.table import Table


def quick_from_argv() -> bool:
    """``--quick`` on the command line runs a reduced version (what the tests run)."""
    return "--quick" in sys.argv


def show(frame: pd.DataFrame, title: str, digits: int = 2) -> None:
    """Print a DataFrame as a rich table."""
    table = Table(title=title)
    for col in frame.columns:
        table.add_column(str(col), justify="right")
    for _, row in frame.iterrows():
        table.add_row(*[f"{v:,.{digits}f}" if isinstance(v, float) else str(v) for v in row])
    Console().print(table)
