"""``sim.run(scenario) -> Result``: build, simulate, check invariants, summarise."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.drivers.contention import ContendedService
from sim.drivers.engine import SimPyDriver
from sim.drivers.proxy_stage import fifo_departures, outbound_departures
from sim.metrics.rundir import Result, fleet_tables, run_meta
from sim.metrics.summary import summarize, summary_from_folds
from sim.metrics.summary_sink import SummarySink
from sim.metrics.window import has_deadlines, planned_horizon_s, window_for
from sim.scenario.build import (
    Streams,
    build_cold_start,
    build_core,
    build_service,
    slo_s,
)
from sim.scenario.schema import Scenario, ScenarioError, check_run_args, load_scenario
from sim.scenario.service import ServiceModel
from sim.serving.records import (
    LEAN_RECORDS,
    RECORDS,
    BatchTable,
    Constant,
    QueueSeries,
    RequestTable,
    view,
)


def summary_fallback(scenario: Scenario) -> str | None:
    """Why a scenario's ``records: summary`` run keeps full records instead (None: it
    does not): the autoscaling metrics read every request's table row, and a closed loop
    bounded only by ``n_requests`` has no horizon before it ends.
    """
    if scenario.autoscaling is not None:
        return "autoscaled runs keep full records (their cold-start metrics read them)"
    if any(overheads_s(scenario, "request_ms", "proxy_in_ms", "proxy_out_ms")):
        return "runs with service.overheads keep full records (the overhead is added to them)"
    if scenario.workload.kind == "closed" and getattr(scenario.workload, "duration_s",
                                                      None) is None:
        return ("a closed loop bounded only by n_requests keeps full records (its window "
                "ends at the last send, unknown until then)")
    return None


def overheads_s(scenario: Scenario, *keys: str) -> tuple[float, ...]:
    """The scenario's ``service.overheads`` named by ``keys`` (ms fields), in s; 0 for a
    service without overheads or a key its kind does not take.
    """
    cfg = getattr(scenario.service, "overheads", None)
    return tuple(getattr(cfg, key, 0.0) / 1e3 for key in keys)


def run(scenario: Scenario | dict[str, Any] | str | Path,
        overrides: list[str] | dict[str, Any] | None = None, *,
        service_seed: int | None = None, drain_timeout_s: float | None = None,
        records: str | None = None,
        service: Callable[[ServiceModel], ServiceModel] | None = None) -> Result:
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
        records: ``full`` keeps the request, batch and queue tables; ``summary`` keeps
            only what the summary needs (the same summary; the tables of the result are
            empty), for sweeps and long runs; ``sketch`` is ``summary`` with the latency
            samples kept as a sketch (fixed memory; percentiles within a relative 3.05e-5
            or 1 ns, everything else as ``summary``); None: the scenario's ``records``. Autoscaled
            runs and closed loops bounded only by ``n_requests`` keep full records either
            way (meta.json says so).
        service: Wraps the scenario's service-time model (given it, returns the model to
            simulate with), e.g. a :class:`sim.scenario.service.ReplayService` of the batch
            times a live run measured, so that the simulation of that run uses them.

    Returns:
        The :class:`Result` (same seed: identical tables and summary).

    Raises:
        ScenarioError: the scenario is invalid.
        InvariantError: requests were lost (a bug).
    """
    if records is not None and records not in RECORDS:
        raise ScenarioError(f"records: {records!r} is not one of {list(RECORDS)}")
    check_run_args(service_seed=service_seed, drain_timeout_s=drain_timeout_s)
    scn = load_scenario(scenario, overrides)
    records = scn.records if records is None else records
    t0 = time.perf_counter()
    fallback = summary_fallback(scn) if records in LEAN_RECORDS else None
    kept = "full" if fallback else records
    streams = Streams.from_seed(scn.seed)
    if service_seed is not None:
        streams = dataclasses.replace(streams, service=np.random.default_rng(service_seed))
    model = build_service(scn, streams.service)
    if service is not None:
        model = service(model)
    core = build_core(scn, streams, model.median_s, records=kept)
    proxy_in_s, proxy_out_s = overheads_s(scn, "proxy_in_ms", "proxy_out_ms")
    client_arrival_s = None
    if proxy_in_s:  # the core sees each request when the proxy's inbound stage lets it go
        seen_s = view(core.table.arrival_s, core.table.n)
        client_arrival_s = seen_s.copy()
        seen_s[:] = fifo_departures(client_arrival_s, proxy_in_s)
    horizon_s = planned_horizon_s(scn, core)
    until_s = None
    if drain_timeout_s is not None and math.isfinite(horizon_s + drain_timeout_s):
        until_s = horizon_s + drain_timeout_s
    sink = None
    if kept in LEAN_RECORDS:
        sink = SummarySink(core, scn.warmup_s, horizon_s, slo_s(scn), has_deadlines(scn),
                           binned=kept == "sketch")
    cold = build_cold_start(scn, streams.cold_start) if core.fleet is not None else None
    arrival_busy_s, answer_busy_s = overheads_s(scn, "arrival_busy_ms",
                                                "answer_busy_ms")
    if arrival_busy_s or answer_busy_s:  # the front end's work lengthens the running batch
        model = ContendedService(model, view(core.table.arrival_s, core.table.n),
                                 arrival_busy_s, answer_busy_s)
    end_s = SimPyDriver(core, model, cold).run(until_s)
    counts = core.check_invariants()
    sim_wall_s = time.perf_counter() - t0
    admitted = core.source.admitted
    stop_s = end_s if until_s is not None else math.inf
    fleet = None
    if sink is not None:
        table = core.table
        columns = {"arrival_s": view(table.arrival_s, admitted)}
        if not isinstance(table.size, Constant):  # sizes that vary (else one item each)
            columns["size"] = view(table.size, admitted)
        arrivals = pd.DataFrame(columns, copy=False)
        window = window_for(scn, arrivals, model, end_s=stop_s)
        del arrivals
        sink.close(end_s=stop_s if math.isfinite(stop_s) else window.horizon_s)
        summary = summary_from_folds(sink.requests, sink.batches, sink.queue, window,
                                     driver="sim")
        requests = RequestTable().to_frame()
        batches = BatchTable().to_frame()
        queue = QueueSeries().to_frame()
    else:
        requests = core.table.to_frame(admitted)
        if client_arrival_s is not None:  # latency runs from the client's send
            requests["arrival_s"] = client_arrival_s[:admitted]
        if proxy_out_s:
            requests["finish_s"] = outbound_departures(requests["finish_s"].to_numpy(),
                                                       proxy_out_s)
        (overhead_s,) = overheads_s(scn, "request_ms")
        if overhead_s:  # the client sees each answer this much later; the queue does not
            requests["finish_s"] = requests["finish_s"] + overhead_s
        batches = core.batches.to_frame()
        queue = core.queue_series.to_frame()
        window = window_for(scn, requests, model, end_s=stop_s)
        fleet = fleet_tables(core)
        summary = summarize(requests, batches, queue, window, driver="sim", fleet=fleet)
    meta = run_meta(scn, driver="sim", device={"kind": "simulated", "service": repr(model)},
                    extra={"end_s": end_s, "wall_s": sim_wall_s, "status_counts": counts,
                           "service_seed": service_seed, "drain_timeout_s": drain_timeout_s,
                           "drain_s": max(0.0, end_s - window.horizon_s),
                           "records": kept,
                           **({"records_note": fallback} if fallback else {}),
                           "requests_per_wall_s": (admitted / sim_wall_s
                                                   if sim_wall_s > 0 else math.nan)})
    return Result(scn, summary, requests, batches, queue, meta,
                  *(fleet if fleet is not None else (None, None)))
