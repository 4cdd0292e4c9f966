"""Offered load of an LLM scenario against its capacity, and the arrival rate for a target ρ.

An iteration-level engine steps whenever it holds a sequence, so its busy fraction is near 1
long before it saturates and cannot serve as ρ. Here **capacity** is the request rate that
the configuration (step model, scheduler and its knobs, KV cache, replicas) sustains for the
scenario's token mix: the completion rate when the waiting queue never runs dry, measured by
simulating the scenario's own requests (repeated to ``n_requests``) all arriving at once and
counting completions between the 10th and the 90th percentile of the finish times (the ramp-up
and the drain are left out). **ρ** = offered request rate / capacity.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.drivers.llm_simulate import build_scheduler, build_step_model, llm_schedule, simulate
from sim.scenario.hash_workload import hash_workload
from sim.scenario.llm import LlmScenario
from sim.scenario.workloads import WorkloadError
from sim.serving.llm.core import LlmCore

RATE_KINDS = ("poisson", "constant", "gamma", "sinusoid")


def saturation_rps(scenario: LlmScenario, n_requests: int = 1000) -> float:
    """Requests per second the configuration completes with a never-empty queue. A
    ``hash_trace`` replays with its block ids, so with ``policy.enable_prefix_caching`` the
    capacity is the one at the trace's prefix sharing (cached tokens are not computed).

    Args:
        scenario: The LLM scenario (its requests give the token mix).
        n_requests: How many requests to saturate with (the scenario's, cycled).

    Raises:
        WorkloadError: the scenario has no requests.
    """
    core = saturated_core(scenario, n_requests)
    done = np.sort(core.finish_s[np.isfinite(core.finish_s)])
    lo, hi = int(0.1 * done.size), int(0.9 * done.size)
    span = float(done[hi - 1] - done[lo]) if hi - 1 > lo else 0.0
    return (hi - 1 - lo) / span if span > 0 else math.inf


def saturated_core(scenario: LlmScenario, n_requests: int = 1000) -> LlmCore:
    """The simulated engine core after the saturating replay of :func:`saturation_rps`: the
    scenario's requests cycled to ``n_requests``, all arriving at 0.

    Raises:
        WorkloadError: the scenario has no requests.
    """
    keys: list[tuple[int, ...]] | None = None
    trace_keys: list[tuple[int, ...]] = []
    if scenario.workload.kind == "hash_trace":
        _, prompt, output, trace_keys = hash_workload(scenario)
    else:
        _, prompt, output = llm_schedule(scenario)
    if prompt.size == 0:
        raise WorkloadError("workload: no requests in the window, so no token mix to load")
    reps = math.ceil(n_requests / prompt.size)
    prompt, output = np.tile(prompt, reps)[:n_requests], np.tile(output, reps)[:n_requests]
    if trace_keys:
        # each pass over the trace gets its own block contents (as bench's content seeds do):
        # the trace's sharing within a pass, none across passes, so the saturated replay
        # hits about as often as the trace does, not the second pass's 100%
        # (keys are interned ints from 0: pass r shifts them past every earlier pass's)
        span = 1 + max((b for k in trace_keys for b in k), default=0)
        keys = [tuple(b + rep * span for b in k)
                for rep in range(reps) for k in trace_keys][:n_requests]
    core = LlmCore(np.zeros(prompt.size), prompt, output,
                   [build_scheduler(scenario) for _ in range(scenario.replicas)],
                   routing=scenario.routing, block_keys=keys)
    simulate(core, build_step_model(scenario))
    return core


def offered_rps(scenario: LlmScenario) -> float:
    """The scenario's offered request rate: arrivals over the span they cover (``rate_rps``
    for the rate-driven processes).
    """
    rate = getattr(scenario.workload, "rate_rps", None)
    if rate is not None:
        return float(rate)
    schedule, _, _ = llm_schedule(scenario)
    span = getattr(scenario.workload, "duration_s", None) or (
        float(schedule.arrival_s[-1]) if len(schedule) else 0.0)
    return len(schedule) / span if span > 0 else math.inf


def load_overrides(scenario: LlmScenario, rho: float, capacity_rps: float) -> dict[str, Any]:
    """The workload overrides that offer ``rho`` × ``capacity_rps``: ``rate_rps`` for the
    rate-driven processes, ``time_scale`` (the trace's timing compressed or stretched, its
    pattern kept) for a trace.

    Raises:
        WorkloadError: ``rho`` not positive, or a workload without a single rate (mmpp).
    """
    if not (math.isfinite(rho) and rho > 0):
        raise WorkloadError(f"--sweep rho={rho}: must be a number > 0")
    target = rho * capacity_rps
    kind = scenario.workload.kind
    if kind in RATE_KINDS:
        return {"workload.rate_rps": target}
    if kind in ("trace", "hash_trace"):
        scale = float(getattr(scenario.workload, "time_scale", 1.0))
        return {"workload.time_scale": scale * offered_rps(scenario) / target}
    raise WorkloadError(f"workload.kind {kind!r}: a load sweep needs one of "
                        f"{', '.join((*RATE_KINDS, 'trace'))}")
