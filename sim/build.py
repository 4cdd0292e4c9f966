"""Turn a validated :class:`Scenario` into the objects a driver runs.

One plain mapping per family (``POLICIES`` in :mod:`sim.policies`, the dicts below); no
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

from calibration.errors import UserError
from calibration.profile import ProfileError, load_profile
from sim.autoscaling import Autoscaler, Concurrency, Schedule, TargetOngoing
from sim.fleet import ColdStart, Fleet
from sim.policies import POLICIES
from sim.routing import Router, make_router
from sim.scenario import Scenario, ScheduleAutoscalingCfg
from sim.service import (
    ConstantService,
    GammaService,
    LinearService,
    ProfileService,
    ServiceModel,
    exponential_service,
)
from sim.stability import capacity_rps
from sim.types import Policy
from sim.workloads import (
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


def scenario_capacity_rps(scenario: Scenario, service: ServiceModel,
                          mean_size: float = 1.0, requests: int | None = None) -> float:
    """Requests per second the scenario's fleet can finish at best (see
    :func:`sim.stability.capacity_rps`); ``requests``: the run's arrivals, which bound the
    batch sizes tried.
    """
    return capacity_rps(service.mean_s, policy_batch_sizes(scenario, requests),
                        scenario.fleet_size, scenario.policy.max_concurrent_batches, mean_size)


def sheds_load(scenario: Scenario) -> bool:
    """Whether something bounds the queue: a length bound, a request timeout, or a policy
    that drops requests it cannot serve in time.
    """
    q = scenario.queue
    return q.max_len is not None or q.timeout_ms is not None or scenario.policy.kind == "slo"


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
    knobs = _knobs(cfg, "control_period_s", "cold_start_s")
    if isinstance(cfg, ScheduleAutoscalingCfg):
        knobs["steps"] = [(float(t), int(n)) for t, n in cfg.steps]
    builder: Callable[..., Autoscaler] = AUTOSCALERS[cfg.kind]
    return Fleet(scenario.fleet_size, builder(**knobs), cfg.control_period_s)


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
