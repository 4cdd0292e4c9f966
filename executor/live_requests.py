"""``executor.live(scenario) -> Result``: run a scenario in real time against the real model.

The runner is built from the model recorded in the scenario's profile (or the scenario's
``model:`` section), on the recorded device and thread count. The arrival schedule, the
policies, the queues, the records and the metrics are the simulator's own
(:func:`sim.drivers.simulate.build_core`, :func:`sim.metrics.summary.summarize`), so a
difference between sim and live can only come from service times, timing and overheads.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from calibration.cold_start import load_replica
from calibration.model_runners import ModelRunner, build_runner
from calibration.profile import LatencyProfile, load_profile
from executor.lifecycle import (
    LiveError,
    check_batch_timeout_s,
    check_bounds,
    check_drain_timeout_s,
    default_drain_s,
    stop_on_signals,
)
from executor.live_budget import check_live_requests
from executor.request_driver import ReplicaLoader
from sim.metrics.rundir import Result, fleet_tables, run_meta
from sim.metrics.window import planned_horizon_s, window_for
from sim.scenario.build import Streams, build_core, build_fleet, build_service
from sim.scenario.schema import Scenario, load_scenario
from sim.serving.fleet import READY

LOG = logging.getLogger(__name__)

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


def replica_device(spec: dict[str, Any], replica: int) -> str:
    """The device replica ``replica`` runs on (``model.device``: one, or a list cycled)."""
    devices = spec.get("device", "auto")
    device_list = devices if isinstance(devices, list) and devices else [devices]
    return str(device_list[replica % len(device_list)])


def default_runners(scenario: Scenario) -> list[ModelRunner]:
    """One runner per replica, built from :func:`model_spec` (weights shared is not
    assumed); for an autoscaled scenario one per resident replica (``initial_replicas``).
    """
    spec = model_spec(scenario)
    count = scenario.replicas
    if scenario.autoscaling is not None:
        count = build_fleet(scenario).count(READY)  # type: ignore[union-attr]
    return [build_runner(spec["name"], device=replica_device(spec, r),
                         dtype=spec.get("dtype", "fp32"), threads=spec.get("threads"),
                         params=spec.get("params") or {}) for r in range(count)]


def replica_loader(scenario: Scenario) -> ReplicaLoader:
    """How a launched replica loads its model live (the real cold start, timed by
    :func:`calibration.cold_start.load_replica`).
    """
    spec = model_spec(scenario)

    def load(replica: int) -> tuple[ModelRunner, dict[str, float]]:
        return load_replica(spec["name"], device=replica_device(spec, replica),
                            dtype=spec.get("dtype", "fp32"), threads=spec.get("threads"),
                            params=spec.get("params") or {}, seed=replica)

    return load


def describe_runner(runner: ModelRunner) -> tuple[dict[str, Any], str | None]:
    """``runner.describe()``, or an empty description and the error when it raises (a run's
    records are never thrown away because a runner cannot describe itself).
    """
    try:
        described = runner.describe()
    except Exception as exc:
        return {}, f"describe() failed: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    return (described if isinstance(described, dict) else {}), None


def mismatch_warnings(scenario: Scenario, runners: Sequence[ModelRunner]) -> list[str]:
    """Differences between the profile's measurement and the live runner (device, threads,
    model): each one makes the simulator's prediction less trustworthy.
    """
    profile = scenario_profile(scenario)
    if profile is None:
        return []
    live, error = describe_runner(runners[0])
    notes = [error] if error else []
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


def check_live_bounds(prediction: Result, *, max_wall_s: float, repeats: int = 1,
                      extra_s_per_run: float = 0.0) -> float:
    """:func:`executor.lifecycle.check_bounds` of a request-level prediction (its horizon:
    the end less the drain it recorded).
    """
    end_s = float(prediction.meta["end_s"])
    return check_bounds(prediction.summary["stability"], end_s,
                        end_s - float(prediction.meta.get("drain_s", 0.0)),
                        max_wall_s=max_wall_s, repeats=repeats,
                        extra_s_per_run=extra_s_per_run,
                        lower="Lower workload.rate_rps, bound the queue (queue.max_len, "
                              "queue.timeout_ms)", shorten="workload.duration_s")


def live(scenario: Scenario | dict[str, Any] | str | Path,
         overrides: list[str] | dict[str, Any] | None = None, *,
         runners: Sequence[ModelRunner] | None = None, batch_timeout_s: float | None = None,
         handle_sigint: bool = False, stop_mode: str = "drain",
         on_driver: Callable[[Any], None] | None = None,
         drain_timeout_s: float | None = None, max_wall_s: float = 600.0,
         force: bool = True, loader: ReplicaLoader | None = None, yes: bool = False) -> Result:
    """Run a scenario live and return the same :class:`Result` shape as ``sim.run``.

    Args:
        scenario: Scenario, dict, path or ``builtin:NAME``.
        overrides: Dotted-key overrides.
        runners: One model runner per replica (default: built from the profile's model);
            for an autoscaled scenario one per resident replica (``initial_replicas``).
        loader: Autoscaled scenarios: how a launched replica loads its model (default:
            :func:`replica_loader`, the profile's model; tests pass stand-ins).
        batch_timeout_s: Fail a batch's requests when its model call takes longer (a finite
            number > 0).
        handle_sigint: Ctrl-C and SIGTERM stop the run (``stop_mode``: drain or abandon)
            instead of raising or killing the process; the records so far are returned. A
            second signal ends the run at once (see :mod:`executor.lifecycle`).
        stop_mode: What the first Ctrl-C or SIGTERM does with queued work.
        on_driver: Called with the driver before it starts (tests use it to stop runs).
        drain_timeout_s: Stop draining this long after the horizon (or after Ctrl-C); what is
            left stays in flight, counted as censored. Default: the window's length.
        max_wall_s: With ``force=False``: refuse when the predicted wall time exceeds this.
        force: Run without the stability and wall-time check (the API default; the CLI
            checks unless ``--force``).
        yes: Run even when the run would hold more memory than the budget
            (:mod:`executor.live_budget`: the records, and per replica its model and a
            batch); otherwise it is refused before any model is built.

    Raises:
        LiveError: with ``force=False``, the simulator predicts an unstable or too long run.
        sim.experiments.preflight.BudgetError: beyond the memory budget (unless ``yes``).
    """
    from executor.request_driver import LiveDriver

    check_batch_timeout_s(batch_timeout_s)
    if drain_timeout_s is not None:
        check_drain_timeout_s(drain_timeout_s)
    if math.isnan(max_wall_s) or max_wall_s <= 0:
        raise LiveError(f"--max-wall-s {max_wall_s:g}: must be a number of seconds > 0")
    scn = load_scenario(scenario, overrides)
    check_live_requests(scn, model_spec(scn) if runners is None else None, yes=yes)
    drain_s = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    if drain_s <= 0:
        raise LiveError(f"--drain-timeout-s {drain_s:g}: must be > 0")
    if not force:  # the bounds check predicts the run first: only then is simpy loaded
        from sim.drivers.simulate import run as sim_run

        check_live_bounds(sim_run(scn, drain_timeout_s=drain_s), max_wall_s=max_wall_s)
    streams = Streams.from_seed(scn.seed)
    service = build_service(scn, streams.service)
    estimate = service.median_s
    concurrent = scn.policy.max_concurrent_batches
    if concurrent > 1:
        raise LiveError(f"policy.max_concurrent_batches: {concurrent} cannot run live (a "
                        "replica's worker runs one batch at a time); use 1, or more replicas. "
                        "The simulator overlaps such batches without contention")
    runner_list = list(runners) if runners is not None else default_runners(scn)
    core = build_core(scn, streams, estimate)
    slots: list[ModelRunner | None] = list(runner_list)
    if core.fleet is not None:
        core.fleet.log.controls = []  # what the autoscaler saw at each tick, and when
        loader = loader if loader is not None else replica_loader(scn)
        resident = [r for r, state in enumerate(core.fleet.state) if state == READY]
        if len(runner_list) != len(resident):
            raise LiveError(f"runners: {len(runner_list)} given for {len(resident)} resident "
                            "replicas (autoscaling.initial_replicas)")
        slots = [None] * core.n_replicas
        for r, runner in zip(resident, runner_list, strict=True):
            slots[r] = runner
    warnings = mismatch_warnings(scn, runner_list) if runner_list else []
    for note in warnings:
        LOG.warning("calibration mismatch: %s", note)
    streams_per_replica = scn.model is None or scn.model.cuda_streams == "per_replica"
    driver = LiveDriver(core, slots, batch_timeout_s=batch_timeout_s, seed=scn.seed,
                        stream_per_replica=streams_per_replica,
                        drain_timeout_s=drain_s if math.isfinite(drain_s) else 30.0,
                        drain_until_s=planned_horizon_s(scn, core) + drain_s, loader=loader)
    if on_driver is not None:
        on_driver(driver)
    t0 = time.perf_counter()
    with stop_on_signals(driver, stop_mode, enabled=handle_sigint):
        end_s = driver.run()
    counts = core.check_invariants()
    requests = core.table.to_frame(core.source.admitted)
    batches = core.batches.to_frame()
    queue = core.queue_series.to_frame()
    from sim.metrics.summary import summarize

    window = window_for(scn, requests, service, end_s=end_s, stopped_s=driver.stopped_at_s)
    fleet = fleet_tables(core)
    summary = summarize(requests, batches, queue, window, driver="live", fleet=fleet)
    health = driver.health.summary()
    summary["executor_health"] = health
    described, describe_error = describe_runner(runner_list[0]) if runner_list else ({}, None)
    meta = run_meta(scn, driver="live", device=described.get("device", {}), extra={
        "model": described.get("model"), "threads": described.get("threads"),
        "dtype": described.get("dtype"), "torch_version": described.get("torch_version"),
        "end_s": end_s, "wall_s": time.perf_counter() - t0, "status_counts": counts,
        "stopped_early": driver.stopped_early, "stopped_s": driver.stopped_at_s,
        "stopped_by": driver.stopped_by if driver.stopped_early else None,
        "unfinished_batches": driver.unfinished_batches,
        "calibration_warnings": warnings,
        "drain_timeout_s": drain_s, "drain_timed_out": driver.drain_timed_out,
        "fatal_error": driver.fatal_error, "describe_error": describe_error,
        "executor_health": health, "cold_starts_measured_s": driver.load_phases_s})
    return Result(scn, summary, requests, batches, queue, meta,
                  *(fleet if fleet is not None else (None, None)))
