"""Plotly HTML reports for profiles: latency, throughput and per-item cost vs batch size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from calibration.profile import LatencyProfile

# Okabe-Ito: distinguishable with the common colour-vision deficiencies
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442"]


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def profile_figure(profiles: Sequence[LatencyProfile], labels: Sequence[str] | None = None
                   ) -> go.Figure:
    """Three panels: latency (median, p5–p95 band), throughput, per-item cost."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "batch latency (ms)", "throughput (items/s)", "cost per item (ms)"))
    names = list(labels) if labels else [p.name for p in profiles]
    for i, (profile, name) in enumerate(zip(profiles, names, strict=True)):
        colour = PALETTE[i % len(PALETTE)]
        sizes = np.array(profile.batch_sizes, dtype=float)
        samples = [profile.samples_s[int(b)] * 1e3 for b in sizes]
        med = np.array([np.median(s) for s in samples])
        p5 = np.array([np.quantile(s, 0.05) for s in samples])
        p95 = np.array([np.quantile(s, 0.95) for s in samples])
        fig.add_trace(go.Scatter(x=np.concatenate([sizes, sizes[::-1]]),
                                 y=np.concatenate([p95, p5[::-1]]), fill="toself",
                                 fillcolor=_rgba(colour, 0.2), line={"width": 0},
                                 name=f"{name} p5–p95", hoverinfo="skip", legendgroup=name),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=sizes, y=med, mode="lines+markers", name=f"{name} median",
                                 line={"color": colour}, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=sizes, y=sizes / (med / 1e3), mode="lines+markers",
                                 line={"color": colour}, showlegend=False, legendgroup=name,
                                 name=name), row=1, col=2)
        fig.add_trace(go.Scatter(x=sizes, y=med / sizes, mode="lines+markers",
                                 line={"color": colour}, showlegend=False, legendgroup=name,
                                 name=name), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="batch size (items)", row=1, col=col)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="items/s", row=1, col=2)
    fig.update_yaxes(title_text="ms per item", row=1, col=3)
    fig.update_layout(height=430, template="plotly_white", legend={"orientation": "h", "y": -0.2},
                      title=" vs ".join(names))
    return fig


def write_report(profiles: Sequence[LatencyProfile], path: str | Path,
                 labels: Sequence[str] | None = None) -> Path:
    """Write the HTML report (plotly.js from a CDN is avoided: the file is self-contained)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = profile_figure(profiles, labels)
    meta_lines = []
    for p in profiles:
        m = p.meta
        meta_lines.append(
            f"<li><b>{p.name}</b>: device {p.device}, dtype {m.get('dtype')}, threads "
            f"{m.get('threads')}, torch {m.get('torch_version')}, host {m.get('host')}, "
            f"{m.get('created_at')}; fit {m.get('fit', {}).get('kind', '–')} "
            f"(R² {m.get('fit', {}).get('r2', float('nan')):.4f})"
            f"{' — SYNTHETIC' if m.get('synthetic') else ''}</li>")
    html = fig.to_html(full_html=False, include_plotlyjs=True)
    out.write_text("<html><head><meta charset='utf-8'><title>servelab profile</title></head>"
                   f"<body><h2>servelab latency profile</h2><ul>{''.join(meta_lines)}</ul>"
                   f"{html}</body></html>")
    return out
