"""``sim.run(scenario) -> Result``: build, simulate, check invariants, summarise."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.build import (
    Streams,
    build_cold_start,
    build_fleet,
    build_policy,
    build_router,
    build_service,
    build_workload,
    draw_classes,
)
from sim.core import ClientSource, ScheduleSource, ServingCore
from sim.engine import SimPyDriver
from sim.metrics import summarize
from sim.records import RequestTable
from sim.rundir import run_meta, write_run_dir
from sim.scenario import Scenario, ScenarioError, load_scenario
from sim.window import planned_horizon_s, window_for
from sim.workloads import ClosedLoop


@dataclass
class Result:
    """A finished run: summary plus the record tables.

    Attributes:
        scenario: The resolved scenario.
        summary: Summary metrics (keys as in the design).
        requests: One row per request.
        batches: One row per batch.
        queue: Queue length step function.
        meta: Versions, host, seed, driver, wall time.
        replicas: Autoscaled runs: replica counts over time (``time_s, ready, starting,
            draining, replicas``); None otherwise.
        fleet_events: Autoscaled runs: ``time_s, replica, event``; None otherwise.
    """

    scenario: Scenario
    summary: dict[str, Any]
    requests: pd.DataFrame
    batches: pd.DataFrame
    queue: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    replicas: pd.DataFrame | None = None
    fleet_events: pd.DataFrame | None = None

    def write(self, out_dir: str | Path) -> Path:
        """Write the run directory (scenario, parquet tables, summary.json, meta.json)."""
        fleet = None if self.replicas is None or self.fleet_events is None else (
            self.replicas, self.fleet_events)
        return write_run_dir(out_dir, self.scenario, self.requests, self.batches, self.queue,
                             self.summary, self.meta, fleet)


def build_core(scenario: Scenario, streams: Streams,
               estimate_s: Any) -> ServingCore:
    """The serving core for a scenario (shared by the simulator and the live executor)."""
    workload = build_workload(scenario)
    slo_s = None if scenario.slo_ms is None else scenario.slo_ms / 1e3
    source: ScheduleSource | ClientSource
    if isinstance(workload, ClosedLoop):
        table = RequestTable()
        source = ClientSource(table, workload.clients, workload.think_sampler(streams.think),
                              workload.size, workload.duration_s, workload.n_requests, slo_s)
    else:
        sched = workload.schedule(streams.arrivals)
        classes = draw_classes(scenario, sched.arrival_s.size, streams.classes)
        if classes is not None:
            table = RequestTable(sched.arrival_s, sched.size, classes.priority,
                                 sched.arrival_s + classes.slo_s, classes.name)
        else:
            deadline = sched.arrival_s + slo_s if slo_s is not None else None
            table = RequestTable(sched.arrival_s, sched.size, sched.priority, deadline,
                                 sched.klass)
        check_warmup(scenario, sched.arrival_s)
        source = ScheduleSource(table)
    policies = [build_policy(scenario, estimate_s) for _ in range(scenario.fleet_size)]
    timeout_s = None if scenario.queue.timeout_ms is None else scenario.queue.timeout_ms / 1e3
    return ServingCore(table, source, policies, router=build_router(scenario, streams.routing),
                       discipline=scenario.queue.discipline, max_len=scenario.queue.max_len,
                       timeout_s=timeout_s, estimate_s=estimate_s, fleet=build_fleet(scenario))


def check_warmup(scenario: Scenario, arrival_s: np.ndarray) -> None:
    """Refuse a warm-up that leaves no arrival to measure (``n_requests`` workloads; the
    ``duration_s`` case is refused when the scenario is validated).

    Raises:
        ScenarioError: naming ``warmup_s`` and the last arrival.
    """
    if arrival_s.size and scenario.warmup_s > 0 and arrival_s[-1] < scenario.warmup_s:
        raise ScenarioError(f"warmup_s: {scenario.warmup_s:g} s is past the last arrival "
                            f"({arrival_s[-1]:.3g} s): nothing would be measured; shorten "
                            "warmup_s or send more requests")


def run(scenario: Scenario | dict[str, Any] | str | Path,
        overrides: list[str] | dict[str, Any] | None = None, *,
        service_seed: int | None = None, drain_timeout_s: float | None = None) -> Result:
    """Simulate a scenario.

    Args:
        scenario: A :class:`Scenario`, a dict, a YAML path, or ``builtin:NAME``.
        overrides: Dotted-key overrides, e.g. ``{"policy.max_batch_size": 16}``.
        service_seed: Draw service times from this seed instead of the scenario's, keeping
            its arrivals, routing and think times (replications on one arrival schedule, as
            ``compare`` uses them). Recorded in meta.json.
        drain_timeout_s: Stop this long after the horizon, leaving what is still queued or
            running unfinished (censored), as a live run with the same drain timeout does.
            None: drain every request.

    Returns:
        The :class:`Result` (same seed: identical tables and summary).

    Raises:
        ScenarioError: the scenario is invalid.
        InvariantError: requests were lost (a bug).
    """
    scn = load_scenario(scenario, overrides)
    t0 = time.perf_counter()
    streams = Streams.from_seed(scn.seed)
    if service_seed is not None:
        streams = dataclasses.replace(streams, service=np.random.default_rng(service_seed))
    service = build_service(scn, streams.service)
    core = build_core(scn, streams, service.median_s)
    until_s = None
    if drain_timeout_s is not None and math.isfinite(planned_horizon_s(scn, core)
                                                     + drain_timeout_s):
        until_s = planned_horizon_s(scn, core) + drain_timeout_s
    cold = build_cold_start(scn, streams.cold_start) if core.fleet is not None else None
    end_s = SimPyDriver(core, service, cold).run(until_s)
    counts = core.check_invariants()
    sim_wall_s = time.perf_counter() - t0
    requests = core.table.to_frame(core.source.admitted)
    batches = core.batches.to_frame()
    queue = core.queue_series.to_frame()
    window = window_for(scn, requests, service, end_s=end_s if until_s is not None else math.inf)
    fleet = fleet_tables(core)
    summary = summarize(requests, batches, queue, window, driver="sim", fleet=fleet)
    meta = run_meta(scn, driver="sim", device={"kind": "simulated", "service": repr(service)},
                    extra={"end_s": end_s, "wall_s": sim_wall_s, "status_counts": counts,
                           "service_seed": service_seed, "drain_timeout_s": drain_timeout_s,
                           "drain_s": max(0.0, end_s - window.horizon_s),
                           "requests_per_wall_s": (len(requests) / sim_wall_s
                                                   if sim_wall_s > 0 else math.nan)})
    return Result(scn, summary, requests, batches, queue, meta,
                  *(fleet if fleet is not None else (None, None)))


def fleet_tables(core: ServingCore) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The replica series and fleet events of an autoscaled core (None: fixed replicas)."""
    if core.fleet is None:
        return None
    return core.fleet.log.series(), core.fleet.log.event_frame()

