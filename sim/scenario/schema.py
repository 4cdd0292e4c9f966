"""Scenario files: YAML validated by pydantic, with errors that name the field.

The keys are a public contract (see the README): keys may be added, never renamed.
Every field has a default except what defines the experiment. Load with :func:`load_scenario`
(path, ``builtin:NAME``, or a dict) and change fields with dotted overrides
(``policy.max_batch_size=16``).
"""

from __future__ import annotations

import copy
import numbers
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.builtin import SCENARIOS, builtin_name, read_shipped, shipped
from sim.errors import UserError
from sim.scenario.payload import PayloadCfg


class ScenarioError(UserError):
    """A scenario is invalid; the message names each bad field and what is allowed."""


# Counts (requests, items, batch sizes, clients, tokens) are int64 wherever arrays hold them;
# a count above this is refused by the field that gives it. 2**53 - 1 is also the largest
# integer a float64 (a JSON number, a parquet float column) holds exactly.
MAX_COUNT = 2**53 - 1
# Above this coefficient of variation, gamma draws (shape 1/cv^2) underflow to exactly 0 for
# most samples (numpy draws U^(1/shape)): cv 100 makes 93 % of the draws 0.0.
MAX_CV = 10.0


class _Strict(BaseModel):
    # every float must be finite: .inf and .nan in a scenario are refused by name
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# -- service -----------------------------------------------------------------------------------
class OverheadsCfg(_Strict):
    """A per-request cost outside the server's queue and its replicas' busy time (BLIS's α
    term): the HTTP proxy, routing and the hops between them, measured from outside by
    ``servelab calibrate --endpoint``. Every request's latency grows by ``request_ms``; the
    queue and the batches do not see it (a fixed delay on the way in or out of an open-loop
    server leaves its queue as it was). The request table puts each answer ``request_ms``
    after its batch ended (so a request's ``service_ms`` includes it; the batch table's
    times and the utilisation do not). The LLM services add a per-output-token term and put
    the request overhead before the scheduler instead.
    """

    request_ms: float = Field(0.0, ge=0)


class LlmOverheadsCfg(OverheadsCfg):
    """Per-request costs outside the engine's steps (BLIS's α terms), measured from outside
    by ``servelab calibrate --endpoint`` or fitted by ``servelab fit --bench``: a request
    joins the scheduler ``request_ms`` after it arrives (API, tokenisation: BLIS's α₀), each
    output token after the first reaches the client ``per_output_token_ms`` later than the
    one before on top of the steps (detokenisation, streaming: BLIS's α₂), and the response
    completes ``post_decode_ms`` after its last token (BLIS's α₁; E2E only).
    """

    per_output_token_ms: float = Field(0.0, ge=0)
    post_decode_ms: float = Field(0.0, ge=0)


class RequestOverheadsCfg(OverheadsCfg):
    """The request-level overheads: ``request_ms`` (a pure delay) and an HTTP proxy in front
    of the replicas as a single-server FIFO stage (Ray Serve's proxy: one asyncio loop for
    every request): each request holds it ``proxy_in_ms`` before the replica's queue sees it
    and ``proxy_out_ms`` after its batch ends, so requests that reach it together queue
    there (``sim/drivers/proxy_stage.py``); and the server's front end taking time from its
    running batch (``sim/drivers/contention.py``): each request that arrives while a batch
    runs lengthens it by ``arrival_busy_ms``, and each answer of a batch lengthens the next
    by ``answer_busy_ms`` when that one starts at once (one replica only).
    """

    proxy_in_ms: float = Field(0.0, ge=0)
    proxy_out_ms: float = Field(0.0, ge=0)
    arrival_busy_ms: float = Field(0.0, ge=0)
    answer_busy_ms: float = Field(0.0, ge=0)


class ProfileServiceCfg(_Strict):
    """Bootstrap from a measured latency profile (``overheads``: added to each request's
    latency outside the queue, as ``calibrate --endpoint`` measured them).
    """

    kind: Literal["profile"] = "profile"
    path: str = "builtin:minilm-cpu"
    deterministic: bool = False
    extrapolate: bool = False
    overheads: RequestOverheadsCfg | None = None


class LinearServiceCfg(_Strict):
    """``base_ms + per_item_ms * items`` per batch, gamma noise with CV ``cv``."""

    kind: Literal["linear"]
    base_ms: float = Field(ge=0)
    per_item_ms: float = Field(ge=0)
    cv: float = Field(0.0, ge=0, le=MAX_CV)
    deterministic: bool = False


class ConstantServiceCfg(_Strict):
    """Every batch takes ``ms``."""

    kind: Literal["constant"]
    ms: float = Field(gt=0)
    deterministic: bool = False


class ExponentialServiceCfg(_Strict):
    """Exponential batch times with mean ``mean_ms``."""

    kind: Literal["exponential"]
    mean_ms: float = Field(gt=0)
    deterministic: bool = False


class GammaServiceCfg(_Strict):
    """Gamma batch times with mean ``mean_ms`` and CV ``cv``."""

    kind: Literal["gamma"]
    mean_ms: float = Field(gt=0)
    cv: float = Field(1.0, gt=0, le=MAX_CV)
    deterministic: bool = False


ServiceCfg = Annotated[
    ProfileServiceCfg | LinearServiceCfg | ConstantServiceCfg | ExponentialServiceCfg
    | GammaServiceCfg,
    Field(discriminator="kind"),
]


# -- workload ----------------------------------------------------------------------------------
class _Bounds(_Strict):
    duration_s: float | None = Field(None, gt=0)
    n_requests: int | None = Field(None, ge=1, le=MAX_COUNT)
    size: int = Field(1, ge=1, le=MAX_COUNT)
    priority_mix: list[float] | None = None

    @model_validator(mode="after")
    def _bounded(self) -> _Bounds:
        if self.duration_s is None and self.n_requests is None and not isinstance(
                self, TraceWorkloadCfg):
            raise ValueError("give duration_s or n_requests")
        if self.duration_s is not None and self.n_requests is not None:
            raise ValueError("workload: give duration_s or n_requests, not both (got "
                             f"duration_s {self.duration_s:g} and n_requests "
                             f"{self.n_requests}); --set one of them replaces the other")
        return self


class PoissonWorkloadCfg(_Bounds):
    """Poisson arrivals."""

    kind: Literal["poisson"]
    rate_rps: float = Field(gt=0)


class ConstantWorkloadCfg(_Bounds):
    """Evenly spaced arrivals."""

    kind: Literal["constant"]
    rate_rps: float = Field(gt=0)


class GammaWorkloadCfg(_Bounds):
    """Gamma inter-arrival gaps (burstiness ``cv``)."""

    kind: Literal["gamma"]
    rate_rps: float = Field(gt=0)
    cv: float = Field(1.0, gt=0, le=MAX_CV)


class MmppWorkloadCfg(_Bounds):
    """Markov-modulated Poisson bursts."""

    kind: Literal["mmpp"]
    rates_rps: list[Annotated[float, Field(ge=0)]] = Field(min_length=2)
    mean_dwell_s: list[Annotated[float, Field(gt=0)]] | Annotated[float, Field(gt=0)]


class SinusoidWorkloadCfg(_Bounds):
    """Poisson with a sinusoidal rate."""

    kind: Literal["sinusoid"]
    rate_rps: float = Field(gt=0)
    amplitude: float = Field(0.5, ge=0, le=1)
    period_s: float = Field(60.0, gt=0)


class TraceWorkloadCfg(_Bounds):
    """Trace replay from CSV."""

    kind: Literal["trace"]
    path: str
    timestamp_column: str = "TIMESTAMP"
    time_scale: float = Field(1.0, gt=0)
    rate_scale: float = Field(1.0, gt=0)
    size_column: str | None = None
    start_s: float = Field(0.0, ge=0)


class ClosedWorkloadCfg(_Bounds):
    """Closed loop: clients send, wait, think, send again."""

    kind: Literal["closed"]
    clients: int = Field(ge=1, le=MAX_COUNT)
    think_ms: float = Field(0.0, ge=0)
    think_cv: float = Field(1.0, ge=0, le=MAX_CV)


WorkloadCfg = Annotated[
    PoissonWorkloadCfg | ConstantWorkloadCfg | GammaWorkloadCfg | MmppWorkloadCfg
    | SinusoidWorkloadCfg | TraceWorkloadCfg | ClosedWorkloadCfg,
    Field(discriminator="kind"),
]


# -- policy ------------------------------------------------------------------------------------
class _PolicyBase(_Strict):
    max_concurrent_batches: int = Field(1, ge=1)


class NonePolicyCfg(_PolicyBase):
    """No batching."""

    kind: Literal["none"]


class GreedyPolicyCfg(_PolicyBase):
    """Take what is queued, up to max_batch_size."""

    kind: Literal["greedy"]
    max_batch_size: int = Field(8, ge=1, le=MAX_COUNT)


class FixedPolicyCfg(_PolicyBase):
    """Wait for exactly batch_size (optional timeout)."""

    kind: Literal["fixed"]
    batch_size: int = Field(8, ge=1, le=MAX_COUNT)
    timeout_ms: float | None = Field(None, ge=0)


class DynamicPolicyCfg(_PolicyBase):
    """Size-or-timeout dynamic batching."""

    kind: Literal["dynamic"]
    max_batch_size: int = Field(8, ge=1, le=MAX_COUNT)
    max_wait_ms: float = Field(2.0, ge=0)
    timer: Literal["request", "first", "arrival"] = "request"
    preferred_batch_sizes: list[Annotated[int, Field(ge=1, le=MAX_COUNT)]] = []

    @model_validator(mode="after")
    def _preferred_fit(self) -> DynamicPolicyCfg:
        too_big = [b for b in self.preferred_batch_sizes if b > self.max_batch_size]
        if too_big:
            raise ValueError(f"policy.preferred_batch_sizes: {max(too_big)} exceeds "
                             f"max_batch_size {self.max_batch_size}; each must lie in "
                             f"[1, {self.max_batch_size}]")
        return self


class AimdPolicyCfg(_PolicyBase):
    """Clipper AIMD batch-size control against slo_ms (batch service time)."""

    kind: Literal["aimd"]
    slo_ms: float = Field(50.0, gt=0)
    max_batch_size: int = Field(64, ge=1, le=MAX_COUNT)
    initial_batch_size: int = Field(1, ge=1, le=MAX_COUNT)
    additive_step: int = Field(1, ge=1, le=MAX_COUNT)
    backoff: float = Field(0.9, gt=0, lt=1)


class SloPolicyCfg(_PolicyBase):
    """Largest batch meeting the earliest deadline; drop the hopeless."""

    kind: Literal["slo"]
    max_batch_size: int = Field(32, ge=1, le=MAX_COUNT)


PolicyCfg = Annotated[
    NonePolicyCfg | GreedyPolicyCfg | FixedPolicyCfg | DynamicPolicyCfg | AimdPolicyCfg
    | SloPolicyCfg,
    Field(discriminator="kind"),
]


class RouterRetryCfg(_Strict):
    """How a router that holds requests retries them: Ray Serve 2.60's routing tasks and
    their back-off (``RAY_SERVE_ROUTER_RETRY_*``; ``sim.serving.router_tasks``).
    """

    initial_backoff_ms: float = Field(25.0, gt=0, le=3.6e6)
    backoff_multiplier: float = Field(2.0, ge=1, le=1e3)
    max_backoff_ms: float = Field(500.0, gt=0, le=3.6e6)
    tasks_per_replica: int = Field(2, ge=1, le=10_000)
    max_tasks: int = Field(50, ge=1, le=10_000)

    @model_validator(mode="after")
    def _check(self) -> RouterRetryCfg:
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise ValueError(f"queue.retry.max_backoff_ms: {self.max_backoff_ms} is below "
                             f"initial_backoff_ms ({self.initial_backoff_ms}); give a cap at "
                             "or above the first sleep")
        return self


class QueueCfg(_Strict):
    """Queue discipline and admission."""

    discipline: Literal["fifo", "priority", "edf"] = "fifo"
    max_len: int | None = Field(None, ge=1, le=MAX_COUNT)
    timeout_ms: float | None = Field(None, gt=0)
    # Ray Serve's max_ongoing_requests: a replica holds at most this many requests (queued +
    # running); an arrival that finds every replica it may go to full waits at the router
    # (FIFO) until one has room (sim.serving.admission); max_len then bounds that wait
    max_ongoing_requests: int | None = Field(None, ge=1, le=MAX_COUNT)
    # how the router retries what it holds: Ray Serve's routing tasks with back-off
    # (None: a held request goes on the moment a replica has room)
    retry: RouterRetryCfg | None = None

    @model_validator(mode="after")
    def _check_retry(self) -> QueueCfg:
        if self.retry is not None and self.max_ongoing_requests is None:
            raise ValueError("queue.retry: the router holds requests only with "
                             "queue.max_ongoing_requests; set it (Ray Serve's default is 5) "
                             "or leave queue.retry out")
        return self


class ModelCfg(_Strict):
    """What the live executor runs (default: the model recorded in the profile)."""

    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    device: str | list[str] | None = None  # a list: replica r runs on device[r % len]
    dtype: Literal["fp32", "fp16", "bf16"] | None = None
    cuda_streams: Literal["per_replica", "default"] = "per_replica"
    threads: int | None = Field(None, ge=1)


class RequestClassCfg(_Strict):
    """A request class: its share of the arrivals, its priority level and its own SLO."""

    name: str = Field(min_length=1)
    share: float = Field(gt=0, le=1)
    priority: int = Field(0, ge=0, le=127)
    slo_ms: float | None = Field(None, gt=0)


class _AutoscalingBase(_Strict):
    min_replicas: int = Field(1, ge=0, le=4096)
    max_replicas: int = Field(1, ge=1, le=4096)
    initial_replicas: int | None = Field(None, ge=0, le=4096)
    control_period_s: float = Field(1.0, gt=0)
    cold_start_s: float | None = Field(None, ge=0)

    @property
    def slots(self) -> int:
        """The most replicas starting or ready at once (``max_replicas``)."""
        return self.max_replicas

    @property
    def fleet_slots(self) -> int:
        """Replica slots the fleet needs: its most replicas, as each removed replica keeps
        its slot until it stops.
        """
        return self.slots

    @model_validator(mode="after")
    def _bounds(self) -> _AutoscalingBase:
        top = self.slots
        if self.min_replicas > top:
            raise ValueError(f"autoscaling.min_replicas: {self.min_replicas} is above "
                             f"max_replicas {top}")
        if self.initial_replicas is not None and not (
                self.min_replicas <= self.initial_replicas <= top):
            raise ValueError(f"autoscaling.initial_replicas: {self.initial_replicas} must lie "
                             f"in [min_replicas {self.min_replicas}, max_replicas {top}]")
        return self


class TargetAutoscalingCfg(_AutoscalingBase):
    """Ray Serve's target_ongoing_requests policy."""

    kind: Literal["target"]
    target_ongoing_requests: float = Field(2.0, gt=0)
    upscale_delay_s: float = Field(30.0, ge=0)
    downscale_delay_s: float = Field(600.0, ge=0)
    look_back_period_s: float = Field(30.0, gt=0)
    upscaling_factor: float = Field(1.0, gt=0)
    downscaling_factor: float = Field(1.0, gt=0)
    # Ray Serve's reduction of the ongoing total over the look-back window
    aggregation_function: Literal["mean", "max", "min"] = "mean"
    # Ray Serve's delay of the 1 -> 0 step (None: downscale_delay_s)
    downscale_to_zero_delay_s: float | None = Field(None, ge=0)
    # Ray Serve's deployment option: a removed replica first sleeps this long, then checks
    # for ongoing requests every this long, and shuts down at the first check that finds
    # none; None: it stops as soon as its work is done. At most an hour: the control loop
    # ticks on while a removed replica waits, so the run's cost grows with the wait (1e6 s
    # took 15 s, 1e18 s never ended)
    graceful_shutdown_wait_loop_s: float | None = Field(None, gt=0, le=3600)
    # Ray Serve's deployment option: a removed replica not stopped this long after its
    # removal is killed then; the requests it runs fail (reason ``shutdown``) and are not
    # retried; None: it is never killed. At most an hour, as the wait loop
    graceful_shutdown_timeout_s: float | None = Field(None, gt=0, le=3600)
    # which ready replica a scale-down removes: least_loaded (fewest requests queued, then
    # the highest slot) or newest (the one that became ready last, then the highest: Ray
    # Serve's order among the running replicas of one node)
    retire: Literal["least_loaded", "newest"] = "least_loaded"
    # Ray Serve counts a request as ongoing from its proxy's router until the proxy has the
    # answer: the path outside the replica too. Each request also counts this long after its
    # batch ends (0: only queued + running, the replica's own count)
    outside_ms: float = Field(0.0, ge=0, le=60_000)
    # true: a removed replica that is still draining (or polling) holds one of the
    # max_replicas slots until it stops, so a scale-up then waits for its stop. false (Ray
    # Serve 2.60: a STOPPING replica is not counted against max_replicas): a launch takes
    # another slot at once; up to max_replicas more slots are kept for removed replicas
    stopping_holds_slot: bool = True

    @property
    def fleet_slots(self) -> int:
        """Replica slots the fleet needs: ``max_replicas``, twice that when a stopping
        replica does not hold one of them (the extra ones hold replicas still stopping).
        """
        return self.max_replicas if self.stopping_holds_slot else 2 * self.max_replicas


class ConcurrencyAutoscalingCfg(_AutoscalingBase):
    """Knative's KPA on request concurrency (scale to zero with min_replicas 0)."""

    kind: Literal["concurrency"]
    min_replicas: int = Field(0, ge=0, le=4096)
    target_concurrency: float = Field(1.0, gt=0)
    stable_window_s: float = Field(60.0, gt=0)
    panic_window_s: float = Field(6.0, gt=0)
    panic_threshold: float = Field(2.0, gt=0)
    scale_to_zero_grace_s: float = Field(30.0, ge=0)

    @model_validator(mode="after")
    def _windows(self) -> ConcurrencyAutoscalingCfg:
        if self.panic_window_s > self.stable_window_s:
            raise ValueError(f"autoscaling.panic_window_s: {self.panic_window_s:g} s must not "
                             f"exceed stable_window_s {self.stable_window_s:g} s")
        return self


class ScheduleAutoscalingCfg(_AutoscalingBase):
    """Replica counts by time of day."""

    kind: Literal["schedule"]
    min_replicas: int = Field(0, ge=0, le=4096)
    max_replicas: int | None = Field(None, ge=1, le=4096)  # type: ignore[assignment]
    steps: list[tuple[Annotated[float, Field(ge=0)], Annotated[int, Field(ge=0)]]] = Field(
        min_length=1)
    period_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _steps(self) -> ScheduleAutoscalingCfg:
        starts = [t for t, _ in self.steps]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise ValueError("autoscaling.steps: start times must increase, e.g. "
                             "[[0, 1], [28800, 4], [72000, 1]]")
        top = max(n for _, n in self.steps)
        if self.max_replicas is not None and top > self.max_replicas:
            raise ValueError(f"autoscaling.steps: {top} replicas is above max_replicas "
                             f"{self.max_replicas}")
        if top == 0:
            raise ValueError("autoscaling.steps: at least one step needs a replica")
        if self.period_s is not None and starts[-1] >= self.period_s:
            raise ValueError(f"autoscaling.steps: a start of {starts[-1]:g} s is not inside "
                             f"period_s {self.period_s:g} s")
        return self

    @property
    def slots(self) -> int:
        """Replica slots the fleet needs (max_replicas, else the largest step)."""
        return self.max_replicas or max(n for _, n in self.steps)


AutoscalingCfg = Annotated[
    TargetAutoscalingCfg | ConcurrencyAutoscalingCfg | ScheduleAutoscalingCfg,
    Field(discriminator="kind"),
]


class Scenario(_Strict):
    """One experiment: where service times come from, arrivals, policy, queue, replicas."""

    name: str = "scenario"
    seed: int = Field(0, ge=0)
    service: ServiceCfg = Field(default_factory=ProfileServiceCfg)
    workload: WorkloadCfg
    policy: PolicyCfg
    queue: QueueCfg = Field(default_factory=QueueCfg)
    replicas: int = Field(1, ge=1, le=4096)
    routing: Literal["shared", "round_robin", "random", "jsq", "p2c", "least_work"] = "shared"
    warmup_s: float = Field(0.0, ge=0)
    slo_ms: float | None = Field(None, gt=0)
    price_per_replica_hour: float = Field(0.0, ge=0)
    model: ModelCfg | None = None
    classes: list[RequestClassCfg] | None = None
    autoscaling: AutoscalingCfg | None = None
    payload: PayloadCfg | None = None  # what bench sends a real server (sim.scenario.payload)
    # full: request, batch and queue tables; summary: only what the summary needs;
    # sketch: summary with the latency samples as fixed-size sketches
    records: Literal["full", "summary", "sketch"] = "full"

    @model_validator(mode="after")
    def _cross_checks(self) -> Scenario:
        if self.autoscaling is not None and "replicas" in self.model_fields_set and \
                self.replicas != 1:
            raise ValueError("replicas: an autoscaled scenario sizes its fleet with "
                             "autoscaling.min_replicas/max_replicas/initial_replicas; leave "
                             "replicas out")
        has_deadlines = self.slo_ms is not None or bool(
            self.classes and all(c.slo_ms is not None for c in self.classes))
        if self.policy.kind == "slo" and not has_deadlines:
            raise ValueError("slo_ms: policy.kind 'slo' needs slo_ms (the request deadline)")
        if self.queue.discipline == "edf" and not has_deadlines:
            raise ValueError("slo_ms: queue.discipline 'edf' needs slo_ms (deadlines), or an "
                             "slo_ms on every class")
        if self.classes is not None:
            self._check_classes(self.classes)
        if self.queue.max_ongoing_requests is not None and self.routing == "shared":
            raise ValueError("queue.max_ongoing_requests bounds each replica's own queue: set "
                             "routing to one of round_robin, random, jsq, p2c, least_work "
                             "(p2c is Ray Serve's router), not 'shared'")
        if self.workload.kind == "closed" and self.queue.max_len is not None and \
                getattr(self.workload, "think_ms", 0.0) == 0:
            raise ValueError("workload.think_ms: 0 with queue.max_len would have a rejected "
                             "client resend at the same instant for ever; give think_ms > 0 "
                             "or leave queue.max_len out")
        if getattr(self.service, "overheads", None) is not None and \
                self.workload.kind == "closed":
            raise ValueError("service.overheads: not available for workload.kind 'closed' "
                             "(a client's next send waits for the answer, so the overhead "
                             "would change the load); use an open-loop workload")
        over = getattr(self.service, "overheads", None)
        if over is not None and (over.arrival_busy_ms or over.answer_busy_ms) and (
                self.fleet_size != 1 or self.autoscaling is not None
                or getattr(self.policy, "max_concurrent_batches", 1) != 1):
            raise ValueError("service.overheads.arrival_busy_ms/answer_busy_ms: one replica "
                             "running one batch at a time only (replicas: 1, no "
                             "autoscaling, policy.max_concurrent_batches: 1): which replica "
                             "or batch a front end's work slows is not modelled")
        duration_s = getattr(self.workload, "duration_s", None)
        if duration_s is not None and self.warmup_s >= duration_s:
            raise ValueError(f"warmup_s: {self.warmup_s:g} s leaves nothing to measure of "
                             f"workload.duration_s {duration_s:g} s; it must be shorter")
        return self

    def _check_classes(self, classes: list[RequestClassCfg]) -> None:
        if not classes:
            raise ValueError("classes: give at least one class, or leave classes out")
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: names must be unique, got {names}")
        total = sum(c.share for c in classes)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"classes: the shares must sum to 1, got {total:g}")
        if self.workload.kind == "closed":
            raise ValueError("classes: not available for workload.kind 'closed' (the clients "
                             "send one kind of request); use an open-loop workload")
        if getattr(self.workload, "priority_mix", None) is not None:
            raise ValueError("classes: give either classes (with their priorities) or "
                             "workload.priority_mix, not both")

    @property
    def fleet_size(self) -> int:
        """Replica slots: ``replicas``, or the slots an autoscaled fleet needs
        (``autoscaling.fleet_slots``: more than its most replicas when removed replicas
        stop in extra slots).
        """
        return self.autoscaling.fleet_slots if self.autoscaling is not None else self.replicas

    @property
    def most_replicas(self) -> int:
        """The most replicas serving at once: ``replicas``, or the autoscaler's most."""
        return self.autoscaling.slots if self.autoscaling is not None else self.replicas

    def to_yaml(self) -> str:
        """The resolved scenario as YAML."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# -- errors ------------------------------------------------------------------------------------
_UNIONS: dict[str, Any] = {"service": ServiceCfg, "workload": WorkloadCfg, "policy": PolicyCfg,
                           "autoscaling": AutoscalingCfg}


def _tags(annotation: Any) -> dict[str, type[BaseModel]]:
    """Members of a discriminated union (``Annotated[A | B, Field(...)]``) by ``kind`` tag."""
    union = typing.get_args(annotation)[0]
    return {typing.get_args(m.model_fields["kind"].annotation)[0]: m
            for m in typing.get_args(union)}


def _split_loc(loc: tuple[Any, ...], root: type[BaseModel] | None = None,
               unions: dict[str, Any] | None = None,
               sections: dict[str, type[BaseModel]] | None = None,
               ) -> tuple[list[str], type[BaseModel] | None]:
    """The printed path (union tags removed) and the model that holds the last key."""
    root = Scenario if root is None else root
    unions = _UNIONS if unions is None else unions
    sections = {"queue": QueueCfg} if sections is None else sections
    parts = [str(p) for p in loc]
    model: type[BaseModel] | None = root
    if parts and parts[0] in unions:
        tags = _tags(unions[parts[0]])
        if len(parts) > 1 and parts[1] in tags:
            model = tags[parts[1]]
            parts = [parts[0], *parts[2:]]
            return parts, model if len(parts) == 2 else None
        return parts, None
    if len(parts) == 2 and parts[0] in sections:
        return parts, sections[parts[0]]
    return parts, root if len(parts) == 1 else None


def _format(error: dict[str, Any], root: type[BaseModel] | None = None,
            unions: dict[str, Any] | None = None,
            sections: dict[str, type[BaseModel]] | None = None) -> str:
    unions = _UNIONS if unions is None else unions
    parts, model = _split_loc(tuple(error["loc"]), root, unions, sections)
    path = ".".join(parts) or "scenario"
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = ", ".join(model.model_fields) if model is not None else "see the README"
        return f"{path}: unknown key; allowed keys here: {allowed}"
    if kind == "union_tag_invalid":
        ctx = error.get("ctx", {})
        return (f"{path}.kind: unknown value {ctx.get('tag')!r}; allowed: "
                f"{ctx.get('expected_tags')}")
    if kind == "union_tag_not_found":
        return f"{path}.kind: missing; allowed: {', '.join(_tags(unions[parts[0]]))}" \
            if parts and parts[0] in unions else f"{path}.kind: missing"
    if kind == "missing":
        return f"{path}: required field is missing"
    msg = str(error["msg"])
    if kind == "value_error":
        text = msg.removeprefix("Value error, ")
        return text if text.split(" ")[0].endswith(":") else f"{path}: {text}"
    return f"{path}: {msg} (got {error.get('input')!r})"


# A scenario is a few hundred values; YAML aliases (or a dict built in Python) can make a
# few lines stand for billions of them, or for a cycle. Beyond this many values it is refused.
MAX_SCENARIO_VALUES = 100_000


def check_plain_data(data: Any, where: str = "scenario") -> None:
    """Refuse a cyclic structure, or one that expands to more than
    :data:`MAX_SCENARIO_VALUES` values (a YAML alias bomb), before anything walks it.

    Sizes of shared sub-structures are counted once each (memoised by identity), so the
    check costs the size of the *written* structure, not of its expansion.

    Raises:
        ScenarioError: naming the first key that holds the cycle or the expansion.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: Any, path: str) -> int:
        if not isinstance(node, dict | list | tuple):
            return 1
        key = id(node)
        if key in on_path:
            raise ScenarioError(f"{path}: refers to itself (a cycle); a scenario holds plain "
                                "numbers, strings, lists and mappings")
        if key in sizes:
            return sizes[key]
        on_path.add(key)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        total = 1
        for k, child in items:
            total += size(child, f"{path}.{k}" if path else str(k))
            if total > MAX_SCENARIO_VALUES:
                raise ScenarioError(f"{path or where}: expands to more than "
                                    f"{MAX_SCENARIO_VALUES:,} values (YAML aliases *name "
                                    "repeating a large node?)")
        on_path.discard(key)
        sizes[key] = total
        return total

    size(data, "")


def validate_scenario(data: Any) -> Scenario:
    """Validate a scenario dict.

    Raises:
        ScenarioError: one line per problem, each naming the field and what is allowed.
    """
    if not isinstance(data, dict):
        raise ScenarioError("scenario: the top level must be a mapping of keys to values")
    check_plain_data(data)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError, root: type[BaseModel] | None = None,
                            unions: dict[str, Any] | None = None,
                            sections: dict[str, type[BaseModel]] | None = None) -> str:
    """Pydantic's errors as one line: each names its field and what is allowed.

    Args:
        exc: The validation error.
        root: The scenario model (default :class:`Scenario`).
        unions: Section name -> discriminated union (``kind`` tags), e.g. ``policy``.
        sections: Section name -> plain model, for "allowed keys" of unknown keys.
    """
    kept: list[dict[str, Any]] = []
    shape: dict[tuple[Any, ...], bool] = {}  # union field -> its input is a mapping
    labelled: list[tuple[tuple[Any, ...], bool, dict[str, Any]]] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        at = next((i for i, p in enumerate(loc) if _UNION_LABEL.fullmatch(str(p))), None)
        if at is None:
            kept.append(dict(error))
            continue
        # a plain union (a number or a mapping) reports once per member, each labelled in
        # its path ("constrained-int", "tagged-union[...]"): keep the member that matches
        # the input's shape, and drop the labels from the path
        field, mapping_member = loc[:at], "[" in str(loc[at])
        if len(loc) == at + 1:
            shape[field] = isinstance(error.get("input"), dict)
        bare = tuple(p for p in loc if not _UNION_LABEL.fullmatch(str(p)))
        labelled.append((field, mapping_member, {**error, "loc": bare}))
    for field, mapping_member, member_error in labelled:
        if shape.get(field, mapping_member) == mapping_member:
            kept.append(member_error)
    return "; ".join(sorted({_format(e, root, unions, sections) for e in kept}))


_UNION_LABEL = re.compile(r"[a-z]+-[a-z-]+(\[.*\])?|[a-z]+\[.*\]")


def check_run_args(*, service_seed: object = None, drain_timeout_s: object = None) -> None:
    """The run arguments beside the scenario, checked before anything runs.

    Raises:
        ScenarioError: naming the argument and what is allowed.
    """
    if service_seed is not None and (isinstance(service_seed, bool) or not isinstance(
            service_seed, numbers.Integral) or service_seed < 0):
        raise ScenarioError(f"service_seed: {service_seed!r} must be an integer >= 0 (or None)")
    if drain_timeout_s is not None and (isinstance(drain_timeout_s, bool) or not isinstance(
            drain_timeout_s, numbers.Real) or not (
            float(drain_timeout_s) >= 0)):  # nan fails too; inf drains every request
        raise ScenarioError(f"drain_timeout_s: {drain_timeout_s!r} must be a number of seconds "
                            ">= 0 (inf or None: drain every request)")


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped with servelab."""
    return shipped(SCENARIOS)


def read_scenario_dict(ref: str | Path) -> dict[str, Any]:
    """Read a scenario file (or ``builtin:NAME``) into a dict without validating it."""
    text_ref = str(ref)
    name = builtin_name(text_ref)
    if name is not None:
        text = read_shipped(SCENARIOS, name, builtin_scenarios(), lambda available: ScenarioError(
            f"scenario: unknown builtin {name!r}; available: {available}"))
    else:
        path = Path(text_ref)
        if not path.is_file():
            raise ScenarioError(f"scenario: file {text_ref!r} not found")
        text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario: {text_ref!r} is not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario: {text_ref!r} must hold a mapping of keys to values")
    check_plain_data(data)
    return data



_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _names_text(data: dict[str, Any], key: str) -> bool:
    """Whether ``key`` (dotted) holds text: a name, or a field the scenario already gives as
    a string (so ``--set name=1e5`` keeps the text a person typed).
    """
    parts = key.split(".")
    if parts[-1] == "name":
        return True
    node: Any = data
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return isinstance(node, str)


def cli_value(raw: str) -> Any:
    """A command-line value (``--set``, ``--grid``, ``--param``) read as YAML, with one
    exception: YAML 1.1 reads ``1e9`` and ``1.5e9`` (an exponent without a sign or without a
    dot) as strings, where a person typed a number; those are numbers here, as ``1e+9`` is
    in YAML.
    """
    value = yaml.safe_load(raw)
    if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
        return float(value)
    return value

def apply_overrides(data: dict[str, Any], overrides: list[str] | dict[str, Any], *,
                    unions: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted-key overrides applied.

    Args:
        data: Scenario dict.
        overrides: ``["policy.max_batch_size=16", ...]`` (values parsed as YAML scalars) or
            ``{"policy.max_batch_size": 16}``.
        unions: Section -> discriminated union whose ``kind`` switches prune the old kind's
            knobs (default: the request-level scenario's).
    """
    out = copy.deepcopy(data)
    items: list[tuple[str, Any]]
    if isinstance(overrides, dict):
        items = list(overrides.items())
        for key, _ in items:
            if not isinstance(key, str):
                raise ScenarioError(f"overrides: key {key!r} must be a dotted field name such "
                                    "as 'policy.max_batch_size'")
    else:
        items = []
        if isinstance(overrides, str):
            raise ScenarioError(f"overrides: give a list of KEY=VALUE strings or a dict, not "
                                f"the string {overrides!r}")
        for text in overrides:
            if not isinstance(text, str):
                raise ScenarioError(f"overrides: {text!r} is not a KEY=VALUE string")
            if "=" not in text:
                raise ScenarioError(f"--set {text!r}: expected KEY=VALUE, "
                                    "e.g. policy.max_batch_size=16")
            key, raw = text.split("=", 1)
            try:
                value = cli_value(raw)
                if isinstance(value, float) and _names_text(data, key.strip()):
                    value = yaml.safe_load(raw)  # "1e5" meant as text, as YAML reads it
            except yaml.YAMLError:
                value = raw
            items.append((key.strip(), value))
    explicit = {key for key, _ in items}
    for key, value in items:
        parts = key.split(".")
        if not all(parts):
            raise ScenarioError(f"--set {key!r}: empty part in the dotted key")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ScenarioError(f"{key}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    _prune_switched_kinds(out, explicit, _UNIONS if unions is None else unions)
    _replace_bound(out, explicit)
    return out


BOUNDS = ("duration_s", "n_requests")


def _replace_bound(data: dict[str, Any], explicit: set[str]) -> None:
    """``--set workload.n_requests=N`` on a scenario bounded by ``duration_s`` replaces that
    bound (and the other way round): a workload has one bound, and a scenario file that gives
    both is refused. Setting both explicitly keeps both (and gets that error).
    """
    node = data.get("workload")
    if not isinstance(node, dict):
        return
    for key, other in (BOUNDS, BOUNDS[::-1]):
        if f"workload.{key}" in explicit and node.get(key) is not None \
                and f"workload.{other}" not in explicit:
            node.pop(other, None)


def _prune_switched_kinds(data: dict[str, Any], explicit: set[str],
                          unions: dict[str, Any]) -> None:
    """After ``--set policy.kind=greedy``, drop the old kind's knobs that the new kind does
    not have (knobs set explicitly are kept, so typos still get an error).
    """
    for section, union in unions.items():
        node = data.get(section)
        if f"{section}.kind" not in explicit or not isinstance(node, dict):
            continue
        model = _tags(union).get(node.get("kind"))  # type: ignore[arg-type]
        if model is None:
            continue
        for key in list(node):
            if key not in model.model_fields and f"{section}.{key}" not in explicit:
                del node[key]


def load_scenario(source: str | Path | dict[str, Any] | Scenario,
                  overrides: list[str] | dict[str, Any] | None = None) -> Scenario:
    """Load and validate a scenario from a path, ``builtin:NAME``, a dict or a Scenario."""
    if isinstance(source, Scenario):
        if not overrides:
            return source
        data = source.model_dump(mode="json")
    elif isinstance(source, dict):
        data = source
    else:
        data = read_scenario_dict(source)
    if overrides:
        data = apply_overrides(data, overrides)
    return validate_scenario(data)

