"""LLM scenario files: the request-level scenario's arrivals and conventions, with token
lengths, an iteration-level scheduler and a step-time service.

A scenario is an LLM scenario when its ``service.kind`` is ``llm_linear``, ``llm_profile`` or
``llm_roofline``;
:func:`is_llm_data` tells, and the CLI and the experiment layer send it here. Keys (a
public contract):

* ``workload``: any open-loop arrival process of the request-level scenarios plus
  ``prompt_tokens`` and ``output_tokens`` (a number, or ``{dist: constant|uniform|lognormal|
  empirical, ...}``), or for a ``trace`` ``prompt_tokens_column``/``output_tokens_column``
  (truncated to ``prompt_tokens_max``/``output_tokens_max`` when given); or ``hash_trace``
  (``path``, ``format``, ``block_size``): a Bailian/Mooncake/CSV hash-block trace;
* ``service``: ``llm_linear`` (``base_ms``, ``per_prefill_token_ms``, ``per_decode_seq_ms``,
  ``per_kv_token_ms``, ``per_prefill_context_ms``, ``per_prefill_sq_ms``,
  ``per_prefill_seq_ms``), ``llm_profile`` (``path``: a measured
  step profile) or ``llm_roofline``
  (``model``, ``device``, ``tp``, ``coefficients``: see :mod:`sim.scenario.roofline.service`);
* ``policy``: ``static``, ``continuous``, ``vllm`` or ``sarathi`` with vLLM's knob names;
* ``slo``: ``ttft_ms`` and/or ``tpot_ms`` (goodput counts requests meeting every one set);
* ``policy.enable_prefix_caching`` (vllm, sarathi; default off) and ``routing:
  prefix_affinity`` with ``prefix_affinity: {balance_abs_threshold, balance_rel_threshold,
  cache_threshold}``.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from sim.scenario.roofline.service import LlmRooflineServiceCfg, prepare_roofline
from sim.scenario.schema import (
    MAX_COUNT,
    MAX_CV,
    AutoscalingCfg,
    ConstantWorkloadCfg,
    GammaWorkloadCfg,
    LlmOverheadsCfg,
    MmppWorkloadCfg,
    PoissonWorkloadCfg,
    ScenarioError,
    SinusoidWorkloadCfg,
    TraceWorkloadCfg,
    _Strict,
    apply_overrides,
    check_plain_data,
    format_validation_error,
    read_scenario_dict,
)

LLM_SERVICE_KINDS = ("llm_linear", "llm_profile", "llm_roofline")


# -- token lengths -----------------------------------------------------------------------------
class ConstantTokens(_Strict):
    """Every request has ``value`` tokens."""

    dist: Literal["constant"]
    value: int = Field(ge=1, le=MAX_COUNT)


class UniformTokens(_Strict):
    """Integers uniform on [low, high]."""

    dist: Literal["uniform"]
    low: int = Field(ge=1, le=MAX_COUNT)
    high: int = Field(ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _ordered(self) -> UniformTokens:
        if self.high < self.low:
            raise ValueError(f"high: must be >= low ({self.low}), got {self.high}")
        return self


class LognormalTokens(_Strict):
    """Lognormal with the given mean and coefficient of variation, rounded, at least 1."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0, le=MAX_COUNT)
    cv: float = Field(1.0, gt=0, le=MAX_CV)
    max: int | None = Field(None, ge=1, le=MAX_COUNT)


class EmpiricalTokens(_Strict):
    """Resampled (with replacement) from a CSV column."""

    dist: Literal["empirical"]
    path: str
    column: str


TokenDist = Annotated[ConstantTokens | UniformTokens | LognormalTokens | EmpiricalTokens,
                      Field(discriminator="dist")]
TokenSpec = Annotated[int, Field(ge=1, le=MAX_COUNT)] | TokenDist


class _Tokens(_Strict):
    prompt_tokens: TokenSpec | None = None
    output_tokens: TokenSpec | None = None

    @model_validator(mode="after")
    def _given(self) -> _Tokens:
        for name in ("prompt_tokens", "output_tokens"):
            if getattr(self, name) is None and getattr(self, f"{name}_column", None) is None:
                raise ValueError(f"workload.{name}: required for an LLM workload (a number or "
                                 "{dist: constant|uniform|lognormal|empirical, ...}"
                                 + (f", or {name}_column for a trace)" if isinstance(
                                     self, LlmTraceCfg) else ")"))
        return self


class LlmPoissonCfg(PoissonWorkloadCfg, _Tokens):
    """Poisson arrivals of LLM requests."""


class LlmConstantCfg(ConstantWorkloadCfg, _Tokens):
    """Evenly spaced LLM requests."""


class LlmGammaCfg(GammaWorkloadCfg, _Tokens):
    """Gamma inter-arrival gaps."""


class LlmMmppCfg(MmppWorkloadCfg, _Tokens):
    """Markov-modulated Poisson bursts."""


class LlmSinusoidCfg(SinusoidWorkloadCfg, _Tokens):
    """Poisson with a sinusoidal rate."""


class LlmTraceCfg(TraceWorkloadCfg, _Tokens):
    """Trace replay; token lengths from its columns (e.g. the Azure LLM trace's
    ``ContextTokens`` and ``GeneratedTokens``) or from distributions.
    """

    prompt_tokens_column: str | None = None
    output_tokens_column: str | None = None
    prompt_tokens_max: int | None = Field(None, ge=1, le=MAX_COUNT)
    output_tokens_max: int | None = Field(None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _max_needs_column(self) -> LlmTraceCfg:
        for name in ("prompt_tokens", "output_tokens"):
            if getattr(self, f"{name}_max") is not None and \
                    getattr(self, f"{name}_column") is None:
                raise ValueError(f"workload.{name}_max: truncates {name}_column, which is not "
                                 f"given (a distribution takes its own max)")
        return self


class HashTraceCfg(_Strict):
    """A hash-block trace (Qwen-Bailian, Mooncake, or a CSV with ``hash_ids``): arrivals,
    token lengths and prefix sharing all from the file (:mod:`sim.scenario.hash_trace`).
    """

    kind: Literal["hash_trace"]
    path: str
    format: Literal["auto", "bailian", "mooncake", "csv"] = "auto"
    block_size: int | None = Field(None, ge=1)  # tokens per hash id (default: the format's)
    time_scale: float = Field(1.0, gt=0)  # arrival times multiplied by this
    start_s: float = Field(0.0, ge=0)  # skip what arrives before this trace time
    duration_s: float | None = Field(None, gt=0)  # keep this many seconds of trace (scaled)
    n_requests: int | None = Field(None, ge=1)  # keep the first this many


LlmWorkloadCfg = Annotated[
    LlmPoissonCfg | LlmConstantCfg | LlmGammaCfg | LlmMmppCfg | LlmSinusoidCfg | LlmTraceCfg
    | HashTraceCfg,
    Field(discriminator="kind"),
]


# -- service -----------------------------------------------------------------------------------
class LlmLinearServiceCfg(_Strict):
    """Step time = base + per prefill token + per decode sequence + per KV token attended."""

    kind: Literal["llm_linear"]
    base_ms: float = Field(ge=0)
    per_prefill_token_ms: float = Field(0.0, ge=0)
    per_decode_seq_ms: float = Field(0.0, ge=0)
    per_kv_token_ms: float = Field(0.0, ge=0)
    # a prefill chunk's attention to its cached prefix: per (chunk token × its start)
    per_prefill_context_ms: float = Field(0.0, ge=0)
    # a chunk's causal attention within itself: per Σ chunk tokens² (n²/2 pairs each)
    per_prefill_sq_ms: float = Field(0.0, ge=0)
    # a fixed cost per prefill chunk in the step (the prefill path's, beyond the step base)
    per_prefill_seq_ms: float = Field(0.0, ge=0)
    overheads: LlmOverheadsCfg | None = None


class LlmProfileServiceCfg(_Strict):
    """A step profile measured on a real decoder (``servelab calibrate --model llm``):
    interpolated medians on its grid, its linear fit outside it.
    """

    kind: Literal["llm_profile"]
    path: str
    overheads: LlmOverheadsCfg | None = None


LlmServiceCfg = Annotated[LlmLinearServiceCfg | LlmProfileServiceCfg | LlmRooflineServiceCfg,
                          Field(discriminator="kind")]


# -- schedulers --------------------------------------------------------------------------------
class _KvCfg(_Strict):
    block_size: int = Field(16, ge=1, le=MAX_COUNT)
    num_gpu_blocks: int | None = Field(None, ge=1, le=MAX_COUNT)
    gpu_memory_gb: float | None = Field(None, gt=0)
    kv_bytes_per_token: int | None = Field(None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _kv_given(self) -> _KvCfg:
        if self.num_gpu_blocks is None and (self.gpu_memory_gb is None
                                            or self.kv_bytes_per_token is None):
            raise ValueError("policy.num_gpu_blocks: give it, or gpu_memory_gb (memory for the "
                             "KV cache) and kv_bytes_per_token (the model's KV bytes per token: "
                             "2 × layers × kv_heads × head_dim × dtype bytes)")
        if self.num_gpu_blocks is not None and self.gpu_memory_gb is not None:
            raise ValueError("policy.num_gpu_blocks: give either num_gpu_blocks or "
                             "gpu_memory_gb, not both")
        if self.gpu_memory_gb is not None and self.kv_bytes_per_token is not None:
            blocks = self.gpu_memory_gb * 2**30 / (self.block_size * self.kv_bytes_per_token)
            if not blocks <= MAX_COUNT:  # also inf
                raise ValueError(f"policy.gpu_memory_gb: {self.gpu_memory_gb:g} GB makes "
                                 f"{blocks:.3g} KV blocks, above {MAX_COUNT}")
        return self

    def blocks(self) -> int:
        """The number of KV blocks: given, or memory // (block_size × bytes per token)."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        assert self.gpu_memory_gb is not None
        assert self.kv_bytes_per_token is not None
        return max(1, int(self.gpu_memory_gb * 2**30
                          // (self.block_size * self.kv_bytes_per_token)))


class _BudgetCfg(_KvCfg):
    max_num_seqs: int = Field(256, ge=1, le=MAX_COUNT)
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _budget_holds_the_seqs(self) -> _BudgetCfg:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"policy.max_num_batched_tokens: {self.max_num_batched_tokens} "
                             f"is below max_num_seqs {self.max_num_seqs}; a step must hold "
                             "one decode token per sequence (vLLM refuses this too)")
        return self


class StaticPolicyCfg(_Strict):
    """Request-level batching of whole generations (size-or-timeout admission)."""

    kind: Literal["static"]
    max_batch_size: int = Field(8, ge=1, le=MAX_COUNT)
    max_wait_ms: float = Field(0.0, ge=0)


class ContinuousPolicyCfg(_BudgetCfg):
    """Orca: iteration-level admission, KV reserved for prompt + output at admission."""

    kind: Literal["continuous"]


class VllmPolicyCfg(_BudgetCfg):
    """vLLM V1's scheduler: paged KV, running first, preemption by recompute."""

    kind: Literal["vllm"]
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_COUNT)
    prefill_first: bool = False
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    enable_prefix_caching: bool = False  # vLLM's default is on; off keeps earlier results


class SarathiPolicyCfg(_BudgetCfg):
    """Sarathi-Serve: decodes first, then prefill chunks, within a fixed per-step budget."""

    kind: Literal["sarathi"]
    max_num_batched_tokens: int = Field(512, ge=1, le=MAX_COUNT)
    enable_prefix_caching: bool = False


LlmPolicyCfg = Annotated[
    StaticPolicyCfg | ContinuousPolicyCfg | VllmPolicyCfg | SarathiPolicyCfg,
    Field(discriminator="kind"),
]


class LlmSloCfg(_Strict):
    """Latency objectives; goodput counts completions meeting every one that is set."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)


class PrefixAffinityCfg(_Strict):
    """``routing: prefix_affinity``'s knobs (:mod:`sim.serving.llm.affinity`)."""

    balance_abs_threshold: int = Field(8, ge=0)
    balance_rel_threshold: float = Field(1.5, ge=1)
    cache_threshold: float = Field(0.5, ge=0, le=1)


class LlmModelCfg(_Strict):
    """The decoder a live run executes (default: the one the step profile measured)."""

    params: dict[str, Any] = Field(default_factory=dict)  # shape: small|1b|8b, and sizes
    device: str | None = None
    dtype: Literal["fp32", "fp16", "bf16"] | None = None
    threads: int | None = Field(None, ge=1)


class LlmScenario(_Strict):
    """One LLM serving experiment."""

    name: str = "llm-scenario"
    seed: int = Field(0, ge=0)
    service: LlmServiceCfg
    workload: LlmWorkloadCfg
    policy: LlmPolicyCfg
    warmup_s: float = Field(0.0, ge=0)
    slo: LlmSloCfg = Field(default_factory=LlmSloCfg)
    replicas: int = Field(1, ge=1, le=4096)
    routing: Literal["jsq", "round_robin", "prefix_affinity"] = "jsq"
    prefix_affinity: PrefixAffinityCfg = Field(default_factory=PrefixAffinityCfg)
    model: LlmModelCfg | None = None
    price_per_replica_hour: float = Field(0.0, ge=0)
    autoscaling: AutoscalingCfg | None = None

    @property
    def fleet_size(self) -> int:
        """Engine slots: ``replicas``, or the autoscaler's most replicas."""
        return self.autoscaling.slots if self.autoscaling is not None else self.replicas

    @model_validator(mode="after")
    def _cross_checks(self) -> LlmScenario:
        if self.autoscaling is not None:
            if "replicas" in self.model_fields_set and self.replicas != 1:
                raise ValueError("replicas: an autoscaled scenario sizes its fleet with "
                                 "autoscaling.min_replicas/max_replicas/initial_replicas; "
                                 "leave replicas out")
            if self.autoscaling.cold_start_s is None:
                raise ValueError("autoscaling.cold_start_s: an LLM engine's cold start is not "
                                 "in its step profile; give the seconds a new engine needs "
                                 "to load its model")
            if getattr(self.autoscaling, "graceful_shutdown_wait_loop_s", None) is not None:
                raise ValueError("autoscaling.graceful_shutdown_wait_loop_s: not modelled for "
                                 "LLM engines (a removed engine stops when its sequences "
                                 "finish); leave it out")
            if getattr(self.autoscaling, "graceful_shutdown_timeout_s", None) is not None:
                raise ValueError("autoscaling.graceful_shutdown_timeout_s: not modelled for "
                                 "LLM engines (a removed engine stops when its sequences "
                                 "finish, never killed); leave it out")
            if not getattr(self.autoscaling, "stopping_holds_slot", True):
                raise ValueError("autoscaling.stopping_holds_slot: false is not modelled for "
                                 "LLM engines (a removed engine holds its slot until its "
                                 "sequences finish); leave it out")
            if getattr(self.autoscaling, "outside_ms", 0.0):
                raise ValueError("autoscaling.outside_ms: not modelled for LLM engines (their "
                                 "autoscaler counts the engines' own sequences); leave it out")
        if self.routing == "prefix_affinity" and not getattr(
                self.policy, "enable_prefix_caching", False):
            raise ValueError("routing: prefix_affinity follows cached prefixes; it needs "
                             "policy.enable_prefix_caching: true (kind vllm or sarathi)")
        duration_s = getattr(self.workload, "duration_s", None)
        if duration_s is not None and self.warmup_s >= duration_s:
            raise ValueError(f"warmup_s: {self.warmup_s:g} s leaves nothing to measure of "
                             f"workload.duration_s {duration_s:g} s; it must be shorter")
        return self

    def to_yaml(self) -> str:
        """The resolved scenario as YAML."""
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)


_UNIONS: dict[str, Any] = {"service": LlmServiceCfg, "workload": LlmWorkloadCfg,
                           "policy": LlmPolicyCfg, "autoscaling": AutoscalingCfg}
_SECTIONS: dict[str, type[BaseModel]] = {"slo": LlmSloCfg, "model": LlmModelCfg,
                                         "prefix_affinity": PrefixAffinityCfg}


def is_llm_data(data: Any) -> bool:
    """Whether a scenario dict describes an LLM scenario (its service kind is ``llm_*``)."""
    service = data.get("service") if isinstance(data, dict) else None
    return isinstance(service, dict) and str(service.get("kind", "")).startswith("llm_")


def validate_llm_scenario(data: Any) -> LlmScenario:
    """Validate an LLM scenario dict.

    Raises:
        ScenarioError: one line per problem, each naming the field and what is allowed.
    """
    if not isinstance(data, dict):
        raise ScenarioError("scenario: the top level must be a mapping of keys to values")
    check_plain_data(data)
    if isinstance(data.get("service"), dict) and data["service"].get("kind") not in (
            *LLM_SERVICE_KINDS, None):
        raise ScenarioError(f"service.kind: {data['service'].get('kind')!r} is not an LLM "
                            f"service; allowed: {', '.join(LLM_SERVICE_KINDS)}")
    data = prepare_roofline(data)  # checks its files; sizes the KV cache as vLLM does
    try:
        return LlmScenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, LlmScenario, _UNIONS,
                                                    _SECTIONS)) from None


def load_llm_scenario(source: str | Path | dict[str, Any] | LlmScenario,
                      overrides: list[str] | dict[str, Any] | None = None) -> LlmScenario:
    """Load and validate an LLM scenario from a path, ``builtin:NAME``, a dict or a model."""
    if isinstance(source, LlmScenario):
        if not overrides:
            return source
        data = source.model_dump(mode="json", exclude_none=True)
    elif isinstance(source, dict):
        data = source
    else:
        data = read_scenario_dict(source)
    if overrides:
        data = apply_overrides(data, overrides, unions=_UNIONS)
    return validate_llm_scenario(data)


def policy_tags() -> list[str]:
    """The scheduler kinds (``policy.kind``)."""
    union = typing.get_args(typing.get_args(LlmPolicyCfg)[0])
    return [typing.get_args(m.model_fields["kind"].annotation)[0] for m in union]
