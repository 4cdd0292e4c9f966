"""``executor.live(scenario) -> Result``: run a scenario in real time against the real model.

The runner is built from the model recorded in the scenario's profile (or the scenario's
``model:`` section), on the recorded device and thread count. The arrival schedule, the
policies, the queues, the records and the metrics are the simulator's own
(:func:`sim.runner.build_core`, :func:`sim.metrics.summarize`), so a difference between sim
and live can only come from service times, timing and overheads.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from calibration.profile import LatencyProfile, load_profile
from calibration.runners import ModelRunner, build_runner
from sim.build import Streams, build_service
from sim.rundir import run_meta
from sim.runner import Result, build_core, window_for
from sim.scenario import Scenario, load_scenario

LOG = logging.getLogger(__name__)

RunnerFactory = Callable[[Scenario], Sequence[ModelRunner]]


class LiveError(ValueError):
    """The scenario cannot be run live as given (no model to run, mismatched settings)."""


def scenario_profile(scenario: Scenario) -> LatencyProfile | None:
    """The scenario's latency profile, if its service times come from one."""
    if scenario.service.kind != "profile":
        return None
    return load_profile(scenario.service.path, extrapolate=scenario.service.extrapolate)


def model_spec(scenario: Scenario) -> dict[str, Any]:
    """What to run live: ``name``, ``params``, ``device``, ``dtype``, ``threads``.

    The scenario's ``model:`` section wins; otherwise the profile's recorded model.
    """
    spec: dict[str, Any] = {}
    profile = scenario_profile(scenario)
    if profile is not None and not profile.meta.get("synthetic"):
        spec = {"name": profile.model.get("name"),
                "params": dict(profile.model.get("params") or {}),
                "device": profile.device.get("kind", "cpu") if profile.device.get(
                    "kind") != "cuda" else f"cuda:{profile.device.get('index', 0)}",
                "dtype": profile.meta.get("dtype") or "fp32",
                "threads": profile.meta.get("threads")}
    if scenario.model is not None:
        spec.update({k: v for k, v in scenario.model.model_dump().items() if v is not None})
    if not spec.get("name"):
        raise LiveError("model: nothing to run live — the scenario's service is not a measured "
                        "profile (or is synthetic); add a model: {name: minilm|mlp|cnn|"
                        "module:factory} section or use a calibrated profile")
    return spec


def default_runners(scenario: Scenario) -> list[ModelRunner]:
    """One runner per replica, built from :func:`model_spec` (weights shared is not assumed)."""
    spec = model_spec(scenario)
    devices = spec.get("device", "auto")
    device_list = devices if isinstance(devices, list) and devices else [devices]
    runners = []
    for replica in range(scenario.replicas):
        runner = build_runner(spec["name"], device=str(device_list[replica % len(device_list)]),
                              dtype=spec.get("dtype", "fp32"), threads=spec.get("threads"),
                              params=spec.get("params") or {})
        runners.append(runner)
    return runners


def mismatch_warnings(scenario: Scenario, runners: Sequence[ModelRunner]) -> list[str]:
    """Differences between the profile's measurement and the live runner (device, threads,
    model): each one makes the simulator's prediction less trustworthy.
    """
    profile = scenario_profile(scenario)
    if profile is None:
        return []
    live = runners[0].describe()
    notes = []
    if profile.meta.get("synthetic"):
        notes.append("the profile is SYNTHETIC: predictions are not about this model")
    if profile.model.get("name") != live.get("model", {}).get("name"):
        notes.append(f"model: profile measured {profile.model.get('name')!r}, live runs "
                     f"{live.get('model', {}).get('name')!r}")
    if profile.device.get("kind") != live.get("device", {}).get("kind"):
        notes.append(f"device: profile measured on {profile.device}, live runs on "
                     f"{live.get('device')}")
    if profile.meta.get("threads") != live.get("threads"):
        notes.append(f"threads: profile measured with {profile.meta.get('threads')} CPU threads, "
                     f"live runs with {live.get('threads')}")
    return notes


def live(scenario: Scenario | dict[str, Any] | str | Path,
         overrides: list[str] | dict[str, Any] | None = None, *,
         runners: Sequence[ModelRunner] | None = None, batch_timeout_s: float | None = None,
         handle_sigint: bool = False, stop_mode: str = "drain",
         on_driver: Callable[[Any], None] | None = None) -> Result:
    """Run a scenario live and return the same :class:`Result` shape as ``sim.run``.

    Args:
        scenario: Scenario, dict, path or ``builtin:NAME``.
        overrides: Dotted-key overrides.
        runners: One model runner per replica (default: built from the profile's model).
        batch_timeout_s: Fail a batch's requests when its model call takes longer.
        handle_sigint: Ctrl-C stops the run (``stop_mode``: drain or abandon) instead of
            raising; the records so far are returned.
        stop_mode: What Ctrl-C does with queued work.
        on_driver: Called with the driver before it starts (tests use it to stop runs).
    """
    from executor.live import LiveDriver

    scn = load_scenario(scenario, overrides)
    streams = Streams.from_seed(scn.seed)
    estimate = build_service(scn, streams.service).median_s
    runner_list = list(runners) if runners is not None else default_runners(scn)
    warnings = mismatch_warnings(scn, runner_list)
    for note in warnings:
        LOG.warning("calibration mismatch: %s", note)
    core = build_core(scn, streams, estimate)
    streams_per_replica = scn.model is None or scn.model.cuda_streams == "per_replica"
    driver = LiveDriver(core, runner_list, batch_timeout_s=batch_timeout_s, seed=scn.seed,
                        stream_per_replica=streams_per_replica)
    if on_driver is not None:
        on_driver(driver)
    previous = None
    if handle_sigint and threading.current_thread() is threading.main_thread():
        def _on_sigint(signum: int, frame: FrameType | None) -> None:
            driver.stop(stop_mode)
        previous = signal.signal(signal.SIGINT, _on_sigint)
    t0 = time.perf_counter()
    try:
        end_s = driver.run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    counts = core.check_invariants()
    requests = core.table.to_frame(core.source.admitted)
    batches = core.batches.to_frame()
    queue = core.queue_series.to_frame()
    from sim.metrics import summarize

    summary = summarize(requests, batches, queue, window_for(scn, requests), driver="live")
    health = driver.health.summary()
    summary["executor_health"] = health
    described = runner_list[0].describe()
    meta = run_meta(scn, driver="live", device=described.get("device", {}), extra={
        "model": described.get("model"), "threads": described.get("threads"),
        "dtype": described.get("dtype"), "torch_version": described.get("torch_version"),
        "end_s": end_s, "wall_s": time.perf_counter() - t0, "status_counts": counts,
        "stopped_early": driver.stopped_early, "calibration_warnings": warnings,
        "executor_health": health})
    return Result(scn, summary, requests, batches, queue, meta)
