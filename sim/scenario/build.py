"""Turn a validated :class:`Scenario` into the objects a driver runs.

One plain mapping per family (``POLICIES`` in :mod:`sim.serving.policies`, the dicts below); no
enums, no registries with classes of their own. Random streams: the scenario seed is split
with ``numpy.random.SeedSequence`` into independent streams for arrivals, service times,
routing and think times, so changing the policy never changes the arrival schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.profile import ProfileError, load_profile
from sim.errors import UserError
from sim.scenario.schema import RouterRetryCfg, Scenario, ScenarioError, ScheduleAutoscalingCfg
from sim.scenario.service import (
    ConstantService,
    GammaService,
    LinearService,
    ProfileService,
    ServiceModel,
    exponential_service,
)
from sim.scenario.workloads import (
    ArrivalSchedule,
    ClosedLoop,
    Constant,
    GammaArrivals,
    Mmpp,
    OpenLoop,
    Poisson,
    Sinusoid,
    Trace,
)
from sim.serving.autoscaling import Autoscaler, Concurrency, Schedule, TargetOngoing
from sim.serving.core import ClientSource, ScheduleSource, ServingCore
from sim.serving.fleet import ColdStart, Fleet
from sim.serving.policies import POLICIES
from sim.serving.records import RequestTable
from sim.serving.router_tasks import RetryConfig
from sim.serving.routing import Router, make_router
from sim.serving.types import Policy

WORKLOADS: dict[str, Callable[..., OpenLoop | ClosedLoop]] = {
    "poisson": Poisson,
    "constant": Constant,
    "gamma": GammaArrivals,
    "mmpp": Mmpp,
    "sinusoid": Sinusoid,
    "trace": Trace,
    "closed": ClosedLoop,
}

AUTOSCALERS: dict[str, Callable[..., Autoscaler]] = {
    "target": TargetOngoing,
    "concurrency": Concurrency,
    "schedule": Schedule,
}


@dataclass(frozen=True)
class Streams:
    """Independent random generators derived from the scenario seed."""

    arrivals: np.random.Generator
    service: np.random.Generator
    routing: np.random.Generator
    think: np.random.Generator
    classes: np.random.Generator
    cold_start: np.random.Generator

    @classmethod
    def from_seed(cls, seed: int) -> Streams:
        """Split ``seed`` into the six streams (the first ones as before the later ones
        existed: ``SeedSequence.spawn`` children depend only on their index).
        """
        gens = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(6)]
        return cls(*gens)


def _knobs(cfg: Any, *drop: str) -> dict[str, Any]:
    return {k: v for k, v in cfg.model_dump().items() if k not in {"kind", *drop}}


def build_service(scenario: Scenario, rng: np.random.Generator | None = None) -> ServiceModel:
    """The service-time model of the scenario."""
    cfg = scenario.service
    gen = rng if rng is not None else np.random.default_rng(0)
    if cfg.kind == "profile":
        try:
            profile = load_profile(cfg.path, extrapolate=cfg.extrapolate)
        except ProfileError as exc:
            text = str(exc)
            raise ProfileError(text if text.startswith("service.path") else
                               f"service.path: {text}") from None
        return ProfileService(profile, gen, cfg.deterministic)
    if cfg.kind == "linear":
        return LinearService(cfg.base_ms, cfg.per_item_ms, cfg.cv, gen, cfg.deterministic)
    if cfg.kind == "constant":
        return ConstantService(cfg.ms)
    if cfg.kind == "exponential":
        return exponential_service(cfg.mean_ms, gen, cfg.deterministic)
    return GammaService(cfg.mean_ms, cfg.cv, gen, cfg.deterministic)


def build_workload(scenario: Scenario) -> OpenLoop | ClosedLoop:
    """The workload object of the scenario."""
    cfg = scenario.workload
    knobs = _knobs(cfg)
    if cfg.kind == "closed":
        knobs.pop("priority_mix", None)
    return WORKLOADS[cfg.kind](**knobs)


def arrival_schedule(scenario: Scenario) -> ArrivalSchedule:
    """The open-loop arrival schedule the scenario's seed produces (what live replays)."""
    workload = build_workload(scenario)
    if isinstance(workload, ClosedLoop):
        raise UserError("workload.kind: 'closed' has no schedule fixed in advance; the "
                         "driver runs its clients")
    return workload.schedule(Streams.from_seed(scenario.seed).arrivals)


def build_policy(scenario: Scenario, estimate_s: Callable[[int], float]) -> Policy:
    """A fresh policy object (one per replica)."""
    cfg = scenario.policy
    knobs = _knobs(cfg)
    if cfg.kind == "fixed":
        knobs["batch_size"] = knobs.pop("batch_size")
    if cfg.kind == "slo":
        knobs["estimate_s"] = estimate_s
    policy: Policy = POLICIES[cfg.kind](**knobs)
    return policy


def max_batch_size(scenario: Scenario) -> int:
    """Largest batch the scenario's policy may form."""
    cfg = scenario.policy
    return int(getattr(cfg, "max_batch_size", getattr(cfg, "batch_size", 1)))


@dataclass(frozen=True)
class Classes:
    """Per-request class attributes drawn for an open-loop schedule."""

    name: list[str]
    priority: np.ndarray
    slo_s: np.ndarray  # inf: no SLO


def draw_classes(scenario: Scenario, n: int, rng: np.random.Generator) -> Classes | None:
    """Assign each of ``n`` requests a class by the scenario's shares (None: no classes)."""
    if not scenario.classes:
        return None
    shares = np.array([c.share for c in scenario.classes])
    pick = rng.choice(len(shares), size=n, p=shares / shares.sum())
    default = math.inf if scenario.slo_ms is None else scenario.slo_ms / 1e3
    slo = np.array([default if c.slo_ms is None else c.slo_ms / 1e3 for c in scenario.classes])
    names = [c.name for c in scenario.classes]
    return Classes([names[i] for i in pick],
                   np.array([c.priority for c in scenario.classes], np.int8)[pick], slo[pick])


def policy_batch_sizes(scenario: Scenario, requests: int | None = None) -> range:
    """The batch sizes (requests) the scenario's policy can form: up to ``max_batch_size``,
    and no larger than the run's ``requests`` when known (a max batch of 1e9 in a run of 200
    requests forms batches of at most 200; the range is sized by what is simulated).
    """
    cfg = scenario.policy
    if cfg.kind == "fixed":
        return range(cfg.batch_size, cfg.batch_size + 1)
    top = max_batch_size(scenario)
    if requests is not None:
        top = min(top, max(1, requests))
    return range(1, top + 1)


def sheds_load(scenario: Scenario) -> bool:
    """Whether something bounds the queue: a length bound, a request timeout, or a policy
    that drops requests it cannot serve in time.
    """
    q = scenario.queue
    return q.max_len is not None or q.timeout_ms is not None or scenario.policy.kind == "slo"


def slo_s(scenario: Scenario) -> float | None:
    """The scenario's latency objective in seconds (None: none)."""
    return None if scenario.slo_ms is None else scenario.slo_ms / 1e3


def build_router(scenario: Scenario, rng: np.random.Generator) -> Router | None:
    """The router (None for a shared queue)."""
    return make_router(scenario.routing, rng)




def build_fleet(scenario: Scenario | Any) -> Fleet | None:
    """The autoscaled fleet of a request-level or LLM scenario, with its autoscaling policy
    (None without ``autoscaling:``).
    """
    cfg = scenario.autoscaling
    if cfg is None:
        return None
    knobs = _knobs(cfg, "control_period_s", "cold_start_s", "graceful_shutdown_wait_loop_s",
                   "graceful_shutdown_timeout_s", "retire", "outside_ms",
                   "stopping_holds_slot")
    if isinstance(cfg, ScheduleAutoscalingCfg):
        knobs["steps"] = [(float(t), int(n)) for t, n in cfg.steps]
    builder: Callable[..., Autoscaler] = AUTOSCALERS[cfg.kind]
    return Fleet(scenario.fleet_size, builder(**knobs), cfg.control_period_s,
                 stop_poll_s=getattr(cfg, "graceful_shutdown_wait_loop_s", None),
                 outside_s=getattr(cfg, "outside_ms", 0.0) / 1e3,
                 retire_rule=getattr(cfg, "retire", "least_loaded"),
                 kill_after_s=getattr(cfg, "graceful_shutdown_timeout_s", None))


def build_cold_start(scenario: Scenario, rng: np.random.Generator) -> ColdStart:
    """Cold-start draws: the profile's measured load times when it has them, else
    ``autoscaling.cold_start_s``.

    Raises:
        UserError: an autoscaled scenario with neither.
    """
    cfg = scenario.autoscaling
    samples = np.empty(0)
    if scenario.service.kind == "profile":
        samples = load_profile(scenario.service.path).load_samples_s
    given = None if cfg is None else cfg.cold_start_s
    if cfg is not None and given is None and samples.size == 0:
        raise UserError("autoscaling.cold_start_s: the service has no measured cold starts "
                        "(calibrate with --load-reps); give the seconds a new replica needs "
                        "to load its model")
    return ColdStart(samples, given or 0.0, rng)


def build_core(scenario: Scenario, streams: Streams,
               estimate_s: Any, records: str = "full") -> ServingCore:
    """The serving core for a scenario (shared by the simulator and the live executor);
    ``records``: ``full``, ``summary`` or ``sketch`` (see
    :class:`sim.serving.records.RequestTable`).
    """
    workload = build_workload(scenario)
    slo = slo_s(scenario)
    router = build_router(scenario, streams.routing)
    lean = {"records": records, "shared": router is None}
    source: ScheduleSource | ClientSource
    if isinstance(workload, ClosedLoop):
        table = RequestTable(**lean)  # type: ignore[arg-type]
        source = ClientSource(table, workload.clients, workload.think_sampler(streams.think),
                              workload.size, workload.duration_s, workload.n_requests, slo)
    else:
        sched = workload.schedule(streams.arrivals)
        classes = draw_classes(scenario, sched.arrival_s.size, streams.classes)
        if classes is not None:
            table = RequestTable(sched.arrival_s, sched.size, classes.priority,
                                 sched.arrival_s + classes.slo_s, classes.name,
                                 **lean)  # type: ignore[arg-type]
        else:
            deadline = sched.arrival_s + slo if slo is not None else None
            table = RequestTable(sched.arrival_s, sched.size, sched.priority, deadline,
                                 sched.klass, **lean)  # type: ignore[arg-type]
        check_warmup(scenario, sched.arrival_s)
        source = ScheduleSource(table)
        del sched
    policies = [build_policy(scenario, estimate_s) for _ in range(scenario.fleet_size)]
    timeout_s = None if scenario.queue.timeout_ms is None else scenario.queue.timeout_ms / 1e3
    return ServingCore(table, source, policies, router=router,
                       discipline=scenario.queue.discipline, max_len=scenario.queue.max_len,
                       timeout_s=timeout_s, estimate_s=estimate_s, fleet=build_fleet(scenario),
                       max_ongoing=scenario.queue.max_ongoing_requests,
                       retry=router_retry(scenario.queue.retry))


def router_retry(cfg: RouterRetryCfg | None) -> RetryConfig | None:
    """The core's retry settings from the scenario's ``queue.retry`` (ms to s)."""
    if cfg is None:
        return None
    return RetryConfig(cfg.initial_backoff_ms / 1e3, cfg.backoff_multiplier,
                       cfg.max_backoff_ms / 1e3, cfg.tasks_per_replica, cfg.max_tasks)


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
