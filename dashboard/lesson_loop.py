"""Lesson "the serving loop": the seed tutorial's minimal loop, one event at a time.

The loop every model server runs — enqueue a request, form a batch, run the model, return the
results — is stepped through on a small arrival sequence. Nothing here re-implements it: a
tiny driver calls the simulator's own :meth:`sim.serving.core.ServingCore.step` at every arrival,
every batch completion and every timer the policy asks for, and records what the core holds
after each call (the queue, the batch it started, the device, the finished requests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calibration.report import PALETTE
from dashboard.figures import themed
from sim.scenario.build import Streams, build_core, build_service
from sim.scenario.schema import load_scenario
from sim.serving.core import Finished


@dataclass(frozen=True)
class Snapshot:
    """The state after one call of ``ServingCore.step``.

    Attributes:
        time_s: The call's time.
        arrived: Requests that arrived since the previous call (enqueued now).
        finished: Requests whose batch completed at this time (results returned).
        started: The requests of the batch the policy formed and started now (empty: none).
        queue: Request ids waiting, in service order.
        device: Request ids on the device after the call (empty: idle), and when it frees.
        timer: True when the call was the policy's own wake-up (its max wait ran out).
    """

    time_s: float
    arrived: tuple[int, ...]
    finished: tuple[int, ...]
    started: tuple[int, ...]
    queue: tuple[int, ...]
    device: tuple[int, ...]
    device_free_s: float
    timer: bool


def loop_scenario(n_requests: int, rate_rps: float, max_batch: int,
                  max_wait_ms: float) -> dict[str, Any]:
    """The lesson's scenario: seeded Poisson arrivals, 4 ms + 1 ms per item on one device,
    and the seed's batching (wait for a first request, then up to ``max_wait_ms`` for more,
    at most ``max_batch``).
    """
    return {"name": "serving-loop", "seed": 3,
            "service": {"kind": "linear", "base_ms": 4.0, "per_item_ms": 1.0},
            "workload": {"kind": "poisson", "rate_rps": rate_rps, "n_requests": n_requests},
            "policy": {"kind": "dynamic", "max_batch_size": max_batch,
                       "max_wait_ms": max_wait_ms, "timer": "first"},
            "warmup_s": 0.0}


@st.cache_data(show_spinner=False, max_entries=32)
def trace_loop(scenario: dict[str, Any]) -> list[Snapshot]:
    """Drive the core through a scenario, one call per event; the snapshots in order."""
    scn = load_scenario(scenario)
    streams = Streams.from_seed(scn.seed)
    service = build_service(scn, streams.service)
    core = build_core(scn, streams, service.median_s)
    arrival_s = np.asarray(core.table.arrival_s[:scenario["workload"]["n_requests"]])
    running: list[tuple[float, Any, float]] = []  # (finish_s, batch, service_s)
    snapshots: list[Snapshot] = []
    now_s, wake_s, seen = 0.0, math.inf, 0
    done: list[Finished] = []
    while True:
        timer = not done and wake_s <= now_s and not (seen < arrival_s.size
                                                       and arrival_s[seen] <= now_s)
        actions = core.step(now_s, done)
        for batch in actions.start:
            service_s = service.sample_s(batch.items, batch.idle_s)
            running.append((now_s + service_s, batch, service_s))
        arrived = tuple(i for i in range(seen, arrival_s.size) if arrival_s[i] <= now_s)
        seen += len(arrived)
        if snapshots or arrived or actions.start:  # the call at 0 s before any arrival: skip
            snapshots.append(Snapshot(
                time_s=now_s, arrived=arrived,
                finished=tuple(r for f in done for r in f.batch.request_ids),
                started=tuple(r for b in actions.start for r in b.request_ids),
                queue=tuple(core.queues[0].ids()),
                device=tuple(r for _, b, _ in running for r in b.request_ids),
                device_free_s=max((f for f, _, _ in running), default=math.nan),
                timer=timer))
        wake_s = actions.wake_s
        next_arrival = arrival_s[seen] if seen < arrival_s.size else math.inf
        next_finish = min((f for f, _, _ in running), default=math.inf)
        now_s = min(next_arrival, next_finish, wake_s)
        if not math.isfinite(now_s):
            return snapshots
        done = [Finished(b, f, s) for f, b, s in running if f <= now_s]
        running = [x for x in running if x[0] > now_s]


def describe(snap: Snapshot, en: bool) -> str:
    """What happened at a snapshot, in words."""
    def ids(rs: tuple[int, ...]) -> str:
        return ", ".join(f"#{r}" for r in rs)

    parts = []
    if snap.finished:
        parts.append(f"results returned: {ids(snap.finished)}" if en
                     else f"返回结果：{ids(snap.finished)}")
    if snap.arrived:
        parts.append(f"enqueue {ids(snap.arrived)}" if en else f"入队 {ids(snap.arrived)}")
    if snap.timer:
        parts.append("the max wait ran out" if en else "最大等待时间到")
    if snap.started:
        parts.append(f"batch formed and sent to the model: {ids(snap.started)}" if en
                     else f"组成批次并送入模型：{ids(snap.started)}")
    elif snap.queue and snap.device:
        parts.append("the device is busy: the queue waits" if en else "设备忙：队列等待")
    elif snap.queue:
        parts.append("waiting for more requests to fill the batch" if en
                     else "等待更多请求凑批")
    return ("; " if en else "；").join(parts) or ("nothing to do" if en else "无事可做")


def timeline(snapshots: list[Snapshot], upto: int, en: bool) -> go.Figure:
    """Each request's wait (light) and service (dark) up to event ``upto``."""
    now_s = snapshots[upto].time_s
    arrival: dict[int, float] = {}
    start: dict[int, float] = {}
    finish: dict[int, float] = {}
    for snap in snapshots[:upto + 1]:
        for r in snap.arrived:
            arrival[r] = snap.time_s
        for r in snap.started:
            start[r] = snap.time_s
        for r in snap.finished:
            finish[r] = snap.time_s
    fig = go.Figure()
    for label, lo, hi, colour in (
            ("waiting in the queue" if en else "排队等待", arrival, start, PALETTE[3]),
            ("on the device" if en else "在设备上", start, finish, PALETTE[0])):
        ids = sorted(lo)
        ends = [hi.get(r, now_s) for r in ids]
        fig.add_trace(go.Bar(y=[f"#{r}" for r in ids],
                             x=[1e3 * (e - lo[r]) for r, e in zip(ids, ends, strict=True)],
                             base=[1e3 * lo[r] for r in ids], orientation="h", name=label,
                             marker_color=colour))
    fig.add_vline(x=1e3 * now_s, line_dash="dash", line_color="#999999")
    themed(fig).update_layout(barmode="overlay", height=320,
                      title="requests over time" if en else "请求时间线",
                      xaxis_title="time (ms)" if en else "时间（毫秒）",
                      yaxis={"autorange": "reversed", "title": "request" if en else "请求"},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def exp_serving_loop(lang: str) -> None:
    """The lesson's experiment: knobs, the event slider, the state and the timeline."""
    from dashboard.i18n import chart

    en = lang == "en"
    cols = st.columns(3)
    max_batch = cols[0].slider("max batch size" if en else "最大批大小", 1, 8, 4,
                               key="l0-batch")
    max_wait = cols[1].slider("max wait (ms)" if en else "最大等待（毫秒）", 0.0, 20.0, 5.0,
                              0.5, key="l0-wait")
    rate = cols[2].slider("arrivals per second" if en else "每秒到达数", 50, 600, 250, 50,
                          key="l0-rate")
    snapshots = trace_loop(loop_scenario(10, float(rate), max_batch, max_wait))
    at = st.slider("event" if en else "事件", 1, len(snapshots), 1, key="l0-event") - 1
    snap = snapshots[at]
    st.markdown(f"**t = {1e3 * snap.time_s:.2f} ms** — {describe(snap, en)}")

    def chips(rs: tuple[int, ...]) -> str:
        return " ".join(f"`#{r}`" for r in rs) or "—"

    q, b, d = st.columns(3)
    q.markdown(("**queue**" if en else "**队列**") + f"\n\n{chips(snap.queue)}")
    b.markdown(("**batch formed now**" if en else "**本次组成的批次**")
               + f"\n\n{chips(snap.started)}")
    device = chips(snap.device)
    if snap.device:
        device += (f" (until {1e3 * snap.device_free_s:.2f} ms)" if en
                   else f"（至 {1e3 * snap.device_free_s:.2f} 毫秒）")
    d.markdown(("**device**" if en else "**设备**") + f"\n\n{device}")
    chart(timeline(snapshots, at, en))
    log = pd.DataFrame([{"t (ms)": round(1e3 * s.time_s, 2), "event": describe(s, en),
                         "queue": chips(s.queue).replace("`", ""),
                         "device": chips(s.device).replace("`", "")}
                        for s in snapshots[:at + 1]])
    if not en:
        log.columns = ["t（毫秒）", "事件", "队列", "设备"]
    st.dataframe(log, hide_index=True)


TITLE = {"en": "0. The serving loop, one event at a time", "zh": "0. 服务主循环：逐个事件"}
TEXT = {
    "en": "Every model server runs the same small loop, the one the seed tutorial builds "
          "first: **enqueue** each request as it arrives; when the device is free, **form a "
          "batch** (take the first request, then wait up to *max wait* for more, at most "
          "*max batch size*); **run the model** on the batch; **return the results** and go "
          "round again. Below, ten requests arrive at random and the simulator's own serving "
          "core (`ServingCore.step`, the code every other lesson runs) is called at each "
          "event: an arrival, a batch finishing, or the batching timer running out. Move the "
          "*event* slider to step through: the queue, the batch formed at that moment and "
          "what is on the device. The service time is 4 ms + 1 ms per request in the batch, "
          "so a batch of four costs 8 ms where four single runs cost 20 ms.",
    "zh": "每个模型服务都在运行同一个小循环，也就是入门教程最先搭建的那个：请求到达时**入队**；"
          "设备空闲时**组成批次**（取出第一个请求，再最多等待*最大等待时间*以收集更多请求，"
          "不超过*最大批大小*）；对这一批**运行模型**；**返回结果**，然后进入下一轮。下面有十个"
          "随机到达的请求，每个事件（请求到达、批次完成、凑批计时器到期）都会调用模拟器自己的"
          "服务核心（`ServingCore.step`，其他各课运行的也是这段代码）。拖动*事件*滑块逐步查看："
          "队列、此刻组成的批次以及设备上正在运行的内容。服务时间为 4 毫秒 + 批中每个请求 1 毫秒，"
          "所以一批四个请求只需 8 毫秒，而单独运行四次需要 20 毫秒。",
}
QUESTION = {
    "en": "Set max wait to 0: how big are the batches now, and when does request #1 get its "
          "result compared with max wait 5 ms? At which arrival rate does waiting pay off?",
    "zh": "把最大等待时间设为 0：现在批次有多大？与最大等待 5 毫秒相比，请求 #1 何时得到结果？"
          "到达速率多高时，等待凑批才划算？",
}
