"""Plotly figures for the dashboard (pure functions of results; no streamlit here).

Units in every axis title; the Okabe-Ito palette (colour-blind safe); figures use the
``plotly`` template so they read in light and dark themes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from calibration.report import PALETTE
from sim.metrics.rundir import Result
from sim.metrics.summary import ok_latency_s

TEMPLATE = "plotly"


def themed(fig: go.Figure) -> go.Figure:
    """Give ``fig`` the :data:`TEMPLATE` without plotly validating the template's ~2,000
    properties again (45 ms a figure, most of a dashboard rerun; plotly sets its default
    template the same way when it builds a figure).
    """
    layout = fig.layout
    layout._validate = False  # plotly's own switch, restored below
    try:
        layout.template = pio.templates[TEMPLATE]
    finally:
        layout._validate = True
    return fig


CDF_POINTS = 500  # a CDF drawn through this many quantiles looks the same, and sends less
QUEUE_POINTS = 2000  # the most queue steps a figure draws (beyond: the maximum per time bin)
STEP_POINTS = 1000  # time bins of the LLM step series (beyond: the maximum per bin)


def peak_per_bin(time_s: np.ndarray, series: Sequence[np.ndarray], bins: int
                 ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Step series sampled at sorted ``time_s`` reduced to ``bins`` equal time bins: each
    bin's maximum (a bin without a change holds the value of the last change before it), so
    a figure sends a bounded number of points and still shows every peak.
    """
    edges = np.linspace(time_s[0], time_s[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, time_s, side="right") - 1, 0, bins - 1)
    last = np.maximum(np.searchsorted(time_s, edges[:-1], side="right") - 1, 0)
    out = []
    for values in series:
        v = np.asarray(values, dtype=float)
        peak = np.full(bins, -np.inf)
        np.maximum.at(peak, which, v)
        out.append(np.where(np.isfinite(peak), peak, v[last]))
    return edges[:-1], out


def _ok_latency_ms(result: Result) -> np.ndarray:
    return np.sort(ok_latency_s(result.requests, result.scenario.warmup_s) * 1e3)


def cdf_points(sorted_ms: np.ndarray, points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of an empirical CDF through at most ``points`` + 1 of its samples (evenly
    spaced ranks, the smallest and the largest always among them).
    """
    n = sorted_ms.size
    if n <= points:
        return sorted_ms, np.arange(1, n + 1) / max(n, 1)
    ranks = np.unique(np.linspace(0, n - 1, points + 1).round().astype(int))
    return sorted_ms[ranks], (ranks + 1) / n


def _nice_step(top: float, ticks: int = 5) -> int:
    """A whole tick step (1, 2, 5 × 10^k) giving about ``ticks`` ticks up to ``top``."""
    raw = max(top, 1.0) / ticks
    power = 10 ** int(np.floor(np.log10(raw)))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return int(max(1, m * power))
    return int(max(1, 10 * power))


def legend_below(fig: go.Figure, entries: int) -> go.Figure:
    """Put the legend under the plot and grow the figure by its rows, so long names never
    squash the plotting area (one entry per row).
    """
    extra = 22 * entries
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.22,
                              "xanchor": "left", "x": 0},
                      height=int((fig.layout.height or 350) + extra),
                      margin={"b": 80 + extra})
    return fig


def latency_cdf(results: Mapping[str, Result]) -> go.Figure:
    """Latency CDFs of one or more runs."""
    fig = go.Figure()
    for i, (name, result) in enumerate(results.items()):
        x, y = cdf_points(_ok_latency_ms(result))
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name,
                                 line={"color": PALETTE[i % len(PALETTE)]}))
    themed(fig).update_layout(title="latency CDF", xaxis_title="latency (ms)",
                      yaxis_title="fraction of requests", height=350)
    return legend_below(fig, len(results)) if len(results) > 1 else fig


def percentile_bars(results: Mapping[str, Result]) -> go.Figure:
    """Mean, P50, P95, P99 latency per run."""
    fig = go.Figure()
    keys = ["mean", "p50", "p95", "p99"]
    for i, (name, result) in enumerate(results.items()):
        lat = result.summary["latency_ms"]
        fig.add_trace(go.Bar(x=keys, y=[lat[k] for k in keys], name=name,
                             marker_color=PALETTE[i % len(PALETTE)]))
    themed(fig).update_layout(title="latency percentiles", barmode="group",
                      yaxis_title="latency (ms)", height=350)
    return legend_below(fig, len(results)) if len(results) > 1 else fig


def queue_over_time(result: Result) -> go.Figure:
    """Total queue length over time (step function)."""
    q = result.queue.sort_values("time_s", kind="stable")
    delta = q.groupby("queue")["length"].diff().fillna(q["length"])
    time_s, length = q["time_s"].to_numpy(), np.cumsum(delta.to_numpy())
    title = "queue length over time"
    if time_s.size > QUEUE_POINTS:  # the maximum per bin keeps every peak visible
        time_s, (length,) = peak_per_bin(time_s, [length], QUEUE_POINTS // 2)
        title = "queue length over time (maximum per bin)"
    fig = go.Figure(go.Scatter(x=time_s, y=length, mode="lines",
                               line_shape="hv", line={"color": PALETTE[0], "width": 1}))
    themed(fig).update_layout(title=title, xaxis_title="time (s)",
                      yaxis_title="queued requests", height=300)
    return fig


def batch_histogram(result: Result) -> go.Figure:
    """How often each batch size was dispatched."""
    counts = result.batches["size"].value_counts().sort_index()
    fig = go.Figure(go.Bar(x=counts.index, y=counts.to_numpy(), marker_color=PALETTE[1]))
    themed(fig).update_layout(title="batch sizes", xaxis_title="batch size (requests)",
                      yaxis_title="batches", height=300)
    return fig


def replica_utilization(result: Result) -> go.Figure:
    """Busy fraction of each replica."""
    util = result.summary["utilization_per_replica"]
    fig = go.Figure(go.Bar(x=[f"replica {i}" for i in range(len(util))], y=util,
                           marker_color=PALETTE[2]))
    themed(fig).update_layout(title="device utilisation per replica",
                      yaxis_title="busy fraction", yaxis_range=[0, 1], height=300)
    return fig


def latency_split(result: Result) -> go.Figure:
    """Where the time goes: queue wait vs service, at mean, P50 and P99."""
    s = result.summary
    keys = ["mean", "p50", "p99"]
    fig = go.Figure([
        go.Bar(x=keys, y=[s["queue_ms"][k] for k in keys], name="queue wait",
               marker_color=PALETTE[3]),
        go.Bar(x=keys, y=[s["service_ms"][k] for k in keys], name="service",
               marker_color=PALETTE[0]),
    ])
    themed(fig).update_layout(title="latency split (queue wait vs service)",
                      barmode="stack", yaxis_title="ms", height=300)
    return fig


def class_table(summary: Mapping[str, Any],
                classes: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per request class: its SLO and priority (from ``classes``), requests,
    throughput, goodput, P50/P99 and error rate, so EDF and priorities can be seen to matter
    (and starvation shows as a class whose P99 or error rate runs away).
    """
    config = {str(c.get("name")): c for c in classes}
    rows = []
    for name, cls in (summary.get("classes") or {}).items():
        lat = cls.get("latency_ms") or {}
        cfg = config.get(name, {})
        goodput = cls.get("goodput_rps")
        rows.append({
            "class": name, "priority": cfg.get("priority", 0),
            "SLO (ms)": cfg.get("slo_ms") if cfg.get("slo_ms") is not None else "—",
            "requests": cls.get("requests"),
            "throughput (req/s)": round(float(cls.get("throughput_rps", np.nan)), 2),
            "goodput (req/s)": "no SLO set" if goodput is None else round(float(goodput), 2),
            "P50 (ms)": round(float(lat.get("p50", np.nan)), 1),
            "P99 (ms)": round(float(lat.get("p99", np.nan)), 1),
            "error rate (%)": round(100 * float(cls.get("error_rate", np.nan)), 2),
        })
    return pd.DataFrame(rows)


def knee_index(load: Sequence[float], p99: Sequence[float]) -> int | None:
    """Index of the knee: the first load whose P99 exceeds 3x the lowest load's P99."""
    values = list(p99)
    if not values:
        return None
    base = values[0]
    for i, v in enumerate(values):
        if v > 3 * base:
            return i
    return None


def load_curves(frame: pd.DataFrame, config_col: str = "config") -> go.Figure:
    """Achieved throughput against offered load, and P50/P99 against achieved throughput.

    ``frame`` has one row per (configuration, load): ``offered_rps``, ``throughput_rps``
    (completions in the window), ``latency_ms.p50``, ``latency_ms.p99`` and ``verdict``.
    Throughput flattens at capacity while latency climbs; the knee (× : the first load whose
    P99 exceeds 3× the lightest load's) sits on the achieved curve; unstable runs are drawn
    as hollow red-edged markers, since their percentiles only say how long the run lasted.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "achieved throughput vs offered load", "latency vs achieved throughput"))
    for i, (name, g) in enumerate(frame.groupby(config_col, sort=False)):
        g = g.sort_values("offered_rps")
        colour = PALETTE[i % len(PALETTE)]
        unstable = g.get("verdict", pd.Series("stable", index=g.index)) == "unstable"
        symbols = np.where(unstable, "circle-open", "circle").tolist()
        edge = np.where(unstable, "#D55E00", colour).tolist()
        marker = {"symbol": symbols, "size": 9, "color": colour, "line": {"color": edge,
                                                                          "width": 2}}
        fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["throughput_rps"], name=str(name),
                                 legendgroup=str(name), mode="lines+markers", marker=marker,
                                 line={"color": colour}), row=1, col=1)
        fig.add_trace(go.Scatter(x=g["throughput_rps"], y=g["latency_ms.p99"],
                                 name=f"{name} P99", legendgroup=str(name), showlegend=False,
                                 mode="lines+markers", marker=marker, line={"color": colour}),
                      row=1, col=2)
        fig.add_trace(go.Scatter(x=g["throughput_rps"], y=g["latency_ms.p50"],
                                 name=f"{name} P50", legendgroup=str(name), showlegend=False,
                                 mode="lines", line={"color": colour, "dash": "dot"}),
                      row=1, col=2)
        knee = knee_index(g["throughput_rps"].tolist(), g["latency_ms.p99"].tolist())
        if knee is not None:
            row = g.iloc[knee]
            fig.add_trace(go.Scatter(x=[row["throughput_rps"]], y=[row["latency_ms.p99"]],
                                     mode="markers", marker={"symbol": "x", "size": 14,
                                                             "color": colour},
                                     legendgroup=str(name), name=f"{name} knee"),
                          row=1, col=2)
    top = float(frame["offered_rps"].max()) if len(frame) else 1.0
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="throughput = offered",
                             line={"color": "#999999", "dash": "dash"}), row=1, col=1)
    fig.update_xaxes(title_text="offered load (req/s)", row=1, col=1)
    fig.update_yaxes(title_text="achieved throughput (req/s)", row=1, col=1)
    fig.update_xaxes(title_text="achieved throughput (req/s)", row=1, col=2)
    fig.update_yaxes(title_text="latency P99 (solid), P50 (dotted) (ms)", type="log", row=1,
                     col=2)
    themed(fig).update_layout(height=420)
    return fig


def sweep_row(config: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """One row of a load sweep for :func:`load_curves` and :func:`goodput_curves`."""
    return {"config": config, "offered_rps": summary["offered_rps"],
            "throughput_rps": summary["throughput_rps"],
            "latency_ms.p50": summary["latency_ms"]["p50"],
            "latency_ms.p99": summary["latency_ms"]["p99"],
            "goodput_rps": summary["goodput_rps"],
            "verdict": (summary.get("stability") or {}).get("verdict", "stable")}


def goodput_curves(frame: pd.DataFrame, config_col: str = "config") -> go.Figure:
    """Goodput (ok within the SLO) against offered load per configuration."""
    fig = go.Figure()
    for i, (name, g) in enumerate(frame.groupby(config_col, sort=False)):
        g = g.sort_values("offered_rps")
        fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["goodput_rps"], name=str(name),
                                 mode="lines+markers",
                                 line={"color": PALETTE[i % len(PALETTE)]}))
    top = float(frame["offered_rps"].max()) if len(frame) else 1.0
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="ideal",
                             line={"color": "#999999", "dash": "dash"}))
    themed(fig).update_layout(title="goodput vs offered load",
                      xaxis_title="offered load (req/s)", yaxis_title="goodput (req/s)",
                      height=400)
    return fig


def fidelity_curve(frame: pd.DataFrame) -> go.Figure:
    """Relative error of key metrics against the target load (a ``fidelity.csv``; LLM
    sweeps show TTFT and TPOT, their ρ being offered rate over capacity).
    """
    fig = go.Figure()
    llm = bool((frame["metric"] == "ttft_ms.p50").any())
    metrics = (["throughput_rps", "ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p99"]
               if llm else ["throughput_rps", "latency_ms.p50", "latency_ms.p99",
                            "mean_batch_size"])
    for i, metric in enumerate(metrics):
        g = frame[frame["metric"] == metric].sort_values("target_rho")
        fig.add_trace(go.Scatter(x=g["target_rho"], y=100 * g["rel_error"], name=metric,
                                 mode="lines+markers", line={"color": PALETTE[i]}))
    themed(fig).update_layout(title="sim vs live error against load",
                      xaxis_title="offered rate / capacity ρ" if llm else "utilisation ρ",
                      yaxis_title="relative error (%)",
                      height=380)
    return fig


def llm_load_curves(frame: pd.DataFrame, config_col: str = "config") -> go.Figure:
    """TTFT and TPOT (P50 dotted, P99 solid) against offered load, one colour per scheduler;
    × marks the knee (first load whose TTFT P99 exceeds 3× the lightest load's); hollow red
    markers are unstable runs.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT vs offered load",
                                                        "TPOT vs offered load"))
    for i, (name, g) in enumerate(frame.groupby(config_col, sort=False)):
        g = g.sort_values("offered_rps")
        colour = PALETTE[i % len(PALETTE)]
        unstable = g["verdict"] == "unstable"
        marker = {"symbol": np.where(unstable, "circle-open", "circle").tolist(), "size": 9,
                  "color": colour,
                  "line": {"color": np.where(unstable, "#D55E00", colour).tolist(), "width": 2}}
        for col, metric in ((1, "ttft_ms"), (2, "tpot_ms")):
            fig.add_trace(go.Scatter(x=g["offered_rps"], y=g[f"{metric}.p99"],
                                     name=str(name), legendgroup=str(name),
                                     showlegend=col == 1, mode="lines+markers", marker=marker,
                                     line={"color": colour}), row=1, col=col)
            fig.add_trace(go.Scatter(x=g["offered_rps"], y=g[f"{metric}.p50"],
                                     name=f"{name} P50", legendgroup=str(name),
                                     showlegend=False, mode="lines",
                                     line={"color": colour, "dash": "dot"}), row=1, col=col)
        knee = knee_index(g["offered_rps"].tolist(), g["ttft_ms.p99"].tolist())
        if knee is not None:
            row = g.iloc[knee]
            fig.add_trace(go.Scatter(x=[row["offered_rps"]], y=[row["ttft_ms.p99"]],
                                     mode="markers", marker={"symbol": "x", "size": 14,
                                                             "color": colour},
                                     legendgroup=str(name), name=f"{name} knee"), row=1, col=1)
    for col in (1, 2):
        fig.update_xaxes(title_text="offered load (req/s)", row=1, col=col)
        fig.update_yaxes(title_text="ms, P99 solid / P50 dotted", type="log", row=1, col=col)
    themed(fig).update_layout(height=420)
    return fig


def kv_and_running(steps: pd.DataFrame, num_blocks: int | None) -> go.Figure:
    """KV-cache utilisation and running sequences over time (per step)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    end = (steps["start_s"] + steps["duration_s"]).to_numpy(float)
    kv = steps["kv_blocks_used"].to_numpy(float) / (num_blocks or 1)
    seqs, waiting = steps["num_seqs"].to_numpy(float), steps["waiting"].to_numpy(float)
    title = "KV cache and sequences over time"
    if end.size > STEP_POINTS:  # one point a step is 10,000 points a trace at 300 requests
        end, (kv, seqs, waiting) = peak_per_bin(end, [kv, seqs, waiting], STEP_POINTS)
        title = "KV cache and sequences over time (maximum per bin)"
    if num_blocks:
        fig.add_trace(go.Scatter(x=end, y=kv, name="KV cache utilisation", mode="lines",
                                 line={"color": PALETTE[0], "shape": "hv"}), secondary_y=False)
    fig.add_trace(go.Scatter(x=end, y=seqs, name="running sequences",
                             mode="lines", line={"color": PALETTE[1], "shape": "hv"}),
                  secondary_y=True)
    fig.add_trace(go.Scatter(x=end, y=waiting, name="waiting", mode="lines",
                             line={"color": PALETTE[2], "shape": "hv", "dash": "dot"}),
                  secondary_y=True)
    fig.update_yaxes(title_text="KV cache utilisation", range=[0, 1.05], secondary_y=False)
    # counts: whole-number ticks from zero (plotly's auto ticks gave -1.6 and 4.5)
    fig.update_yaxes(title_text="sequences", secondary_y=True, rangemode="nonnegative",
                     tickformat="d", dtick=max(1, _nice_step(float(steps["num_seqs"].max()
                                                                  if len(steps) else 1))))
    fig.update_xaxes(title_text="time (s)")
    themed(fig).update_layout(height=400, title=title,
                              legend={"orientation": "h", "yanchor": "top", "y": -0.25,
                                      "x": 0})  # not over the right-hand axis
    return fig


def step_composition(steps: pd.DataFrame) -> go.Figure:
    """What the engine's steps held: prefill tokens against decoding sequences, coloured by
    step time.
    """
    # steps of the same composition draw on one spot: one marker each, coloured by their
    # mean time (10,000 steps are a few hundred distinct compositions). SVG, not WebGL: a
    # WebGL context costs a browser without a GPU (software GL) far more to set up than a
    # few hundred SVG markers take to draw
    same = steps.assign(step_ms=steps["duration_s"] * 1e3).groupby(
        ["decode_seqs", "prefill_tokens"], as_index=False)["step_ms"].mean()
    fig = go.Figure(go.Scatter(
        x=same["decode_seqs"], y=same["prefill_tokens"], mode="markers",
        marker={"size": 5, "color": same["step_ms"], "colorscale": "Viridis",
                "colorbar": {"title": "step ms"}, "opacity": 0.6},
        name="steps"))
    fig.update_xaxes(title_text="decoding sequences in the step")
    fig.update_yaxes(title_text="prefill tokens in the step")
    themed(fig).update_layout(height=360, title="step composition")
    return fig


def latency_and_replicas(results: Mapping[str, Result], bin_s: float | None = None
                         ) -> go.Figure:
    """P99 latency per time bin (top) over the replica count (bottom), for fixed and
    autoscaled runs alike: how long a scale-up takes to help, what scale-to-zero costs.

    The two panels are two y axes on one shared x axis, declared in the layout directly:
    ``make_subplots`` builds the same layout but took most of this figure's time (about
    60 of 90 ms), and the dashboard rebuilds it on every knob move.
    """
    traces: list[go.Scatter] = []
    for i, (name, result) in enumerate(results.items()):
        color = PALETTE[i % len(PALETTE)]
        req = result.requests
        arrival = req["arrival_s"].to_numpy(float)
        horizon = float(arrival.max()) if arrival.size else 0.0
        width = bin_s or max(horizon / 60, 1.0)
        ok = (req["status"].astype(str) == "ok").to_numpy()
        if ok.any():
            lat_ms = (req["finish_s"].to_numpy(float)[ok] - arrival[ok]) * 1e3
            bins = np.floor(arrival[ok] / width) * width
            p99 = pd.Series(lat_ms).groupby(bins).quantile(0.99)
            traces.append(go.Scatter(x=p99.index.to_numpy() + width / 2, y=p99.to_numpy(),
                                     name=name, mode="lines+markers", legendgroup=name,
                                     line={"color": color}, xaxis="x", yaxis="y"))
        if result.replicas is not None:
            series = result.replicas
            x, y = series["time_s"].to_numpy(), series["replicas"].to_numpy()
        else:
            n = result.scenario.fleet_size
            x, y = np.array([0.0, horizon]), np.array([n, n])
        traces.append(go.Scatter(x=np.append(x, horizon),
                                 y=np.append(y, y[-1] if y.size else 0), mode="lines",
                                 line_shape="hv", name=f"{name} replicas", legendgroup=name,
                                 showlegend=False, line={"color": color},
                                 xaxis="x", yaxis="y2"))
    layout = go.Layout(
        title="P99 latency per time bin and replica count", height=480,
        xaxis={"anchor": "y2", "title": {"text": "time (s)"}},
        yaxis={"domain": [0.424, 1.0], "title": {"text": "P99 latency (ms)"}, "type": "log"},
        yaxis2={"domain": [0.0, 0.376], "title": {"text": "replicas"}, "rangemode": "tozero"})
    return themed(go.Figure(traces, layout))
