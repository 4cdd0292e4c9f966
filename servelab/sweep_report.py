"""HTML report of a sweep: latency–throughput curves, Pareto front, P99 heatmap."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from calibration.report import PALETTE
from sim.experiments.sweep import pareto


def sweep_figure(frame: pd.DataFrame, knobs: Sequence[str]) -> go.Figure:
    """Three panels: P99 vs throughput (one curve per value of the first knob), the Pareto
    front, and a heatmap of P99 over the first two knobs (seed means). LLM sweeps use the
    end-to-end P99 (``e2e_ms.p99``).
    """
    ok = frame[frame["error"] == ""] if "error" in frame else frame
    y = "latency_ms.p99" if "latency_ms.p99" in frame else "e2e_ms.p99"  # LLM runs: E2E
    if ok.empty or y not in ok or "throughput_rps" not in ok:
        fig = go.Figure()
        fig.add_annotation(text="no run succeeded: nothing to plot (see the error column)",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(height=200, template="plotly_white")
        return fig
    means = ok.groupby(list(knobs), dropna=False).mean(numeric_only=True).reset_index() \
        if knobs else ok.mean(numeric_only=True).to_frame().T
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "P99 latency vs throughput", "Pareto front (throughput ↑, P99 ↓)",
        "P99 latency (ms) over two knobs"))
    group_knob = knobs[0] if knobs else None
    x_knob = knobs[1] if len(knobs) > 1 else None
    groups = means.groupby(group_knob) if group_knob else [("all", means)]
    for i, (value, g) in enumerate(groups):
        g = g.sort_values(x_knob or "throughput_rps")
        fig.add_trace(go.Scatter(x=g["throughput_rps"], y=g[y],
                                 mode="lines+markers", name=f"{group_knob}={value!s}",
                                 line={"color": PALETTE[i % len(PALETTE)]}), row=1, col=1)
    front = pareto(means, y=y)
    fig.add_trace(go.Scatter(x=means["throughput_rps"], y=means[y],
                             mode="markers", name="all configs", marker={"color": "#999999"},
                             text=[", ".join(f"{k}={r[k]}" for k in knobs)
                                   for _, r in means.iterrows()]), row=1, col=2)
    fig.add_trace(go.Scatter(x=front["throughput_rps"], y=front[y],
                             mode="lines+markers", name="Pareto front",
                             line={"color": PALETTE[3]}), row=1, col=2)
    if len(knobs) >= 2:
        table = means.pivot_table(index=knobs[0], columns=knobs[1], values=y)
        fig.add_trace(go.Heatmap(z=table.to_numpy(), x=[str(c) for c in table.columns],
                                 y=[str(i) for i in table.index], colorscale="Viridis",
                                 colorbar={"title": "P99 ms", "x": 1.02}), row=1, col=3)
        fig.update_xaxes(title_text=knobs[1], row=1, col=3)
        fig.update_yaxes(title_text=knobs[0], row=1, col=3)
    for col in (1, 2):
        fig.update_xaxes(title_text="throughput (req/s)", row=1, col=col)
        fig.update_yaxes(title_text=f"{y} (ms)", type="log", row=1, col=col)
    fig.update_layout(height=460, template="plotly_white", legend={"orientation": "h",
                                                                   "y": -0.25})
    return fig


def write_sweep_report(frame: pd.DataFrame, knobs: Sequence[str], path: str | Path) -> Path:
    """Write the self-contained HTML report."""
    out = Path(path)
    html = sweep_figure(frame, knobs).to_html(full_html=False, include_plotlyjs=True)
    failed = int((frame["error"] != "").sum()) if "error" in frame else 0
    out.write_text("<html><head><meta charset='utf-8'><title>servelab sweep</title></head>"
                   f"<body><h2>servelab sweep: {len(frame)} runs, {failed} failed</h2>"
                   f"<p>knobs: {', '.join(knobs) or '–'}; points are means over seeds.</p>"
                   f"{html}</body></html>")
    return out
