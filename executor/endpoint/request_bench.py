"""``bench_requests(scenario, endpoint, api) -> Result``: measure a request-level server (KServe
v2 / Open Inference Protocol, or plain JSON over HTTP) on a request-level scenario's own
arrival schedule (:func:`sim.scenario.build.arrival_schedule`, the one ``simulate`` and
``live`` use), with the shared open-loop client (:mod:`executor.endpoint.client`), and return
the :class:`sim.metrics.rundir.Result` ``live`` returns.

What a black-box client can and cannot see: each request's send time (its ``arrival_s``: the
latency clock starts just before its POST, as for LLM streams; the scheduled time and the send
lag are kept beside it), the end of its answer (``finish_s``) and its outcome. The server's
batches, queues, replicas and busy time are not visible: ``batches.parquet`` and
``queue.parquet`` are empty, ``start_s``, ``batch_id`` and ``replica`` are unknown (NaN, -1,
-1), and the summary's ``queue_ms``, ``service_ms``, ``queue_len``, ``mean_batch_size`` and
``utilization`` are null (``meta.json``'s ``not_visible`` lists them).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.model_runners import load_corpus
from executor.endpoint import server_info
from executor.endpoint.bench import (
    LAG_FLAG_MS,
    _run,
    check_bench_memory,
    check_model_name,
    check_request_timeout,
)
from executor.endpoint.client import Job, OpenLoop, Outcome
from executor.endpoint.request_client import (
    REQUEST_APIS,
    check_bodies,
    check_kserve_answer,
    json_body,
    kserve_body,
    request_path,
    request_sender,
)
from executor.endpoint.server_info import BAD_JSON, EndpointError
from sim.metrics.rundir import Result, run_meta
from sim.metrics.summary import _stats_ms, summarize
from sim.metrics.window import default_drain_s, horizon_s, window_for
from sim.scenario.build import arrival_schedule, build_service
from sim.scenario.payload import PayloadCfg
from sim.scenario.schema import Scenario, load_scenario
from sim.serving.types import STATUS_CATEGORIES

NOT_VISIBLE = ("batches", "queue", "start_s", "batch_id", "replica", "queue_ms", "service_ms",
               "mean_batch_size", "batch_utilization", "utilization")


def resolve_model(api: str, scn: Scenario, model: str | None) -> str | None:
    """The model name (KServe v2: ``--model``, else ``payload.model``).

    Raises:
        EndpointError: KServe v2 without a model name.
    """
    name = model or (scn.payload.model if scn.payload is not None else None)
    if api == "kserve-v2" and not name:
        raise EndpointError("--api kserve-v2 needs the model's name: pass --model NAME or set "
                            "payload.model in the scenario")
    return name


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return int(resp.status), server_info.read_capped(resp, f"POST {url}")
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read(160))  # the error's first words are shown
    except server_info.HTTP_ERRORS as exc:
        raise EndpointError(server_info.unreachable(url, exc)) from None


def preflight(base: str, api: str, model: str | None, body: dict[str, Any]
              ) -> dict[str, Any] | None:
    """Check the endpoint with one request before the run and return the model's v2
    metadata (None for http-json, or when the server has none).

    Raises:
        EndpointError: unreachable, the model or path unknown (404), the request refused,
            or the answer malformed.
    """
    metadata = None
    if api == "kserve-v2":
        status, text = server_info.get_text(f"{base}/v2/models/{model}")
        if status == 404:
            raise EndpointError(f"GET {base}/v2/models/{model}: 404 — the server has no model "
                                f"{model!r} (--model / payload.model), or --endpoint is not "
                                "its base URL")
        if status == 200:
            try:
                metadata = json.loads(text)
            except BAD_JSON:
                metadata = None
    url = base + (request_path(api, PayloadCfg(), model) if api == "kserve-v2" else "")
    status, raw = _post(url if api == "kserve-v2" else base + str(body.pop("__path")), body)
    detail = " ".join(raw[:160].decode(errors="replace").split())
    if status == 404:
        raise EndpointError(f"POST {url}: 404 Not Found — is --endpoint the server's base URL "
                            f"and --api ({', '.join(REQUEST_APIS)}) the protocol it speaks? "
                            f"{detail}")
    if status != 200:
        raise EndpointError(f"POST {url}: HTTP {status} for a 1-item test request: {detail}")
    try:
        answer = json.loads(raw)
    except BAD_JSON:
        raise EndpointError(f"POST {url}: the answer to a 1-item test request is not JSON: "
                            f"{raw[:60]!r}") from None
    problem = check_kserve_answer(answer, 1) if api == "kserve-v2" else ""
    if problem:
        raise EndpointError(f"POST {url}: not a KServe v2 answer: {problem}")
    return metadata if isinstance(metadata, dict) else None


def _tables(outs: list[Outcome], arrival_s: np.ndarray, size: np.ndarray,
            priority: np.ndarray) -> pd.DataFrame:
    """The request table: sim's columns (what is not visible: NaN / -1) + the client's."""
    n = len(outs)
    idx = np.array([o.index for o in outs], dtype=np.int64)
    sent = np.array([o.sent_s for o in outs], dtype=float)
    started = np.array([o.started_s for o in outs], dtype=float)
    finish = np.array([o.chunk_s[-1] if o.status == "ok" and o.chunk_s else math.nan
                       for o in outs], dtype=float)
    return pd.DataFrame({
        "id": idx, "arrival_s": sent, "start_s": np.full(n, math.nan), "finish_s": finish,
        "batch_id": np.full(n, -1, dtype=np.int64), "replica": np.full(n, -1, dtype=np.int16),
        "status": pd.Categorical([o.status for o in outs], categories=STATUS_CATEGORIES),
        "reason": [o.cause for o in outs], "size": size[idx] if n else np.zeros(0, np.int32),
        "priority": priority[idx] if n else np.zeros(0, np.int8),
        "scheduled_s": arrival_s[idx] if n else np.zeros(0),
        "send_lag_s": started - (arrival_s[idx] if n else np.zeros(0)),
        "client_wait_s": sent - started,
        "http_status": np.array([o.http_status for o in outs], dtype=np.int16),
        "error": [o.error for o in outs]})


def _client_block(requests: pd.DataFrame, cpu_share: float) -> dict[str, Any]:
    lag = requests["send_lag_s"].to_numpy(float)
    lag_ms = _stats_ms(lag[np.isfinite(lag)])
    p99 = lag_ms.get("p99")
    failed = requests[requests["status"].astype(str) == "failed"]
    causes = failed["reason"].value_counts().to_dict()
    return {"send_lag_ms": lag_ms,
            "send_lag_flagged": bool(p99 is not None and math.isfinite(p99)
                                     and p99 > LAG_FLAG_MS),
            "send_lag_limit_ms": LAG_FLAG_MS, "cpu_share": cpu_share,
            "errors_by_cause": {str(c): int(v) for c, v in sorted(causes.items()) if v}}


def bench_requests(scenario: Scenario | dict[str, Any] | str | Path, endpoint: str, *,
                   api: str = "kserve-v2", model: str | None = None,
                   overrides: list[str] | dict[str, Any] | None = None,
                   max_concurrency: int | None = None, drain_timeout_s: float | None = None,
                   request_timeout_s: float | None = None, handle_signals: bool = False,
                   on_done: Callable[[Outcome], None] | None = None,
                   on_client: Callable[[OpenLoop], None] | None = None) -> Result:
    """Measure ``endpoint`` on a request-level scenario's arrival schedule.

    Args:
        scenario: A request-level scenario (object, dict, path or ``builtin:NAME``).
        endpoint: The server's base URL (``http://HOST:PORT``).
        api: ``kserve-v2`` or ``http-json``.
        model: KServe v2 model name (default: ``payload.model``).
        overrides: Dotted-key scenario overrides.
        max_concurrency: At most this many requests in flight (None: open loop).
        drain_timeout_s: Stop this long after the horizon; the rest stays in flight.
        request_timeout_s: Fail a request not answered after this long (cause ``timeout``).
        handle_signals: SIGINT and SIGTERM stop the run; what was measured is kept.
        on_done: Called after each request (the progress bar).
        on_client: Called with the client before it starts (tests stop runs with it).

    Raises:
        EndpointError: a bad flag, or the endpoint unreachable, 404 or refusing a request.
        ScenarioError: a bad scenario.
    """
    if api not in REQUEST_APIS:
        raise EndpointError(f"--api {api!r}: allowed for request-level scenarios: "
                            f"{', '.join(REQUEST_APIS)}")
    if max_concurrency is not None and max_concurrency < 1:
        raise EndpointError(f"--max-concurrency {max_concurrency}: must be >= 1")
    scn = load_scenario(scenario, overrides)
    if scn.workload.kind == "closed":
        raise EndpointError("workload.kind: 'closed' — bench replays an open-loop schedule; "
                            "use poisson, constant, gamma, mmpp, sinusoid or trace")
    drain = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    if not drain > 0:  # nan too: a deadline of nan never ends the drain
        raise EndpointError(f"--drain-timeout-s {drain:g}: must be > 0")
    check_request_timeout(request_timeout_s)
    check_model_name(model)
    check_bench_memory(scn)
    payload = scn.payload or PayloadCfg()
    name = resolve_model(api, scn, model)
    base = server_info.base_url(endpoint)
    corpus = load_corpus()

    def make(job: Job, rng: np.random.Generator) -> dict[str, Any]:
        if api == "kserve-v2":
            return kserve_body(payload, job, rng, corpus)
        return json_body(payload, job, rng, corpus)

    schedule = arrival_schedule(scn)
    sizes = np.asarray(schedule.size, dtype=np.int64)
    by_size = dict(zip(*(v.tolist() for v in np.unique(sizes, return_counts=True)),
                       strict=True))
    check_bodies(api, payload, {**by_size, 1: by_size.get(1, 0) + 1},  # + the preflight's
                 f"{len(sizes)} requests (workload.n_requests, workload.size)")
    probe = make(Job(-1, 0.0, "", 1, 0), np.random.default_rng(0))
    metadata = preflight(base, api, name, {**probe, "__path": payload.path})
    priority = np.asarray(schedule.priority, dtype=np.int8)
    jobs = [Job(i, float(t), "", int(s), 0) for i, (t, s) in enumerate(
        zip(schedule.arrival_s, sizes, strict=True))]
    rng = np.random.default_rng([scn.seed, 30])
    bodies = {j.index: make(j, rng) for j in jobs}
    make_body, sender = request_sender(bodies, api == "kserve-v2")

    last = float(schedule.arrival_s[-1]) if len(jobs) else 0.0
    horizon = horizon_s(scn, last)
    url = base + request_path(api, payload, name)
    client = OpenLoop(url, api, name or "", jobs, deadline_s=horizon + drain,
                      max_concurrency=max_concurrency, request_timeout_s=request_timeout_s,
                      on_done=on_done, make_body=make_body, sender=sender)
    if on_client is not None:
        on_client(client)
    outs = _run(client, handle_signals)
    requests = _tables(outs, np.asarray(schedule.arrival_s, float), sizes, priority)
    empty_batches = pd.DataFrame({"batch_id": np.empty(0, np.int64),
                                  "replica": np.empty(0, np.int16), "start_s": np.empty(0),
                                  "finish_s": np.empty(0), "size": np.empty(0, np.int32),
                                  "items": np.empty(0, np.int32)})
    queue = pd.DataFrame({"time_s": np.empty(0), "queue": np.empty(0, np.int16),
                          "length": np.empty(0, np.int64)})
    window = window_for(scn, requests, build_service(scn), end_s=client.end_s,
                        stopped_s=client.stopped_at_s)
    window = type(window)(**{**window.__dict__, "horizon_s": min(window.horizon_s, horizon)})
    summary = summarize(requests, empty_batches, queue, window, driver="bench")
    for key in ("queue_ms", "service_ms"):  # not visible: the shape kept, the values null
        summary[key] = _stats_ms(np.empty(0))
    for key in ("mean_batch_size", "mean_batch_items", "batch_utilization", "utilization"):
        summary[key] = math.nan
    summary["queue_len"] = {"mean": math.nan, "p95": math.nan, "max": math.nan}
    summary["batch_size_hist"] = {}
    summary["utilization_per_replica"] = []
    summary["client"] = _client_block(requests, client.cpu_share)
    counts = requests["status"].astype(str).value_counts().to_dict()
    drain_timed_out = client.stopped_at_s is None and bool(
        (requests["status"].astype(str) == "in_flight").any())
    meta = run_meta(scn, driver="bench", device={"kind": "endpoint", "url": base, "api": api,
                                                 "model": name}, extra={
        "kind": "requests", "end_s": client.end_s, "wall_s": client.wall_s,
        "status_counts": {k: int(v) for k, v in counts.items()},
        "stopped_early": client.stopped_at_s is not None, "stopped_s": client.stopped_at_s,
        "drain_timeout_s": drain, "drain_timed_out": drain_timed_out,
        "server_model_metadata": metadata, "client_cpu_share": client.cpu_share,
        "max_concurrency": max_concurrency, "request_timeout_s": request_timeout_s,
        "requests_planned": len(jobs), "requests_sent": len(outs), "url": url,
        "not_visible": list(NOT_VISIBLE),
        "planned_horizon_s": horizon if math.isfinite(horizon) else None})
    return Result(scn, summary, requests, empty_batches, queue, meta)
