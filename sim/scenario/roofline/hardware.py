"""What the roofline step model knows about a model and a device, read from their files.

* :class:`ModelShape`: the decoder's shape from a Hugging Face ``config.json`` (Llama, Qwen2/3,
  Mistral, Mixtral and Qwen-MoE style keys): layers, hidden width, query and KV heads, head
  width, MLP width, vocabulary, experts and active experts, tied embeddings, dtype.
* :class:`DeviceSheet`: a device's datasheet peaks (dense bf16/fp8 FLOP/s, memory bandwidth,
  interconnect bandwidth per direction and all-reduce latency, memory), shipped as YAML
  for a few GPUs and a nominal CPU core, each with the vendor's source in the file.
* :func:`kv_cache_blocks`: the KV cache size as vLLM derives it when ``num_gpu_blocks`` is not
  given (``gpu_memory_utilization`` × memory − weights − activations − non-torch memory).

No torch, no simpy: the simulator reads these without either.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sim.errors import UserError

_DATA = resources.files("sim.scenario.roofline")  # shipped devices, coefficients, models

GIB = 2**30
DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0,
               "float16": 2.0, "fp8": 1.0}
# vLLM's memory profile of a dense model leaves room for the forward pass's activations
# and for memory outside torch (CUDA context, NCCL buffers); measured values vary with
# max_num_batched_tokens, these are typical of an 8k-token budget
ACTIVATION_RESERVE_GIB = {"dense": 5.5, "moe": 8.0}
NON_TORCH_GIB_PER_GPU = {1: 0.15, 2: 0.6}  # tp = 1, tp > 1


class HardwareError(UserError):
    """A model config or a device sheet cannot be read or used."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape (SwiGLU MLP, optionally mixture-of-experts).

    Attributes:
        name: Where it came from (for reports).
        layers: Decoder layers.
        hidden: Model width ``d``.
        heads: Query heads.
        kv_heads: Key/value heads (grouped-query attention).
        head_dim: Width of one head.
        intermediate: MLP width of a dense layer (of one expert for MoE).
        vocab: Vocabulary size.
        experts: Routed experts per layer (0: dense).
        active_experts: Experts each token goes through.
        tied_embeddings: The output projection shares the embedding matrix.
        dtype: Weight and KV dtype: fp32 | bf16 | fp16 | fp8 (KV stays 2 bytes for fp8).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 0
    active_experts: int = 1
    tied_embeddings: bool = False
    dtype: str = "bf16"

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes per weight."""
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_elem(self) -> float:
        """Bytes per KV cache element (fp8 weights keep a 16-bit cache, as vLLM's default)."""
        return 2.0 if self.dtype == "fp8" else DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        """Whether the MLP layers are mixtures of experts."""
        return self.experts > 1

    def attention_params(self) -> int:
        """Weights of one layer's attention: Q, K, V and output projections."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden

    def mlp_params(self) -> int:
        """Weights of one layer's MLP (all experts): gate, up and down projections."""
        return 3 * self.hidden * self.intermediate * max(1, self.experts)

    def params(self) -> int:
        """All weights: layers, embeddings and (untied) output projection."""
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * (self.attention_params() + self.mlp_params()) + embeddings

    def weight_bytes(self) -> float:
        """Bytes of all weights."""
        return self.params() * self.weight_bytes_per_param

    def kv_bytes_per_token(self) -> float:
        """KV cache bytes per token over all GPUs: 2 × layers × kv_heads × head_dim × bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_elem

    def check_tp(self, tp: int, field_name: str = "service.tp") -> None:
        """Raise :class:`HardwareError` unless the heads split evenly over ``tp`` GPUs."""
        if self.heads % tp:
            raise HardwareError(f"{field_name}: {tp} does not divide the model's "
                                f"{self.heads} attention heads; allowed: a divisor of "
                                f"{self.heads}")
        if self.kv_heads >= tp and self.kv_heads % tp:
            raise HardwareError(f"{field_name}: {tp} does not divide the model's "
                                f"{self.kv_heads} KV heads (vLLM replicates KV heads only "
                                "when tp exceeds them)")


def _int(cfg: dict[str, Any], keys: tuple[str, ...], where: str, default: int | None = None
         ) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise HardwareError(f"{where}: {key} must be a non-negative integer, got "
                                    f"{value!r}")
            return value
    if default is None:
        raise HardwareError(f"{where}: missing {' or '.join(keys)} (a decoder config.json "
                            "of the Llama, Qwen2, Mistral or Mixtral family)")
    return default


def model_shape_from_config(cfg: dict[str, Any], name: str = "model",
                            dtype: str | None = None) -> ModelShape:
    """The shape of a Hugging Face ``config.json`` dict (``text_config`` when nested).

    Raises:
        HardwareError: a missing or bad key, named.
    """
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k == "torch_dtype"}}
    where = f"service.model ({name})"
    hidden = _int(cfg, ("hidden_size", "n_embd", "d_model"), where)
    heads = _int(cfg, ("num_attention_heads", "n_head"), where)
    if heads == 0 or hidden == 0:
        raise HardwareError(f"{where}: hidden_size and num_attention_heads must be >= 1")
    experts = _int(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), where, 0)
    mlp_key = ("moe_intermediate_size", "intermediate_size") if experts > 1 else (
        "intermediate_size", "n_inner")
    raw_dtype = str(dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if raw_dtype not in DTYPE_BYTES:
        raise HardwareError(f"{where}: dtype {raw_dtype!r} is not supported; allowed: "
                            "fp32, bf16, fp16, fp8")
    shape = ModelShape(
        name=name, layers=_int(cfg, ("num_hidden_layers", "n_layer"), where),
        hidden=hidden, heads=heads,
        kv_heads=_int(cfg, ("num_key_value_heads",), where, heads),
        head_dim=_int(cfg, ("head_dim",), where, hidden // heads),
        intermediate=_int(cfg, mlp_key, where, 4 * hidden),
        vocab=_int(cfg, ("vocab_size",), where),
        experts=experts if experts > 1 else 0,
        active_experts=_int(cfg, ("num_experts_per_tok",), where, 1) if experts > 1 else 1,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dtype={"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(raw_dtype,
                                                                               raw_dtype))
    for attr in ("layers", "kv_heads", "head_dim", "intermediate", "vocab"):
        if getattr(shape, attr) < 1:
            raise HardwareError(f"{where}: {attr} must be >= 1")
    if shape.heads % shape.kv_heads:
        raise HardwareError(f"{where}: num_attention_heads {shape.heads} is not a multiple "
                            f"of num_key_value_heads {shape.kv_heads}")
    return shape


def load_model_config(path: str | Path, dtype: str | None = None) -> ModelShape:
    """Read a ``config.json`` (or the folder holding one) into a :class:`ModelShape`.

    Raises:
        HardwareError: missing file, bad JSON, missing or bad keys (named).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise HardwareError(f"service.model: cannot read {str(path)!r} "
                            f"({exc.strerror or exc}); give a Hugging Face config.json") \
            from None
    except json.JSONDecodeError as exc:
        raise HardwareError(f"service.model: {str(path)!r} is not JSON ({exc.msg}, line "
                            f"{exc.lineno})") from None
    if not isinstance(data, dict):
        raise HardwareError(f"service.model: {str(path)!r} must hold a JSON object")
    return model_shape_from_config(data, p.parent.name or p.stem, dtype)


@dataclass(frozen=True)
class DeviceSheet:
    """A device's datasheet peaks (dense, no sparsity).

    Attributes:
        name: Device name.
        kind: ``gpu`` or ``cpu`` (picks the builtin coefficient set).
        bf16_flops: Peak dense 16-bit FLOP/s (fp32 for the CPU sheet).
        fp8_flops: Peak dense fp8 FLOP/s (0: none; fp8 models then use ``bf16_flops``).
        memory_bw_bps: Memory bandwidth, bytes/s.
        interconnect_bps: GPU-to-GPU bandwidth per direction, bytes/s.
        memory_gib: Device memory, GiB.
        sources: Where the numbers come from.
        allreduce_base_us: Fixed latency of one all-reduce (launch and synchronisation), µs.
        allreduce_hop_us: Latency of each of a ring all-reduce's ``2 (tp − 1)`` steps, µs.
    """

    name: str
    kind: str
    bf16_flops: float
    fp8_flops: float
    memory_bw_bps: float
    interconnect_bps: float
    memory_gib: float
    sources: tuple[str, ...] = field(default_factory=tuple)
    allreduce_base_us: float = 0.0
    allreduce_hop_us: float = 0.0

    def allreduce_latency_us(self, tp: int) -> float:
        """Latency of one ring all-reduce over ``tp`` devices, whatever its size (NCCL's
        cost model: a base latency plus one hop latency per ring step).
        """
        return self.allreduce_base_us + 2 * (tp - 1) * self.allreduce_hop_us if tp > 1 \
            else 0.0

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for a weight dtype."""
        return self.fp8_flops if dtype == "fp8" and self.fp8_flops > 0 else self.bf16_flops


DEVICE_FIELDS = {"bf16_tflops": 1e12, "fp8_tflops": 1e12, "memory_bw_gbps": 1e9,
                 "interconnect_gbps": 1e9, "memory_gib": 1.0, "allreduce_base_us": 1.0,
                 "allreduce_hop_us": 1.0}
OPTIONAL_FIELDS = ("fp8_tflops", "interconnect_gbps", "allreduce_base_us", "allreduce_hop_us")


def builtin_devices() -> list[str]:
    """Names of the shipped device sheets."""
    folder = _DATA / "devices"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                  if p.name.endswith(".yaml"))


def load_device(ref: str) -> DeviceSheet:
    """A shipped device sheet by name (``h100-sxm``, ...) or a YAML file with the same keys.

    Raises:
        HardwareError: unknown name, unreadable file, missing or bad field (named).
    """
    names = builtin_devices()
    if ref in names:
        text = (_DATA / "devices" / f"{ref}.yaml").read_text()
    elif ref.endswith((".yaml", ".yml")):
        try:
            text = Path(ref).read_text()
        except OSError as exc:
            raise HardwareError(f"service.device: cannot read {ref!r} "
                                f"({exc.strerror or exc})") from None
    else:
        raise HardwareError(f"service.device: {ref!r} is not a shipped device; allowed: "
                            f"{', '.join(names)}, or a path to a device .yaml")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HardwareError(f"service.device: {ref!r} is not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise HardwareError(f"service.device: {ref!r} must be a mapping of keys to values")
    values: dict[str, float] = {}
    for key, scale in DEVICE_FIELDS.items():
        value = data.get(key, 0.0 if key in OPTIONAL_FIELDS else None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or \
                not math.isfinite(value):
            raise HardwareError(f"service.device: {ref!r}: {key} must be a number >= 0 "
                                f"(required: bf16_tflops, memory_bw_gbps, memory_gib), got "
                                f"{value!r}")
        values[key] = float(value) * scale
    for key in ("bf16_tflops", "memory_bw_gbps", "memory_gib"):
        if values[key] <= 0:
            raise HardwareError(f"service.device: {ref!r}: {key} must be > 0")
    kind = str(data.get("kind", "gpu"))
    if kind not in ("gpu", "cpu"):
        raise HardwareError(f"service.device: {ref!r}: kind {kind!r}; allowed: gpu, cpu")
    return DeviceSheet(name=str(data.get("name", ref)), kind=kind,
                       bf16_flops=values["bf16_tflops"], fp8_flops=values["fp8_tflops"],
                       memory_bw_bps=values["memory_bw_gbps"],
                       interconnect_bps=values["interconnect_gbps"],
                       memory_gib=values["memory_gib"],
                       sources=tuple(str(s) for s in data.get("sources") or ()),
                       allreduce_base_us=values["allreduce_base_us"],
                       allreduce_hop_us=values["allreduce_hop_us"])


def kv_cache_blocks(shape: ModelShape, device: DeviceSheet, tp: int, block_size: int,
                    gpu_memory_utilization: float = 0.9,
                    activation_reserve_gib: float | None = None) -> int:
    """KV blocks that fit, as vLLM sizes its cache: over the ``tp`` GPUs,
    ``gpu_memory_utilization × memory − weights − activations − non-torch memory``, divided
    by the bytes of one block (``block_size`` tokens of every layer's K and V).

    Raises:
        HardwareError: the weights and the reserve do not leave room for one block.
    """
    budget = device.memory_gib * GIB * gpu_memory_utilization * tp
    reserve = ACTIVATION_RESERVE_GIB["moe" if shape.is_moe else "dense"] \
        if activation_reserve_gib is None else activation_reserve_gib
    non_torch = NON_TORCH_GIB_PER_GPU[1 if tp == 1 else 2] * tp
    free = budget - shape.weight_bytes() - (reserve + non_torch) * GIB
    blocks = int(free // (block_size * shape.kv_bytes_per_token()))
    if blocks < 1:
        raise HardwareError(
            f"service.tp: {shape.name} ({shape.weight_bytes() / GIB:.1f} GiB of weights) "
            f"does not fit {tp} × {device.name} ({device.memory_gib:g} GiB × "
            f"gpu_memory_utilization {gpu_memory_utilization:g}) with room for its KV cache; "
            f"allowed: a larger tp or device")
    return blocks
