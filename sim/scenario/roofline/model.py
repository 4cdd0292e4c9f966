"""A roofline step model with fitted coefficients ("trained physics", as BLIS calls it).

One engine step's time is a weighted sum of terms, each a physical quantity of the step
divided by the device's peak for it, plus overheads::

    step_us = Σ_t  β_t · x_t(model, device, tp, composition)

======================  ===========================================================  =====
term ``t``              basis ``x_t``                                                 β
======================  ===========================================================  =====
``prefill_compute``     linear-layer FLOPs of the prefill tokens / peak FLOP/s        —
``prefill_attention``   attention FLOPs of the prefill chunks over their prefix and   —
                        causally within the chunk / peak FLOP/s
``decode_compute``      linear-layer and attention FLOPs of the decodes / peak        —
``decode_kv``           KV bytes the decodes read (and write) / memory bandwidth      —
``weights``             weight bytes of the layers read once per step / bandwidth     —
                        (MoE: the experts the step's tokens are expected to touch)
``lm_head``             output projection: its weight bytes / bandwidth + its FLOPs   —
                        for one row per sequence / peak
``tp_allreduce``        two ring all-reduces per layer of the step's activations /    —
                        interconnect bandwidth per direction (0 at tp = 1)
``tp_allreduce_latency`` the same two all-reduces per layer × one all-reduce's       —
                        latency from the device sheet (NCCL's model: base + 2(tp−1)
                        hops; 0 at tp = 1). A set that does not fit it (every shipped
                        one) takes β = 1: the sheet's latency as it is
``per_layer``           layers (kernel launches, norms, residuals)                    µs
``per_request``         sequences in the step (input preparation, sampling)           µs
``per_step``            1 (scheduling, synchronisation)                               µs
======================  ===========================================================  =====

The roofline terms are in microseconds, so their coefficients are dimensionless
corrections of the datasheet peak; everything is per GPU (the work divides over ``tp``).

A set may also carry the per-request costs outside the steps (``request_overheads``: BLIS's
α terms, ``request_ms``, ``per_output_token_ms``, ``post_decode_ms``), which the simulator
applies around the engine as ``service.overheads`` (:mod:`sim.drivers.llm_overheads`); a set
without them has none. No torch, no simpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sim.scenario.roofline.hardware import DeviceSheet, HardwareError, ModelShape
from sim.serving.llm.step_model import Composition

_DATA = resources.files("sim.scenario.roofline")  # shipped devices, coefficients, models

TERMS = ("prefill_compute", "prefill_attention", "decode_compute", "decode_kv", "weights",
         "lm_head", "tp_allreduce", "tp_allreduce_latency", "per_layer", "per_request",
         "per_step")
UNITS = dict.fromkeys(TERMS[:8], "µs per µs of roofline time") | {
    "per_layer": "µs per layer", "per_request": "µs per sequence in the step",
    "per_step": "µs per step"}
BUILTIN_FOR_KIND = {"cpu": "cpu-decoder", "gpu": "gpu-blis-iter29"}
# per-request costs outside the steps (BLIS's α₀ + α₂, α₂, α₁), ms; see LlmOverheadsCfg
OVERHEAD_KEYS = ("request_ms", "per_output_token_ms", "post_decode_ms")
# a term a coefficient set leaves out takes this β (0 unless named): the sheet's all-reduce
# latency is a measured latency, not a peak to correct, so it counts as it is
DEFAULT_BETA = {"tp_allreduce_latency": 1.0}


def terms_us(shape: ModelShape, device: DeviceSheet, tp: int, comp: Composition
             ) -> dict[str, float]:
    """The basis value of every term for one step (µs for roofline terms, counts for the
    overheads), per GPU of a ``tp``-way tensor-parallel engine.
    """
    layers, d = shape.layers, shape.hidden
    flops_us = device.flops(shape.dtype) / 1e6
    bw_us = device.memory_bw_bps / 1e6
    bpp = shape.weight_bytes_per_param
    q_heads = shape.heads / tp
    kv_dim = max(1, shape.kv_heads // tp) * shape.head_dim  # vLLM replicates when tp > kv
    active = shape.active_experts if shape.is_moe else 1
    # FLOPs per token through one layer's linear projections (2 per multiply-add)
    linear_flops = 2 * (shape.attention_params() + 3 * d * shape.intermediate * active) / tp
    p, dec = comp.prefill_tokens, comp.decode_seqs
    attn_per_pair = 4 * q_heads * shape.head_dim  # QKᵀ and PV: 2 × 2 FLOPs per pair
    causal_pairs = comp.prefill_context + (comp.prefill_sq + p) / 2
    out = dict.fromkeys(TERMS, 0.0)
    out["prefill_compute"] = layers * p * linear_flops / flops_us
    out["prefill_attention"] = layers * attn_per_pair * causal_pairs / flops_us
    if dec:
        out["decode_compute"] = layers * (dec * linear_flops + attn_per_pair * comp.kv_tokens
                                          ) / flops_us
        out["decode_kv"] = layers * 2 * kv_dim * shape.kv_bytes_per_elem * (
            comp.kv_tokens + dec) / bw_us
    tokens = p + dec
    experts = 1.0
    if shape.is_moe:  # expected distinct experts the step's tokens route to
        experts = shape.experts * (1 - (1 - active / shape.experts) ** tokens)
    layer_bytes = (shape.attention_params() + 3 * d * shape.intermediate * experts) * bpp / tp
    out["weights"] = layers * layer_bytes / bw_us if tokens else 0.0
    rows = dec + comp.prefill_seqs
    if tokens:
        out["lm_head"] = (shape.vocab * d * bpp / tp) / bw_us + \
            2 * rows * shape.vocab * d / tp / flops_us
    if tp > 1 and tokens:
        if device.interconnect_bps <= 0:
            raise HardwareError(f"service.tp: {tp} needs the device's interconnect_gbps "
                                f"({device.name} gives none)")
        ring = 2 * (tp - 1) / tp
        out["tp_allreduce"] = 2 * layers * tokens * d * shape.kv_bytes_per_elem * ring / (
            device.interconnect_bps / 1e6)
        out["tp_allreduce_latency"] = 2 * layers * device.allreduce_latency_us(tp)
    out["per_layer"] = float(layers) if tokens else 0.0
    out["per_request"] = float(rows)
    out["per_step"] = 1.0 if tokens else 0.0
    return out


@dataclass(frozen=True)
class Coefficients:
    """One coefficient per term, with where they were fitted.

    Attributes:
        values: Term -> β (see :data:`UNITS`).
        name: Set name.
        meta: Provenance: models, devices, engines fitted on, source, fit errors.
        overheads: Per-request costs outside the steps (:data:`OVERHEAD_KEYS`, ms); empty:
            none.
    """

    values: dict[str, float]
    name: str = "custom"
    meta: dict[str, Any] = field(default_factory=dict)
    overheads: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = {t: DEFAULT_BETA.get(t, 0.0) for t in TERMS if t not in self.values}
        if missing:  # a term the set leaves out takes its default
            object.__setattr__(self, "values", {**self.values, **missing})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        over = {"request_overheads": self.overheads} if any(self.overheads.values()) else {}
        return {"kind": "llm_roofline_coefficients", "schema_version": 1, "name": self.name,
                "coefficients": self.values, "units": UNITS, **over, **self.meta}

    def save(self, path: str | Path) -> Path:
        """Write the coefficients as JSON."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return out


def builtin_coefficients() -> list[str]:
    """Names of the shipped coefficient sets."""
    folder = _DATA / "coefficients"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                  if p.name.endswith(".json"))


def load_coefficients(ref: str, device_kind: str = "gpu") -> Coefficients:
    """A coefficient set: ``builtin`` (the shipped set for the device's kind),
    ``builtin:NAME`` or a JSON path (``servelab fit`` output).

    Raises:
        HardwareError: unknown name, unreadable file, missing or negative coefficients.
    """
    names = builtin_coefficients()
    name = BUILTIN_FOR_KIND[device_kind] if ref == "builtin" else ref.removeprefix("builtin:")
    if ref == "builtin" or ref.startswith("builtin:"):
        if name not in names:
            raise HardwareError(f"service.coefficients: {ref!r} is not shipped; allowed: "
                                f"builtin, {', '.join('builtin:' + n for n in names)}, or a "
                                "path to a coefficients JSON (servelab fit --out)")
        text = (_DATA / "coefficients" / f"{name}.json").read_text()
    else:
        try:
            text = Path(ref).read_text()
        except OSError as exc:
            raise HardwareError(f"service.coefficients: cannot read {ref!r} "
                                f"({exc.strerror or exc}); allowed: builtin, builtin:NAME "
                                "or a coefficients JSON") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HardwareError(f"service.coefficients: {ref!r} is not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or data.get("kind") != "llm_roofline_coefficients":
        raise HardwareError(f"service.coefficients: {ref!r} is not a coefficients file (kind "
                            "'llm_roofline_coefficients', written by servelab fit)")
    raw = data.get("coefficients")
    if not isinstance(raw, dict):
        raise HardwareError(f"service.coefficients: {ref!r}: missing 'coefficients'")
    values: dict[str, float] = {}
    for term in TERMS:
        value = raw.get(term, DEFAULT_BETA.get(term, 0.0))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                or not math.isfinite(value):
            raise HardwareError(f"service.coefficients: {ref!r}: {term} must be a number "
                                f">= 0, got {value!r}")
        values[term] = float(value)
    unknown = set(raw) - set(TERMS)
    if unknown:
        raise HardwareError(f"service.coefficients: {ref!r}: unknown term "
                            f"{sorted(unknown)[0]!r}; allowed: {', '.join(TERMS)}")
    meta = {k: v for k, v in data.items() if k not in (
        "kind", "schema_version", "name", "coefficients", "units", "request_overheads")}
    return Coefficients(values, str(data.get("name", name)), meta,
                        _overheads(ref, data.get("request_overheads", {})))


def _overheads(ref: str, raw: Any) -> dict[str, float]:
    """A set's ``request_overheads`` (ms), checked.

    Raises:
        HardwareError: not a mapping, an unknown key or a negative value (named).
    """
    if not isinstance(raw, dict):
        raise HardwareError(f"service.coefficients: {ref!r}: request_overheads must be a "
                            f"mapping of {', '.join(OVERHEAD_KEYS)}")
    unknown = set(raw) - set(OVERHEAD_KEYS)
    if unknown:
        raise HardwareError(f"service.coefficients: {ref!r}: unknown request_overheads key "
                            f"{sorted(unknown)[0]!r}; allowed: {', '.join(OVERHEAD_KEYS)}")
    out = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                or not math.isfinite(value):
            raise HardwareError(f"service.coefficients: {ref!r}: request_overheads.{key} "
                                f"must be a number >= 0 (ms), got {value!r}")
        out[key] = float(value)
    return out


class RooflineStepModel:
    """Step time from the model's shape, the device's peaks and fitted coefficients."""

    def __init__(self, shape: ModelShape, device: DeviceSheet, tp: int,
                 coefficients: Coefficients) -> None:
        shape.check_tp(tp)
        self.shape, self.device, self.tp, self.coefficients = shape, device, tp, coefficients
        self.extrapolated = 0  # a formula has no grid to leave

    def __repr__(self) -> str:
        return (f"RooflineStepModel({self.shape.name!r}, {self.device.name!r}, tp={self.tp}, "
                f"{self.coefficients.name!r})")

    def contributions_us(self, comp: Composition) -> dict[str, float]:
        """Each term's share of the step (µs)."""
        beta = self.coefficients.values
        return {t: beta[t] * x for t, x in terms_us(self.shape, self.device, self.tp,
                                                     comp).items()}

    def step_s(self, comp: Composition) -> float:
        """Seconds one step of this composition takes."""
        return sum(self.contributions_us(comp).values()) / 1e6


__all__ = ["OVERHEAD_KEYS", "TERMS", "UNITS", "Coefficients", "RooflineStepModel",
           "builtin_coefficients", "load_coefficients", "terms_us"]
