"""Ray Serve's autoscaler against servelab's ``target`` autoscaler on one burst day.

A Ray Serve deployment of the ``sleep`` model (:mod:`executor.endpoint.ray_app`: a batch of n
takes ``base_ms + per_item_ms * n`` of ``asyncio.sleep``, a service time that does not depend
on how busy the CPU is, so replicas of it do not slow each other down on a small machine)
with an ``autoscaling_config`` and a controlled start-up delay is driven by ``servelab bench``
on a burst day (a trace: low, burst, low). The deployment's replica counts by state are polled
from the controller (``serve.status()``) every quarter second into the bench run directory
(``ray_replicas.csv``); ``servelab simulate`` predicts the same day with the ``target``
autoscaler configured as Ray is.

How Ray Serve 2.60's default policy maps onto ``target`` (read from its
``autoscaling_policy.py`` and ``_private/autoscaling_state.py``):

* desired = total ongoing requests / ``target_ongoing_requests``, where the total is the
  time-weighted mean, over ``look_back_period_s``, of the requests each handle (the HTTP
  proxy's router) has sent and not yet had answered plus those it holds queued: queued in the
  replica's batcher plus running, which is servelab's ``queued + running``;
* the gauges are recorded every ``0.2 x look_back_period_s`` (``RAY_SERVE_AUTOSCALING_METRIC_
  RECORD_INTERVAL_FACTOR``), so servelab's ``control_period_s`` is set to that;
* the decision must hold for ``upscale_delay_s`` / ``downscale_delay_s`` (Ray counts
  consecutive 0.1 s control loops; servelab the time since the decision first held);
* the change is scaled by ``upscaling_factor`` / ``downscaling_factor`` from the running
  count and compared with the target count (running + starting), as servelab compares with
  ``ready + starting``.

What ``target`` does not model, and how the check keeps it out: Ray pushes the gauges to the
controller every 10 s by default (``RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S``); the
check sets both to 0.2 s so the controller sees them at once, as servelab's autoscaler does.
The proxy's own time is inside Ray's ongoing count but not servelab's (it is added to the
predicted latency as the single-request overhead measured in the same run).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import sim
from calibration.profile import load_profile
from executor.endpoint.rayserve import RayServeApp
from executor.endpoint.request_bench import bench_requests
from executor.endpoint.request_calibrate import profile_service
from executor.endpoint.venvs import ServerEnv

PUSH_ENV = {"RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.2",
            "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.2"}
RECORD_FACTOR = 0.2  # Ray's RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR
PAYLOAD = {"model": "sleep", "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 2]}]}


@dataclass(frozen=True)
class AutoscaleDay:
    """The deployment, its autoscaling settings and the burst day.

    Attributes:
        phases: ``(duration_s, rate_rps)`` of each part of the day (Poisson inside).
    """

    phases: Sequence[tuple[float, float]] = ((8.0, 4.0), (16.0, 40.0), (20.0, 4.0))
    base_ms: float = 50.0
    per_item_ms: float = 10.0
    max_batch_size: int = 4
    batch_wait_ms: float = 5.0
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 1.0
    downscale_delay_s: float = 5.0
    look_back_period_s: float = 2.0
    aggregation_function: str = "mean"  # Ray's default
    downscale_to_zero_delay_s: float | None = None  # Ray's default: downscale_delay_s
    startup_delay_s: float = 2.0
    graceful_shutdown_wait_loop_s: float | None = 2.0  # Ray's default, set explicitly
    max_ongoing_requests: int = 64
    seed: int = 11
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def length_s(self) -> float:
        """The day's length."""
        return float(sum(d for d, _ in self.phases))

    def ray_config(self, replica_log: Path) -> dict[str, Any]:
        """The Ray application's settings (:mod:`executor.endpoint.ray_app`)."""
        return {"model": "sleep", "model_name": "sleep", "max_batch_size": self.max_batch_size,
                "batch_wait_timeout_s": self.batch_wait_ms / 1e3,
                "sleep_base_ms": self.base_ms, "sleep_per_item_ms": self.per_item_ms,
                "startup_delay_s": self.startup_delay_s,
                "graceful_shutdown_wait_loop_s": self.graceful_shutdown_wait_loop_s,
                "max_ongoing_requests": self.max_ongoing_requests,
                "replica_log": str(replica_log),
                "autoscaling_config": {
                    "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                    "initial_replicas": self.min_replicas,
                    "target_ongoing_requests": self.target_ongoing_requests,
                    "upscale_delay_s": self.upscale_delay_s,
                    "downscale_delay_s": self.downscale_delay_s,
                    "look_back_period_s": self.look_back_period_s,
                    "aggregation_function": self.aggregation_function,
                    **({} if self.downscale_to_zero_delay_s is None else
                       {"downscale_to_zero_delay_s": self.downscale_to_zero_delay_s}),
                    "metrics_interval_s": float(PUSH_ENV[
                        "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S"])}}

    def trace(self, path: Path) -> Path:
        """Write the day's arrival times (seeded Poisson per phase) as a CSV trace."""
        rng = np.random.default_rng(self.seed)
        times, start = [], 0.0
        for duration, rate in self.phases:
            n = rng.poisson(rate * duration)
            times.append(start + np.sort(rng.uniform(0.0, duration, n)))
            start += duration
        pd.DataFrame({"t": np.concatenate(times)}).to_csv(path, index=False)
        return path

    def scenario(self, trace: Path, cold_start_s: float, profile: Path | None = None,
                 drain: bool = True, outside_ms: float = 0.0, retry: bool = False
                 ) -> dict[str, Any]:
        """The servelab scenario for the day: the same batcher, p2c routing, ``target``;
        the service is the nominal sleep, or ``profile`` (calibrated through the endpoint);
        ``drain``: a removed replica lingers as Ray's does (``graceful_shutdown_wait_loop_s``),
        else it stops when its work is done; ``outside_ms``: the path outside the replica,
        which Ray's ongoing count holds (``autoscaling.outside_ms``); ``retry``: the router
        retries held requests as Ray's routing tasks do (``queue.retry``, Ray's defaults),
        else it sends them on the moment a replica has room.
        """
        service = (profile_service(load_profile(profile), str(profile)) if profile is not None
                   else {"kind": "linear", "base_ms": self.base_ms,
                         "per_item_ms": self.per_item_ms, "deterministic": True})
        return {"name": "ray-autoscale-day", "seed": self.seed, "service": service,
                "workload": {"kind": "trace", "path": str(trace), "timestamp_column": "t"},
                # Ray's batcher (timer: arrival, read from batching.py) and its replicas'
                # max_ongoing_requests, past which the router holds a request
                "policy": {"kind": "dynamic", "max_batch_size": self.max_batch_size,
                           "max_wait_ms": self.batch_wait_ms, "timer": "arrival"},
                "queue": {"max_ongoing_requests": self.max_ongoing_requests,
                          **({"retry": {}} if retry else {})},
                "routing": "p2c", "warmup_s": 0, "payload": PAYLOAD,
                "autoscaling": {
                    "kind": "target", "min_replicas": self.min_replicas,
                    "max_replicas": self.max_replicas,
                    "target_ongoing_requests": self.target_ongoing_requests,
                    "upscale_delay_s": self.upscale_delay_s,
                    "downscale_delay_s": self.downscale_delay_s,
                    "look_back_period_s": self.look_back_period_s,
                    "aggregation_function": self.aggregation_function,
                    "downscale_to_zero_delay_s": self.downscale_to_zero_delay_s,
                    "control_period_s": RECORD_FACTOR * self.look_back_period_s,
                    "cold_start_s": cold_start_s,
                    "graceful_shutdown_wait_loop_s":
                        self.graceful_shutdown_wait_loop_s if drain else None,
                    # Ray's scale-down order on one node and its kill of a stopping replica
                    # (graceful_shutdown_timeout_s, 20 s by default)
                    "retire": "newest", "graceful_shutdown_timeout_s": 20.0,
                    # Ray's count of replicas against max_replicas leaves out STOPPING ones:
                    # a scale-up launches while a removed replica still drains
                    "stopping_holds_slot": False,
                    "outside_ms": outside_ms}}


def read_replica_log(path: Path, t0_unix: float) -> pd.DataFrame:
    """Ray's replica counts over time: ``time_s`` (from ``t0_unix``), ``running``,
    ``starting``, ``held`` (running + starting + stopping: the replicas that exist).
    """
    rows = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        states = rec["states"]
        if "error" in states:
            continue
        running, starting = int(states.get("RUNNING", 0)), int(states.get("STARTING", 0))
        held = running + starting + int(states.get("STOPPING", 0))
        rows.append((rec["t"] - t0_unix, running, starting, held))
    return pd.DataFrame(rows, columns=["time_s", "running", "starting", "held"])


# the line Ray's controller logs for each autoscaling decision it acts on (2.60's
# deployment_state.py), with the total ongoing requests the policy decided on (the same
# aggregate, kept from that decision) and the running replicas; the time is the log's asctime
# (local time, whole milliseconds)
LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
DECISION_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*?(Up|Down)scaling "
    r"Deployment\(name='Model', app='servelab'\) from (\d+) to (\d+) replicas\. "
    r"Current ongoing requests: ([0-9.]+), current running replicas: (\d+)\.")


def router_warnings(ray_tmp: Path, t0_unix: float, length_s: float) -> dict[str, int]:
    """What Ray's logs say its router met in ``[t0_unix, t0_unix + length_s]``: requests a
    replica rejected at ``max_ongoing_requests`` (its router's cache said it had room) and
    queue-length probes past their deadline (the router then treats the replica as full).
    """
    counts = {"rejected": 0, "probe_timeouts": 0}
    what = {"rejected": ("replica_*.log", "rejecting request"),
            "probe_timeouts": ("proxy_*.log", "Failed to get queue length")}
    for key, (pattern, text) in what.items():
        for path in sorted(ray_tmp.glob(f"session_*/logs/serve/{pattern}")):
            for line in path.read_text(errors="replace").splitlines():
                m = LOG_TIME.match(line.split(" ", 1)[-1]) if text in line else None
                if m is None:
                    continue
                t = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1e3
                counts[key] += int(0.0 <= t - t0_unix <= length_s)
    return counts


def read_decisions(ray_tmp: Path, t0_unix: float) -> pd.DataFrame:
    """Ray's autoscaling decisions from its controller's log under ``ray_tmp``:
    ``time_s`` (from ``t0_unix``), ``old`` and ``new`` target counts, ``ongoing`` (the total
    ongoing requests the policy saw, as Ray prints it: two decimals) and ``running``.
    """
    rows = []
    for path in sorted(ray_tmp.glob("session_*/logs/serve/controller_*.log")):
        for line in path.read_text(errors="replace").splitlines():
            m = DECISION_LINE.search(line)
            if m is None:
                continue
            t = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1e3
            rows.append((t - t0_unix, int(m[4]), int(m[5]), float(m[6]), int(m[7])))
    # (the same line can be in two of the controller's log files: kept once)
    return pd.DataFrame(sorted(set(rows)),
                        columns=["time_s", "old", "new", "ongoing", "running"])


def step_metrics(t_s: np.ndarray, held: np.ndarray, lo_s: float, hi_s: float
                 ) -> dict[str, float]:
    """Replica-seconds over [lo, hi] of a step series, its upscales (increases of the count
    inside the window) and its largest count.
    """
    inside = (t_s >= lo_s) & (t_s <= hi_s)
    edges = np.clip(np.append(t_s, hi_s), lo_s, hi_s)
    seconds = float(np.sum(held * np.diff(edges)))
    before = held[max(int(np.searchsorted(t_s, lo_s, side="right")) - 1, 0)]
    seq = np.append(before, held[inside])
    return {"replica_seconds": seconds, "upscales": int(np.sum(np.diff(seq) > 0)),
            "max_replicas": int(seq.max()) if seq.size else 0}


def cold_starts_s(log: pd.DataFrame) -> list[float]:
    """For each upscale in Ray's log: the time until that many replicas were running."""
    t, held, running = (log[c].to_numpy() for c in ("time_s", "held", "running"))
    out = []
    for k in np.flatnonzero(np.diff(held) > 0) + 1:
        later = np.flatnonzero((running >= held[k]) & (t >= t[k]))
        if later.size:
            out.append(float(t[later[0]] - t[k - 1]))  # the rise happened after t[k-1]
    return out


def _post_single(url: str) -> float:
    body = {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32",
                        "data": [0.5, 0.5]}]}
    req = urllib.request.Request(f"{url}/v2/models/sleep/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
    return time.perf_counter() - t0


def _wait_for_min(log_path: Path, n: int, timeout_s: float) -> None:
    """Wait until Ray's latest poll shows ``n`` replicas held and none starting."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        lines = log_path.read_text().splitlines() if log_path.exists() else []
        if lines:
            states = json.loads(lines[-1])["states"]
            held = sum(int(v) for k, v in states.items() if k in ("RUNNING", "STARTING",
                                                                  "STOPPING"))
            if held == n and not states.get("STARTING"):
                return
        time.sleep(0.25)


def run_days(env: ServerEnv, day: AutoscaleDay, out_dir: Path, runs: int = 1
             ) -> list[dict[str, Any]]:
    """``runs`` live days against one Ray Serve application (each starting from
    ``min_replicas``, a fresh seed each) and servelab's prediction of each.

    Writes each bench run directory (``out_dir/runK/live``, with Ray's replica counts in
    ``ray_replicas.csv``) and the simulated run (``out_dir/runK/sim``); returns both sides'
    metrics per run.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "ray_replicas.jsonl"
    log_path.unlink(missing_ok=True)
    rows = []
    with RayServeApp(env, day.ray_config(log_path), environ=dict(PUSH_ENV)) as app:
        singles = [_post_single(app.url) for _ in range(12)]
        overhead_ms = max(1e3 * float(np.median(singles)) - day.batch_wait_ms
                          - day.base_ms - day.per_item_ms, 0.0)
        profile = _calibrate(app.url, day, out_dir / "profile.json")
        for k in range(runs):
            _wait_for_min(log_path, day.min_replicas, 4 * day.downscale_delay_s + 30)
            time.sleep(day.look_back_period_s)  # the last requests out of the look-back
            today = AutoscaleDay(**{**asdict(day), "seed": day.seed + k})
            run_dir = out_dir / f"run{k + 1}"
            run_dir.mkdir(parents=True, exist_ok=True)
            trace = today.trace(run_dir / "day.csv")
            clients: list[Any] = []
            measured = bench_requests(today.scenario(trace, day.startup_delay_s), app.url,
                                      api="kserve-v2", on_client=clients.append)
            t0_unix = clients[0].t0 + (time.time() - time.perf_counter())
            time.sleep(0.5)  # the poller's last lines
            assert app.tmp is not None  # (set while the application runs)
            rows.append(_compare(today, trace, measured, read_replica_log(log_path, t0_unix),
                                 read_decisions(app.tmp, t0_unix), overhead_ms, run_dir,
                                 profile, router_warnings(app.tmp, t0_unix,
                                                          today.length_s + 5.0)))
    return rows


def _configure(url: str, **settings: float) -> None:
    req = urllib.request.Request(f"{url}/servelab/config", data=json.dumps(settings).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def _calibrate(url: str, day: AutoscaleDay, path: Path) -> Path:
    """``calibrate --endpoint`` of the one replica: bursts of 1, 2 and 4 with a 100 ms window
    (wider than a burst's spread through Ray's proxy on a busy machine; subtracted), so the
    profile holds what Ray adds per request and per batch to the nominal sleep.
    """
    from executor.endpoint.request_calibrate import calibrate_endpoint

    _configure(url, batch_wait_timeout_s=0.1)
    try:
        profile = calibrate_endpoint(url, api="kserve-v2", sizes=[1, 2, day.max_batch_size],
                                     reps=6, payload=None, model="sleep", window_ms=100,
                                     server_max_batch=day.max_batch_size, say=lambda _: None)
    finally:
        _configure(url, batch_wait_timeout_s=day.batch_wait_ms / 1e3)
    return profile.save(path)


def _predict(day: AutoscaleDay, trace: Path, cold_s: float, profile: Path | None,
             overhead_ms: float, out: Path, drain: bool = True, outside: bool = True,
             retry: bool = False) -> tuple[dict[str, Any], pd.DataFrame]:
    # Ray's ongoing count holds the path outside the replica: the overhead measured from
    # single requests (nominal) or the calibration's request overhead (``outside`` False:
    # the autoscaler counts only what the replicas hold, the ablation)
    outside_ms = overhead_ms if profile is None else float((load_profile(profile).meta[
        "endpoint"].get("request_overhead") or {}).get("request_ms", 0.0))
    outside_ms = outside_ms if outside else 0.0
    predicted = sim.run(day.scenario(trace, cold_s, profile, drain, outside_ms, retry))
    predicted.write(out)
    series = predicted.replicas
    assert series is not None  # an autoscaled run keeps its replica counts
    steps = step_metrics(series["time_s"].to_numpy(float), series["replicas"].to_numpy(float),
                         0.0, day.length_s)
    lat = predicted.summary["latency_ms"]
    # a calibrated profile holds it already (as service.overheads, which the simulated
    # latencies include, or in its busy time)
    add = overhead_ms if profile is None else 0.0
    return {**steps, "latency_p99_ms": lat["p99"] + add,
            "latency_p50_ms": lat["p50"] + add}, series


def _compare(day: AutoscaleDay, trace: Path, measured: Any, log: pd.DataFrame,
             decisions: pd.DataFrame, overhead_ms: float, run_dir: Path, profile: Path,
             router: dict[str, int] | None = None) -> dict[str, Any]:
    live_dir = Path(measured.write(run_dir / "live"))
    log = log[(log["time_s"] >= -1.0) & (log["time_s"] <= day.length_s + 1.0)]
    log.to_csv(live_dir / "ray_replicas.csv", index=False)
    decisions = decisions[(decisions["time_s"] >= -1.0)
                          & (decisions["time_s"] <= day.length_s + 1.0)]
    decisions.to_csv(live_dir / "ray_decisions.csv", index=False)
    starts = cold_starts_s(log)
    cold_s = float(np.median(starts)) if starts else day.startup_delay_s
    nominal, series = _predict(day, trace, cold_s, None, overhead_ms, run_dir / "sim")
    calibrated, cal_series = _predict(day, trace, cold_s, profile, overhead_ms,
                                      run_dir / "sim-calibrated")
    no_drain, _ = _predict(day, trace, cold_s, profile, overhead_ms,
                           run_dir / "sim-calibrated-no-drain", drain=False)
    no_outside, _ = _predict(day, trace, cold_s, None, overhead_ms,
                             run_dir / "sim-no-outside", outside=False)
    cal_no_outside, _ = _predict(day, trace, cold_s, profile, overhead_ms,
                                 run_dir / "sim-calibrated-no-outside", outside=False)
    with_retry, _ = _predict(day, trace, cold_s, None, overhead_ms, run_dir / "sim-retry",
                             retry=True)
    cal_retry, _ = _predict(day, trace, cold_s, profile, overhead_ms,
                            run_dir / "sim-calibrated-retry", retry=True)
    live_steps = step_metrics(log["time_s"].to_numpy(float), log["held"].to_numpy(float),
                              0.0, day.length_s)
    ok = measured.requests[measured.requests["status"] == "ok"]
    lat_ms = (ok["finish_s"] - ok["arrival_s"]).to_numpy() * 1e3
    return {"day": {**asdict(day), "phases": [list(p) for p in day.phases]},
            "overhead_ms": overhead_ms,
            "calibrated_overhead_ms": (load_profile(profile).meta["endpoint"].get(
                "request_overhead") or {}).get("request_ms", 0.0),
            "cold_start_s": {"controlled": day.startup_delay_s,
                                                         "measured": starts,
                                                         "simulated": cold_s},
            "live": {**live_steps, "latency_p99_ms": float(np.percentile(lat_ms, 99)),
                     "latency_p50_ms": float(np.percentile(lat_ms, 50)),
                     "failed": int(measured.summary["failed"]),
                     "requests": len(measured.requests)},
            "predicted": nominal, "predicted_calibrated": calibrated,
            "predicted_calibrated_no_drain": no_drain,
            "predicted_no_outside": no_outside,
            "predicted_calibrated_no_outside": cal_no_outside,
            "predicted_retry": with_retry, "predicted_calibrated_retry": cal_retry,
            "timeline": {"live": log[["time_s", "held", "running"]].round(3).values.tolist(),
                         "predicted": series[["time_s", "replicas"]].round(3).values.tolist(),
                         "predicted_calibrated":
                             cal_series[["time_s", "replicas"]].round(3).values.tolist()},
            "ray_router": router or {},
            "run_dir": str(live_dir)}


def errors(row: dict[str, Any], which: str = "predicted") -> dict[str, float]:
    """A prediction's errors (``which``: ``predicted``, the nominal sleep, or
    ``predicted_calibrated``): relative for replica-seconds and latency, absolute upscales.
    """
    live, pred = row["live"], row[which]
    rel = {k: (pred[k] - live[k]) / live[k] if live[k] else math.nan
           for k in ("replica_seconds", "latency_p99_ms", "latency_p50_ms")}
    return {**rel, "upscales": float(pred["upscales"] - live["upscales"])}
