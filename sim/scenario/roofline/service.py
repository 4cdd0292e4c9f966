"""The ``llm_roofline`` service of LLM scenarios: its keys, and the step model they build.

```yaml
service:
  kind: llm_roofline
  model: builtin:llama-3.1-8b     # a Hugging Face config.json (or its folder), or builtin:NAME
  device: h100-sxm                # h100-sxm | h200 | a100-80gb | l40s | cpu | PATH.yaml
  tp: 1                           # tensor-parallel GPUs per engine
  coefficients: builtin           # builtin (the set for the device's kind) | builtin:NAME | PATH
  gpu_memory_utilization: 0.9     # sizes the KV cache when policy.num_gpu_blocks is not given
  # overheads: {request_ms: 10}   # per-request costs outside the steps (default: the set's)
```
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Literal

from pydantic import Field, ValidationError

from sim.scenario.roofline.hardware import (
    HardwareError,
    ModelShape,
    kv_cache_blocks,
    load_device,
    load_model_config,
    model_shape_from_config,
)
from sim.scenario.roofline.model import RooflineStepModel, load_coefficients
from sim.scenario.schema import LlmOverheadsCfg, ScenarioError, _Strict

_DATA = resources.files("sim.scenario.roofline")  # shipped devices, coefficients, models

KV_POLICIES = ("continuous", "vllm", "sarathi")


class LlmRooflineServiceCfg(_Strict):
    """Step time from the model's config.json, the device's datasheet and fitted
    coefficients (a roofline with "trained physics" corrections).
    """

    kind: Literal["llm_roofline"]
    model: str
    device: str
    tp: int = Field(1, ge=1, le=64)
    coefficients: str = "builtin"
    dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = None
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_gb: float | None = Field(None, ge=0)
    # written by servelab: the policy.num_gpu_blocks it derived, so that a changed device,
    # tp or model (a sweep over the resolved scenario) derives them again
    derived_num_gpu_blocks: int | None = Field(None, ge=1)
    # per-request costs outside the steps; None: the coefficient set's (BLIS's α terms)
    overheads: LlmOverheadsCfg | None = None


def builtin_models() -> list[str]:
    """Names of the shipped model configs (``model: builtin:NAME``)."""
    folder = _DATA / "models"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                  if p.name.endswith(".json"))


def load_shape(ref: str, dtype: str | None = None) -> ModelShape:
    """A model shape from ``builtin:NAME`` or a config.json path.

    Raises:
        HardwareError: unknown builtin, unreadable or bad config (named).
    """
    if ref.startswith("builtin:"):
        import json

        name = ref.removeprefix("builtin:")
        if name not in builtin_models():
            raise HardwareError(f"service.model: {ref!r} is not shipped; allowed: "
                                f"{', '.join('builtin:' + n for n in builtin_models())}, "
                                "or a path to a Hugging Face config.json")
        text = (_DATA / "models" / f"{name}.json").read_text()
        return model_shape_from_config(json.loads(text), name, dtype)
    return load_model_config(ref, dtype)


def build_roofline(cfg: LlmRooflineServiceCfg) -> RooflineStepModel:
    """The step model of an ``llm_roofline`` service.

    Raises:
        HardwareError: a bad model, device, tp or coefficient set (named).
    """
    device = load_device(cfg.device)
    shape = load_shape(cfg.model, cfg.dtype)
    return RooflineStepModel(shape, device, cfg.tp,
                             load_coefficients(cfg.coefficients, device.kind))


def roofline_overheads(cfg: LlmRooflineServiceCfg) -> LlmOverheadsCfg | None:
    """The service's per-request overheads: its own ``overheads`` (as a whole: a key it
    leaves out is 0), else its coefficient set's ``request_overheads`` (None when the set
    has none).

    Raises:
        HardwareError: a bad device or coefficient set (named).
    """
    if cfg.overheads is not None:
        return cfg.overheads
    coeffs = load_coefficients(cfg.coefficients, load_device(cfg.device).kind)
    return LlmOverheadsCfg(**coeffs.overheads) if any(coeffs.overheads.values()) else None


def prepare_roofline(data: dict[str, Any]) -> dict[str, Any]:
    """Check an ``llm_roofline`` scenario's model, device and coefficients, and give a KV
    policy without ``num_gpu_blocks`` (or ``gpu_memory_gb``) the blocks vLLM would size.
    Other scenarios, and services with bad keys (reported by validation), pass unchanged.

    Raises:
        ScenarioError: a model, device, tp or coefficients error, naming the field.
    """
    service = data.get("service")
    if not isinstance(service, dict) or service.get("kind") != "llm_roofline":
        return data
    try:
        cfg = LlmRooflineServiceCfg.model_validate(service)
    except ValidationError:
        policy = data.get("policy")
        if isinstance(policy, dict) and policy.get("num_gpu_blocks") is None and \
                policy.get("gpu_memory_gb") is None and policy.get("kind") in KV_POLICIES:
            # the service's own error is the one to report: the blocks would be derived
            data = {**data, "policy": {**policy, "num_gpu_blocks": 1}}
        return data
    try:
        model = build_roofline(cfg)
        policy = data.get("policy")
        if not isinstance(policy, dict) or policy.get("kind") not in KV_POLICIES:
            return data
        given = policy.get("num_gpu_blocks")
        if given is not None and given == cfg.derived_num_gpu_blocks:
            given = None  # derived for an earlier service: derive again
        if given is None and policy.get("gpu_memory_gb") is None:
            block_size = policy.get("block_size", 16)
            if not isinstance(block_size, int) or block_size < 1:
                return data  # validation reports it
            blocks = kv_cache_blocks(model.shape, model.device, cfg.tp, block_size,
                                     cfg.gpu_memory_utilization, cfg.activation_reserve_gb)
            data = {**data, "policy": {**policy, "num_gpu_blocks": blocks},
                    "service": {**service, "derived_num_gpu_blocks": blocks}}
    except HardwareError as exc:
        raise ScenarioError(str(exc)) from None
    return data
