"""The autoscaling lesson's check against a real system: servelab's predicted replica count
beside the count Ray Serve's controller reported, on the same burst day, from the committed
result of ``benchmarks/fidelity_rayserve_autoscale.py --tag hold`` (nothing is run here).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard.i18n import chart, frame
from dashboard.state import fmt

RESULT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / \
    "fidelity_rayserve_autoscale_hold.json"

TEXT = {
    "en": "**Against a real autoscaler.** Ray Serve ran a deployment with the same rule "
          "(min {min}, max {max} replicas, `target_ongoing_requests` {target}, "
          "`upscale_delay_s` {up}, `downscale_delay_s` {down}) on a burst day "
          "({phases}); its controller's replica count was polled every 0.25 s. servelab "
          "predicted the same day with its `target` autoscaler. The service is a calibrated "
          "sleep (a batch of n takes {a} + {b}·n ms), so replicas on this small machine do "
          "not slow each other down. servelab batches as Ray's batcher does (the next batch "
          "forms while one runs) and, past Ray's `max_ongoing_requests`, holds requests at "
          "the router as Ray does.",
    "zh": "**与真实的自动扩缩容对比。** Ray Serve 用同样的规则（副本数最少 {min}、最多 {max}，"
          "`target_ongoing_requests` {target}，`upscale_delay_s` {up}，`downscale_delay_s` "
          "{down}）在突发的一天（{phases}）中运行，每 0.25 秒读取一次其控制器给出的副本数；"
          "servelab 用 `target` 自动扩缩容预测同一天。服务是校准过的 `asyncio.sleep`"
          "（n 个请求的批次耗时 {a} + {b}·n 毫秒），因此在这个只有 2 核的机器上副本之间"
          "不会互相拖慢。servelab 按 Ray 批处理器的规则组批（上一批运行时下一批已在组成），"
          "并像 Ray 一样，把超过 `max_ongoing_requests` 的请求留在路由器等待。",
}


@cache
def load_result(path: Path = RESULT) -> dict[str, Any] | None:
    """The committed benchmark result (None when it is absent)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def replica_figure(run: dict[str, Any]) -> go.Figure:
    """Ray Serve's replica count (replicas that exist, and those running) beside
    servelab's prediction, over the day.
    """
    live = pd.DataFrame(run["timeline"]["live"], columns=["time_s", "held", "running"])
    pred = pd.DataFrame(run["timeline"]["predicted"], columns=["time_s", "replicas"])
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=live["time_s"].tolist(), y=live["held"].tolist(), mode="lines",
                             line_shape="hv", name="Ray Serve replicas"))
    fig.add_trace(go.Scatter(x=live["time_s"].tolist(), y=live["running"].tolist(), mode="lines",
                             line_shape="hv", line={"dash": "dot"},
                             name="Ray Serve replicas running"))
    fig.add_trace(go.Scatter(x=pred["time_s"].tolist(), y=pred["replicas"].tolist(), mode="lines",
                             line_shape="hv", name="servelab predicted replicas"))
    if "predicted_calibrated" in run["timeline"]:
        cal = pd.DataFrame(run["timeline"]["predicted_calibrated"], columns=["time_s", "replicas"])
        fig.add_trace(go.Scatter(x=cal["time_s"].tolist(), y=cal["replicas"].tolist(),
                                 mode="lines", line_shape="hv", line={"dash": "dash"},
                                 name="servelab predicted replicas (calibrated service)"))
    fig.update_layout(title="Replicas over the burst day: Ray Serve vs servelab",
                      xaxis_title="time (s)", yaxis_title="replicas", height=320)
    return fig


def ray_autoscale_panel(lang: str) -> None:
    """The comparison: text, the replica-count figure for a chosen run, the error table."""
    data = load_result()
    if data is None:
        st.caption(f"benchmarks/results/{RESULT.name} is missing"
                   if lang == "en" else f"没有 benchmarks/results/{RESULT.name}")
        return
    day = data["day"]
    unit = "s at" if lang == "en" else "秒，每秒"
    phases = ", ".join(f"{d:g} {unit} {r:g}" + ("" if lang == "en" else " 个请求")
                       for d, r in day["phases"])
    st.markdown(TEXT[lang].format(min=day["min_replicas"], max=day["max_replicas"],
                                  target=day["target_ongoing_requests"],
                                  up=day["upscale_delay_s"], down=day["downscale_delay_s"],
                                  phases=phases, a=day["base_ms"], b=day["per_item_ms"]))
    runs = data["runs"]
    k = st.radio("run" if lang == "en" else "运行", list(range(1, len(runs) + 1)),
                 horizontal=True, key="l9-ray-run") - 1
    chart(replica_figure(runs[k]))
    rows = []
    for i, run in enumerate(runs):
        for which, key, label in (("predicted", "errors", "nominal"),
                                  ("predicted_calibrated", "errors_calibrated", "calibrated")):
            if which in run and key in data:
                rows.append(_row(i + 1, run, which, label, data[key][i]))
    st.dataframe(frame(pd.DataFrame(rows)), hide_index=True)


def _row(i: int, run: dict[str, Any], which: str, label: str, err: dict[str, float]
         ) -> dict[str, str]:
    live, pred = run["live"], run[which]
    return {"run": str(i), "servelab service time": label,
            "replica-seconds, Ray / servelab": f"{fmt(live['replica_seconds'], 1)} / "
                                               f"{fmt(pred['replica_seconds'], 1)}",
            "replica-seconds error %": fmt(100 * err["replica_seconds"], 1),
            "upscales, Ray / servelab": f"{live['upscales']} / {pred['upscales']}",
            "P99 ms, Ray / servelab": f"{fmt(live['latency_p99_ms'])} / "
                                      f"{fmt(pred['latency_p99_ms'])}",
            "P99 error %": fmt(100 * err["latency_p99_ms"], 1)}
