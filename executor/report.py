"""HTML report of a sim-vs-live comparison (Plotly overlays and the error table)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from calibration.report import PALETTE
from sim.metrics.rundir import Result
from sim.metrics.summary import ok_latency_s


def _cdf(result: Result) -> tuple[np.ndarray, np.ndarray]:
    lat = np.sort(ok_latency_s(result.requests, result.scenario.warmup_s) * 1e3)
    return lat, np.arange(1, lat.size + 1) / max(lat.size, 1)


def compare_figure(simulated: Result, lives: Sequence[Result]) -> go.Figure:
    """Latency CDFs, batch-size histograms and queue length over time, sim vs live."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "latency CDF", "batch sizes", "queue length over time"))
    runs = [("sim", simulated, PALETTE[0])] + [
        (f"live {i + 1}", r, PALETTE[(i + 1) % len(PALETTE)]) for i, r in enumerate(lives)]
    for name, result, colour in runs:
        x, y = _cdf(result)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, legendgroup=name,
                                 line={"color": colour, "dash": "solid" if name == "sim"
                                       else "dot"}), row=1, col=1)
        sizes = result.batches["size"].value_counts(normalize=True).sort_index()
        fig.add_trace(go.Bar(x=sizes.index, y=sizes.to_numpy(), name=name, legendgroup=name,
                             marker_color=colour, showlegend=False), row=1, col=2)
        q = result.queue.sort_values("time_s")
        fig.add_trace(go.Scatter(x=q["time_s"], y=q["length"], mode="lines", line_shape="hv",
                                 name=name, legendgroup=name, showlegend=False,
                                 line={"color": colour, "width": 1}), row=1, col=3)
    fig.update_xaxes(title_text="latency (ms)", row=1, col=1)
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    fig.update_xaxes(title_text="batch size (requests)", row=1, col=2)
    fig.update_yaxes(title_text="fraction of batches", row=1, col=2)
    fig.update_xaxes(title_text="time (s)", row=1, col=3)
    fig.update_yaxes(title_text="queued requests", row=1, col=3)
    fig.update_layout(barmode="group", height=450, template="plotly_white",
                      legend={"orientation": "h", "y": -0.25})
    return fig


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "–" if not math.isfinite(v) else f"{v:,.4g}"
    return str(v)


def write_compare_report(path: str | Path, simulated: Result, lives: Sequence[Result],
                         rows: Sequence[dict[str, Any]]) -> Path:
    """Write the self-contained HTML report."""
    header = ("<tr><th>metric</th><th>sim</th><th>live (median)</th><th>error</th>"
              "<th>live min–max</th><th>within spread</th></tr>")
    body = "".join(
        f"<tr><td>{r['label']}</td><td>{_fmt(r['sim'])}</td><td>{_fmt(r['live_median'])}</td>"
        f"<td>{_fmt(100 * r['rel_error'])}%</td><td>{_fmt(r['live_min'])}–"
        f"{_fmt(r['live_max'])}</td><td>{'yes' if r['within_spread'] else 'no'}</td></tr>"
        for r in rows)
    rho = rows[0]["rho"] if rows else math.nan
    html = compare_figure(simulated, lives).to_html(full_html=False, include_plotlyjs=True)
    out = Path(path)
    out.write_text(
        "<html><head><meta charset='utf-8'><title>servelab compare</title>"
        "<style>td,th{padding:2px 8px;text-align:right}</style></head><body>"
        f"<h2>sim vs live: {simulated.scenario.name}</h2><p>ρ (simulated utilisation) = "
        f"{_fmt(rho)}; {len(lives)} live runs on {lives[0].meta.get('device')}</p>"
        f"<table>{header}{body}</table>{html}</body></html>")
    return out
