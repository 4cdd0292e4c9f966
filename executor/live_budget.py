"""What a live run would hold in memory, known from its input before any model is loaded.

Beyond the commands' budget (:func:`sim.experiments.preflight.check` with
:data:`~sim.experiments.preflight.MEMORY_BUDGET`: 4 GiB, no time limit, since a live run
lasts its schedule's real span) the run is refused in one line naming the field to lower,
unless ``--yes``. Counted:

- the records: the simulator's estimate (:func:`~sim.experiments.preflight.estimate_run`),
  since a live run keeps the same tables; an LLM run's whole plan (arrivals, token counts)
  is drawn before anything else, so that is checked first (:func:`check_llm_plan`);
- per replica slot (``replicas``, or ``autoscaling.max_replicas``: each launched replica
  loads its own model) the model's weights and one batch's inputs and activations (at most
  the policy's batch size in requests), for the built-in models, whose size follows from
  ``model.params``. A factory's or an ``hf:`` model's size is not known before it is built
  and is not counted;
- per LLM engine slot: the decoder's weights, its KV cache (``max_num_seqs`` slots of the
  longest prompt + output, as :func:`executor.llm_driver.decoder_for` sizes it) and the
  prefix-caching block store.

A replica on a CUDA device holds its model there: that part counts against the device's
memory, the rest against the host's budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.experiments.preflight import (
    MEMORY_BUDGET,
    Budget,
    Estimate,
    _bytes,
    check,
    estimate_run,
)

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Building a model draws each parameter into a float32 temporary before copying it in:
# mlp with width 8192 (2.0e8 parameters, 0.81 GB) raised the peak RSS by 1.29 GB, the
# default mlp by 30 MiB for 14 MB of weights, the default cnn by 9.8 MiB for 5.9 MB.
BUILD_FACTOR = 2.0
MINILM_PARAMS = 22.7e6  # all-MiniLM-L6-v2
MINILM_HIDDEN, MINILM_LAYERS_HEADS = 384, 12


@dataclass(frozen=True)
class Part:
    """Memory one replica slot holds on ``place`` (``host`` or a CUDA device): its model's
    ``weights_bytes`` and ``batch_bytes`` (one batch's inputs and activations, or an LLM
    engine's KV cache), of which ``floor_bytes`` is the least any batch size leaves (one
    request's; the KV cache's whole).
    """

    place: str
    weights_bytes: float
    batch_bytes: float
    floor_bytes: float


def _dtype_bytes(spec: dict[str, Any]) -> int:
    return DTYPE_BYTES.get(str(spec.get("dtype") or "fp32"), 4)


def _place(device: Any) -> str:
    text = str(device or "cpu")
    return text if text.startswith("cuda") else "host"


def runner_bytes(spec: dict[str, Any]) -> tuple[float, float] | None:
    """(weights, one request's inputs and activations) of a built-in runner, in bytes, from
    its params; None for a model whose size is unknown before it is built.

    The per-request bytes were fitted on a CPU (peak RSS over a batch, fp32): mlp 24.8 KiB
    per request at the defaults (the formula gives 23.5); cnn 4.3 MiB at 224 px and 63 MiB
    at 1024 px (the formula: 4.0 and 82).

    Raises:
        calibration.model_runners.RunnerError: a size param that is not an integer >= 1.
    """
    name, dtype = spec.get("name"), _dtype_bytes(spec)
    if name not in ("mlp", "cnn", "minilm"):
        return None
    from calibration.model_runners import size_params

    # a NaN size priced as NaN bytes: the run was refused naming ``replicas``
    params = {k: v for k, v in size_params(spec.get("params")).items()
              if isinstance(v, int | float) and not isinstance(v, bool)}
    width = float(params.get("width", 1024 if name == "mlp" else 32))
    if name == "mlp":
        inp, depth = float(params.get("in_features", 256)), float(params.get("depth", 4))
        out = float(params.get("out_features", 16))
        n = inp * width + (depth - 1) * width * width + width * out + depth * width + out
        return BUILD_FACTOR * n * dtype, 4.0 * (3 * inp + 5 * width)
    if name == "cnn":
        side, classes = float(params.get("image_size", 224)), float(params.get("classes", 1000))
        # stem 7x7 conv, one basic block per stage (widths w, 2w, 4w, 8w), the classifier
        n = 147 * width + 1194 * width * width + 8 * width * classes + classes
        return BUILD_FACTOR * n * dtype, side * side * (18 + 2 * width)
    if name == "minilm":
        tokens = float(params.get("max_length", 128))
        return (BUILD_FACTOR * MINILM_PARAMS * dtype,
                4.0 * tokens * (MINILM_HIDDEN * MINILM_LAYERS_HEADS
                                + 2 * MINILM_LAYERS_HEADS * tokens))
    return None


def _device_budget(place: str) -> Budget | None:
    """The memory budget of ``place``: the host's, or a CUDA device's whole memory (None
    when CUDA is not here: building the runner refuses the device in its own line).
    """
    if place == "host":
        return MEMORY_BUDGET
    import torch

    if not torch.cuda.is_available():
        return None
    index = int(place.split(":", 1)[1]) if ":" in place else 0
    if index >= torch.cuda.device_count():
        return None
    return Budget(memory_bytes=float(torch.cuda.get_device_properties(index).total_memory),
                  time_s=math.inf)


def check_parts(records: Estimate, parts: list[Part], *, fleet_field: str,
                batch_field: str, weights_field: str, what: str, yes: bool,
                floor_field: str | None = None, batch_label: str = "for a batch") -> None:
    """Refuse the records plus the replica slots' ``parts`` beyond each place's budget.

    The line names the field to lower: the records' driver when they weigh most; when one
    replica slot with its smallest batch does not fit, ``weights_field`` or ``floor_field``
    (what sets the floor: the model's input size, or an LLM engine's KV cache), whichever
    part is larger; when it fits only with a smaller batch, ``batch_field``; else
    ``fleet_field`` (fewer replicas would fit).

    Raises:
        sim.experiments.preflight.BudgetError: one line, unless ``yes``.
    """
    if yes:
        return
    floor_field = weights_field if floor_field is None else floor_field
    for place in ["host", *sorted({p.place for p in parts} - {"host"})]:
        budget = _device_budget(place)
        if budget is None:
            continue
        here = [p for p in parts if p.place == place]
        base = records.memory_bytes if place == "host" else 0.0
        slots = sum(p.weights_bytes + p.batch_bytes for p in here)
        if base + slots <= budget.memory_bytes:
            continue
        biggest = max(here, key=lambda p: p.weights_bytes + p.batch_bytes, default=None)
        if biggest is None or base >= slots:
            driver, detail = records.driver, records.detail
        else:
            weights, floor = biggest.weights_bytes, biggest.floor_bytes
            if base + weights + floor > budget.memory_bytes:  # no batch size fits one
                driver = weights_field if weights >= floor else floor_field
            elif base + weights + biggest.batch_bytes > budget.memory_bytes:
                driver = batch_field
            else:
                driver = fleet_field  # one replica fits: fewer would
            detail = (f"{len(here)} replica{'s' if len(here) > 1 else ''} on {place}, each "
                      f"about {_bytes(biggest.weights_bytes)} of model and "
                      f"{_bytes(biggest.batch_bytes)} {batch_label}")
            if place == "host":
                detail = f"{records.detail}; {detail}"
        where = "" if place == "host" else f" on {place}"
        check(Estimate(records.requests, base + slots, 0.0, driver, detail),
              f"{what}{where}", budget=budget)


def _max_batch(scn: Any, requests: float) -> tuple[float, str]:
    """The most requests one batch takes (the policy's cap, at most the run's requests),
    and the field that sets it.
    """
    policy = scn.policy
    field = "max_batch_size" if hasattr(policy, "max_batch_size") else "batch_size"
    cap = float(getattr(policy, field, 1))
    return min(cap, max(requests, 1.0)), f"policy.{field}"


def fleet_field(scn: Any) -> str:
    """The field that sets the replica slots: ``replicas`` or ``autoscaling.max_replicas``."""
    return "autoscaling.max_replicas" if scn.autoscaling is not None else "replicas"


def check_live_requests(scn: Any, spec: dict[str, Any] | None, *, yes: bool = False) -> None:
    """Refuse a request-level live run beyond the budget (module docstring), before any
    model is built. ``spec``: :func:`executor.live_requests.model_spec`'s (None: the caller
    gives the runners, whose size is theirs).

    Raises:
        sim.experiments.preflight.BudgetError: one line naming the field to lower.
    """
    records = estimate_run(scn)
    sized = runner_bytes(spec) if spec is not None else None
    parts: list[Part] = []
    batch, batch_field = _max_batch(scn, records.requests)
    if spec is not None and sized is not None:
        from executor.live_requests import replica_device

        weights, per_request = sized
        parts = [Part(_place(replica_device(spec, r)), weights, batch * per_request,
                      per_request) for r in range(scn.fleet_size)]
    check_parts(records, parts, fleet_field=fleet_field(scn), batch_field=batch_field,
                weights_field="model.params", what="live run", yes=yes)


def check_llm_plan(scn: Any, *, yes: bool = False) -> None:
    """Refuse an LLM live run whose plan (arrivals, token counts, records) alone is beyond
    the budget, before it is drawn.

    Raises:
        sim.experiments.preflight.BudgetError: one line naming the field to lower.
    """
    check(estimate_run(scn), "live run", yes=yes, budget=MEMORY_BUDGET)


def decoder_shape(spec: dict[str, Any]) -> dict[str, float]:
    """The decoder's sizes as :func:`executor.llm_driver.decoder_for` reads them from
    ``spec`` (the named shape, overridden by ``model.params``:
    :func:`calibration.llm_shapes.config_for`), before any is built.

    Raises:
        ValueError: an unknown ``model.params.shape``, or a size that is not an integer >= 1
            (or breaks the shape's divisibility), naming it.
    """
    from dataclasses import asdict

    from calibration.llm_shapes import config_for

    return {k: float(v) for k, v in asdict(config_for(spec.get("params"))).items()}


def decoder_bytes(spec: dict[str, Any], slots: int, max_len: int,
                  store_tokens: int = 0) -> tuple[float, float]:
    """(weights, KV cache and block store) of the decoder
    :func:`executor.llm_driver.decoder_for` builds for ``spec``, in bytes (Python numbers:
    a shape of 1e12 does not overflow). ``store_tokens``: the prefix-caching block store's
    tokens (blocks × block size).

    Raises:
        ValueError: an unknown ``model.params.shape``.
    """
    cfg = decoder_shape(spec)
    hidden, layers, heads = cfg["hidden"], cfg["layers"], cfg["heads"]
    kv_heads, inter, vocab = cfg["kv_heads"], cfg["intermediate"], cfg["vocab"]
    head_dim = hidden // max(heads, 1)
    dtype = _dtype_bytes(spec)
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden \
        + 3 * hidden * inter + 2 * hidden
    weights = (2 * vocab * hidden + layers * per_layer + hidden) * dtype
    tokens = max(slots, cfg["max_slots"]) * max(max_len, cfg["max_len"]) + store_tokens
    return weights, 2.0 * layers * kv_heads * head_dim * tokens * dtype


def check_llm_engines(scn: Any, spec: dict[str, Any], core: Any, slots: int, max_len: int,
                      *, yes: bool = False) -> None:
    """:func:`check_live_llm` for the plan ``core`` (``build_llm_core``'s) drew: the longest
    prompt and output it holds, and the prefix-caching block store when caching is on.
    """
    store_tokens = 0
    if bool(getattr(scn.policy, "enable_prefix_caching", False)):  # attach_block_store's
        store_tokens = int(core.limits.num_blocks or 0) * int(scn.policy.block_size)
    longest = (int(core.prompt_tokens.max(initial=0)), int(core.output_tokens.max(initial=0)))
    check_live_llm(scn, spec, slots, max_len, longest, store_tokens, yes=yes)


def check_live_llm(scn: Any, spec: dict[str, Any], slots: int, max_len: int,
                   longest: tuple[int, int], store_tokens: int, *, yes: bool = False) -> None:
    """Refuse an LLM live run whose decoders (one per engine slot) would not fit, before
    any is built. ``longest``: the longest prompt and output (which one sets ``max_len``
    names the field to lower).

    Raises:
        sim.experiments.preflight.BudgetError: one line naming the field to lower.
        executor.lifecycle.LiveError: an unknown ``model.params.shape``.
    """
    from executor.lifecycle import LiveError

    records = estimate_run(scn)
    try:
        weights, cache = decoder_bytes(spec, slots, max_len, store_tokens)
        shape = decoder_shape(spec)
    except ValueError as exc:
        raise LiveError(str(exc)) from None
    prompt, output = longest
    cache_field = "workload.output_tokens" if output >= prompt else "workload.prompt_tokens"
    if slots / shape["max_slots"] > max(max_len / shape["max_len"], 1.0):
        cache_field = "policy.max_num_seqs" if hasattr(scn.policy, "max_num_seqs") \
            else "policy.max_batch_size"
    if store_tokens > slots * max_len:
        cache_field = "policy.num_gpu_blocks"
    parts = [Part(_place(spec.get("device")), weights, cache, cache)] * scn.fleet_size
    check_parts(records, parts, fleet_field=fleet_field(scn), batch_field=cache_field,
                weights_field="model.params", floor_field=cache_field, what="live run",
                yes=yes, batch_label="of KV cache")
