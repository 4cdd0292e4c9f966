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
    if summary.get("kind") == "llm":
        return llm_summary_table(summary, title)
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right", no_wrap=True)  # numbers are never cut
    rows = [
        ("requests (in window)", summary["requests"]),
        ("ok / rejected / timed out / dropped / failed",
         " / ".join(_fmt(summary[k]) for k in ("ok", "rejected", "timed_out", "dropped",
                                               "failed"))),
        ("offered (req/s)", summary["offered_rps"]),
        ("throughput: completions in the window (req/s)", summary["throughput_rps"]),
        ("goodput (req/s)", "no SLO set" if summary["goodput_rps"] is None
         else summary["goodput_rps"]),
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
    if "replicas" in summary:  # an autoscaled run
        reps = summary["replicas"]
        rows += [("replica-seconds", summary["replica_seconds"]),
                 ("replicas mean / min / max",
                  f"{_fmt(reps['mean'])} / {reps['min']} / {reps['max']}"),
                 ("cold starts (median s)",
                  f"{summary['cold_starts']} ({_fmt(summary['cold_start_s']['p50'])})"),
                 ("requests that waited on a cold start", summary["cold_start_waits"])]
    for name, value in rows:
        table.add_row(name, _fmt(value, 3 if isinstance(value, float) and value < 10 else 1))
    censored = int(summary.get("censored") or 0)
    for key, label in (("latency_ms", "latency"), ("queue_ms", "queue wait"),
                       ("service_ms", "service")):
        stats = summary[key]
        bound = " (lower bounds)" if censored and "censored" in stats else ""
        table.add_row(f"{label} ms mean / p50 / p99 / max{bound}",
                      " / ".join(_fmt(stats[k]) for k in ("mean", "p50", "p99", "max")))
    if censored:
        table.add_row("censored (unfinished when the run stopped)", _fmt(censored))
    stability = summary.get("stability") or {}
    if stability:
        from sim.metrics.stability import busy_at_low_load

        word = "busy at low load" if busy_at_low_load(summary) else stability["verdict"]
        table.add_row("stability", f"{word} (offered/capacity "
                      f"{_fmt(stability['rho_offered'])})")
    return table


def llm_summary_table(summary: dict[str, Any], title: str = "summary") -> Table:
    """An LLM run: counts, request and token throughput, then TTFT/TPOT/ITL/E2E in ms."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right", no_wrap=True)  # numbers are never cut
    rows: list[tuple[str, Any]] = [
        ("requests (in window)", summary["requests"]),
        ("ok / rejected / failed / in flight",
         " / ".join(_fmt(summary[k]) for k in ("ok", "rejected", "failed", "in_flight"))),
        ("offered (req/s)", summary["offered_rps"]),
        ("throughput: completions in the window (req/s)", summary["throughput_rps"]),
        ("input tokens/s (of the completions)", summary["input_tokens_per_s"]),
        ("output tokens/s (produced in the window)", summary["output_tokens_per_s"]),
        ("goodput (req/s, every SLO met)", "no SLO set" if summary["goodput_rps"] is None
         else summary["goodput_rps"]),
        ("preemptions / recomputed tokens",
         f"{_fmt(summary['preemptions'])} / {_fmt(summary['recomputed_tokens'])}"),
        ("tokens per step mean / p99",
         " / ".join(_fmt(summary["tokens_per_step"][k]) for k in ("mean", "p99"))),
        ("sequences per step mean / max",
         " / ".join(_fmt(summary["seqs_per_step"][k]) for k in ("mean", "max"))),
        ("KV cache utilisation mean / max",
         " / ".join(_fmt(summary["kv_cache_utilization"][k]) for k in ("mean", "max"))),
        ("device utilisation", summary["utilization"]),
        ("waiting queue mean / p95 / max",
         " / ".join(_fmt(summary["queue_len"][k]) for k in ("mean", "p95", "max"))),
    ]
    pc = summary.get("prefix_cache")
    if pc:  # prefix caching on
        rows.append(("prefix cache hit rate (tokens) / prefill tokens saved / evictions",
                     f"{100 * pc['hit_rate']:.1f}% / {_fmt(pc['prefill_tokens_saved'])} / "
                     f"{_fmt(pc['evictions'])}"))
    for name, value in rows:
        table.add_row(name, _fmt(value, 3 if isinstance(value, float) and value < 10 else 1))
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                       ("e2e_ms", "E2E")):
        stats = summary[key]
        table.add_row(f"{label} ms mean / p50 / p99 / max",
                      " / ".join(_fmt(stats[k]) for k in ("mean", "p50", "p99", "max")))
    if summary.get("censored"):
        table.add_row("censored (unfinished when the run stopped)", _fmt(summary["censored"]))
    stability = summary.get("stability") or {}
    if stability:
        table.add_row("stability", str(stability["verdict"]))
    return table
