"""Terminal rendering of run summaries (rich tables)."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def summary_table(summary: dict[str, Any], title: str = "summary") -> Table:
    """A two-part table: counts and rates, then latency percentiles in ms."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests (in window)", summary["requests"]),
        ("ok / rejected / timed out / dropped / failed",
         " / ".join(_fmt(summary[k]) for k in ("ok", "rejected", "timed_out", "dropped",
                                               "failed"))),
        ("throughput (req/s)", summary["throughput_rps"]),
        ("goodput (req/s)", summary["goodput_rps"]),
        ("error rate", summary["error_rate"]),
        ("mean batch size", summary["mean_batch_size"]),
        ("batch utilisation", summary["batch_utilization"]),
        ("device utilisation", summary["utilization"]),
        ("queue length mean / p95 / max",
         " / ".join(_fmt(summary["queue_len"][k]) for k in ("mean", "p95", "max"))),
    ]
    if summary.get("cost_per_million_usd") is not None and math.isfinite(
            summary.get("cost_per_million_usd") or math.nan):
        rows.append(("cost per million requests (USD)", summary["cost_per_million_usd"]))
    for name, value in rows:
        table.add_row(name, _fmt(value, 3 if isinstance(value, float) and value < 10 else 1))
    for key, label in (("latency_ms", "latency"), ("queue_ms", "queue wait"),
                       ("service_ms", "service")):
        stats = summary[key]
        table.add_row(f"{label} ms mean / p50 / p99 / max",
                      " / ".join(_fmt(stats[k]) for k in ("mean", "p50", "p99", "max")))
    return table
