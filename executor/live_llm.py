"""``live_llm(scenario) -> LlmResult``: run an LLM scenario in real time on the real decoder.

The requests (arrival times, prompt and output lengths), the scheduler objects, the core, the
records and the metrics are the simulator's own (:func:`sim.drivers.llm_simulate.build_llm_core`,
:func:`sim.metrics.llm.summarize_llm`), so a difference between sim and live can only come
from step times and the engine's overheads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.step_profile import load_step_profile
from executor.lifecycle import (
    LiveError,
    check_bounds,
    check_drain_timeout_s,
    default_drain_s,
    stop_on_signals,
)
from executor.live_budget import check_llm_engines, check_llm_plan
from sim.drivers.llm_simulate import (
    LlmResult,
    build_llm_core,
    decoder_capacity,
    horizon_s,
    llm_fleet_tables,
    tables,
)
from sim.drivers.llm_simulate import run as sim_run
from sim.metrics.llm import summarize_llm
from sim.metrics.prefix import cached_tokens, prefix_cache_summary
from sim.metrics.rundir import run_meta
from sim.scenario.llm import LlmScenario, load_llm_scenario
from sim.serving.fleet import READY

if TYPE_CHECKING:  # torch loads with the engine, after the memory checks
    from executor.llm_driver import LiveLlmEngine


def llm_model_spec(scenario: LlmScenario) -> dict[str, Any]:
    """What to run live: the scenario's ``model:`` section over the step profile's decoder
    (its shape and KV-cache size, device, dtype and threads).
    """
    spec: dict[str, Any] = {}
    if scenario.service.kind == "llm_profile":
        meta = load_step_profile(scenario.service.path).meta
        model = meta.get("model") or {}
        params = dict(model.get("params") or {})
        device = meta.get("device") or {}
        spec = {"params": params,
                "device": "cpu" if device.get("kind") != "cuda"
                else f"cuda:{device.get('index', 0)}",
                "dtype": {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(
                    str(meta.get("dtype")), "fp32"),
                "threads": meta.get("threads")}
    elif scenario.service.kind == "llm_roofline" and scenario.model is None:
        spec = roofline_model_spec(scenario)
    if scenario.model is not None:
        given = scenario.model.model_dump()
        spec.update({k: v for k, v in given.items() if v not in (None, {})})
    if not spec:
        raise LiveError(f"model: nothing to run live — the service is {scenario.service.kind}; "
                        "use a measured step profile (service.kind llm_profile) or add "
                        "model: {params: {shape: small}}")
    return spec


def roofline_model_spec(scenario: LlmScenario) -> dict[str, Any]:
    """The decoder of an ``llm_roofline`` service on the ``cpu`` sheet: the model config's
    shape, fp32 and one thread (what the CPU coefficient set was fitted on).

    Raises:
        LiveError: a GPU device sheet (nothing here runs it) or a bad model config.
    """
    from sim.errors import UserError
    from sim.scenario.roofline.hardware import load_device
    from sim.scenario.roofline.service import load_shape

    service = scenario.service
    assert service.kind == "llm_roofline"
    try:
        device = load_device(service.device)
        shape = load_shape(service.model, service.dtype)
    except UserError as exc:
        raise LiveError(str(exc)) from None
    if device.kind != "cpu":
        raise LiveError(f"service.device: {service.device!r} is a GPU sheet; a live run "
                        "executes the model on this machine's CPU: use device: cpu, or add "
                        "model: {params: ...} for the decoder to run")
    if shape.head_dim * shape.heads != shape.hidden:
        raise LiveError(f"service.model: {shape.name} has head_dim {shape.head_dim} × "
                        f"{shape.heads} heads != hidden {shape.hidden}; servelab's decoder "
                        "needs head_dim = hidden / heads")
    return {"params": {"hidden": shape.hidden, "layers": shape.layers, "heads": shape.heads,
                       "kv_heads": shape.kv_heads, "intermediate": shape.intermediate,
                       "vocab": shape.vocab},
            "device": "cpu", "dtype": "fp32", "threads": 1}


def resident_engines(scenario: LlmScenario) -> int:
    """Engines loaded before a run starts: ``replicas``, or ``initial_replicas`` when
    autoscaled.
    """
    fleet = build_llm_core(scenario).fleet
    return scenario.replicas if fleet is None else fleet.count(READY)


def build_decoders(spec: dict[str, Any], replicas: int, slots: int,
                   max_len: int) -> list[Any]:
    """One warmed-up decoder per replica, with torch's CPU threads set to the spec's (the
    count the profile was measured with) before anything runs.
    """
    if spec.get("threads"):
        import torch

        torch.set_num_threads(int(spec["threads"]))
    from executor.llm_driver import decoder_for

    out = []
    for _ in range(replicas):
        try:
            decoder = decoder_for(spec, max_slots=slots, max_len=max_len)
        except ValueError as exc:
            raise LiveError(str(exc)) from None
        warm_up(decoder)
        out.append(decoder)
    return out


def warm_up(decoder: Any, steps: int = 3) -> None:
    """A few untimed steps (a prefill chunk with decodes) before the clock starts, so the
    first requests do not pay for allocator and kernel warm-up.
    """
    from calibration.llm_decoder import StepEntry

    cfg = decoder.cfg
    n = min(64, cfg.max_len - 1)
    decodes = [StepEntry(1 + i, n - 1, 1) for i in range(min(4, cfg.max_slots - 1))]
    for _ in range(steps):
        decoder.step([StepEntry(0, 0, n)])
        if decodes:
            decoder.step([StepEntry(0, 0, n), *decodes])


def live_llm(scenario: LlmScenario | dict[str, Any] | str | Path,
             overrides: list[str] | dict[str, Any] | None = None, *,
             drain_timeout_s: float | None = None, handle_sigint: bool = False,
             stop_mode: str = "drain",
             on_engine: Callable[[LiveLlmEngine], None] | None = None,
             decoder_hook: Callable[[Any], Any] | None = None, max_wall_s: float = 600.0,
             force: bool = True, decoders: list[Any] | None = None,
             replay: bool = False, yes: bool = False) -> LlmResult:
    """Run an LLM scenario live and return the same :class:`LlmResult` as ``sim.llm.run``.

    Args:
        scenario: Scenario, dict, path or ``builtin:NAME``.
        overrides: Dotted-key overrides.
        drain_timeout_s: Stop this long after the horizon; the rest stays in flight.
            Default: the window's length (``duration_s`` − ``warmup_s``), else 60 s.
        handle_sigint: Ctrl-C and SIGTERM stop the run (``stop_mode``) and the records are
            kept; a second signal ends it at once (see :mod:`executor.lifecycle`).
        stop_mode: ``drain`` or ``abandon``.
        on_engine: Called with the engine before it starts (tests stop runs with it).
        decoder_hook: Called with each decoder; its return value replaces it (tests inject
            faults).
        max_wall_s: With ``force=False``: refuse when the simulator predicts a longer run.
        force: Run without the stability and wall-time check (the API default; the CLI
            checks unless ``--force``).
        decoders: Decoders to run on, one per replica (compare reuses its probed ones);
            default: built from :func:`llm_model_spec` and warmed up.
        replay: Run on :class:`executor.llm_driver.ReplayDecoder` stand-ins that sleep the
            step model's own time (what the engine adds, free of device drift; works for
            ``llm_linear`` scenarios too).
        yes: Run even when the run would hold more memory than the budget
            (:mod:`executor.live_budget`: the plan and records, and per engine its
            decoder's weights and KV cache); otherwise it is refused before the plan is
            drawn (the plan) or before any decoder is built.

    Raises:
        LiveError: nothing to run live, or (``force=False``) the simulator predicts an
            unstable or too long run.
    """
    scn = load_llm_scenario(scenario, overrides)
    check_llm_plan(scn, yes=yes)  # before the plan is drawn (build_llm_core)
    spec = {"device": "cpu"} if replay else llm_model_spec(scn)
    core = build_llm_core(scn)
    horizon = horizon_s(scn, core.arrival_s)
    if drain_timeout_s is not None:
        check_drain_timeout_s(drain_timeout_s)
    if math.isnan(max_wall_s) or max_wall_s <= 0:
        raise LiveError(f"--max-wall-s {max_wall_s:g}: must be a number of seconds > 0")
    drain = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    if not force:
        predicted = sim_run(scn, drain_timeout_s=drain)
        check_bounds(predicted.summary["stability"], float(predicted.meta["end_s"]), horizon,
                     max_wall_s=max_wall_s)
    slots, max_len = decoder_capacity(scn, core)
    caching = bool(getattr(scn.policy, "enable_prefix_caching", False))
    if not replay and decoders is None:
        check_llm_engines(scn, spec, core, slots, max_len, yes=yes)
    import torch

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    resident = resident_engines(scn)
    loader = None
    if replay:
        from executor.llm_driver import ReplayDecoder
        from executor.testing import precise_sleep
        from sim.drivers.llm_simulate import build_step_model

        model = build_step_model(scn)
        if decoders is None:
            decoders = [ReplayDecoder(model, slots, max_len) for _ in range(resident)]
        cold_s = float(scn.autoscaling.cold_start_s or 0.0) if scn.autoscaling else 0.0

        def loader(replica: int) -> Any:
            precise_sleep(cold_s)  # the stand-in's cold start: the scenario's
            return ReplayDecoder(model, slots, max_len)
    else:
        if decoders is None:
            decoders = build_decoders(spec, resident, slots, max_len)

        def loader(replica: int) -> Any:  # the real cold start: build, then warm up
            return build_decoders(spec, 1, slots, max_len)[0]
    if caching and not replay:  # the KV manager's blocks, one store per engine
        store = (core.limits.num_blocks, int(scn.policy.block_size))  # type: ignore[union-attr]
        for d in decoders:
            d.attach_block_store(*store)
        base_loader = loader

        def loader(replica: int) -> Any:
            decoder = base_loader(replica)
            decoder.attach_block_store(*store)
            return decoder
    decoders = [decoder_hook(d) for d in decoders] if decoder_hook else list(decoders)
    if core.fleet is not None:
        ready = [r for r, state in enumerate(core.fleet.state) if state == READY]
        if len(decoders) < len(ready):
            raise LiveError(f"decoders: {len(decoders)} given for {len(ready)} resident "
                            "engines (autoscaling.initial_replicas)")
        by_slot: list[Any] = [None] * len(core.schedulers)
        for r, decoder in zip(ready, decoders, strict=False):
            by_slot[r] = decoder
        decoders = by_slot
    from executor.llm_driver import LiveLlmEngine

    engine = LiveLlmEngine(core, decoders, drain_until_s=horizon + drain,
                           loader=loader if core.fleet is not None else None)
    if on_engine is not None:
        on_engine(engine)
    t0 = time.perf_counter()
    with stop_on_signals(engine, stop_mode, enabled=handle_sigint):
        end_s = engine.run()
    counts = core.close()
    requests, steps, tokens, queue = tables(core)
    window_end = horizon if engine.stopped_at_s is None else min(horizon, engine.stopped_at_s)
    summary = summarize_llm(requests, core.token_s, core.token_offset, steps, queue,
                            warmup_s=scn.warmup_s, horizon_s=window_end, end_s=end_s,
                            num_blocks=core.limits.num_blocks, ttft_slo_ms=scn.slo.ttft_ms,
                            tpot_slo_ms=scn.slo.tpot_ms, driver="live",
                            replicas=scn.fleet_size,
                            price_per_replica_hour=scn.price_per_replica_hour,
                            fleet=llm_fleet_tables(core))
    if caching:
        requests["cached_tokens"] = cached_tokens(core)
        summary["prefix_cache"] = prefix_cache_summary(core)
    first = next((d for d in decoders if d is not None), None)
    described = first.describe() if first is not None and hasattr(first, "describe") else {}
    meta = run_meta(scn, driver="live", device={  # type: ignore[arg-type]
        "kind": str(spec.get("device") or "cpu"), "torch_threads": torch.get_num_threads()},
        extra={"kind": "llm", "model": described, "runner": "replay" if replay else "decoder",
               "end_s": end_s,
               "wall_s": time.perf_counter() - t0, "status_counts": counts,
               "stopped_early": engine.stopped_at_s is not None,
               "stopped_s": engine.stopped_at_s, "drain_timeout_s": drain,
               "stopped_by": engine.stopped_by if engine.stopped_at_s is not None else None,
               "drain_timed_out": engine.drain_timed_out,
               "step_errors": engine.step_errors[:20], "torch_version": torch.__version__,
               "steps": len(steps), "num_gpu_blocks": core.limits.num_blocks,
               "planned_horizon_s": horizon if math.isfinite(horizon) else None,
               "cold_starts_measured_s": engine.cold_starts_s,
               "fatal_error": engine.fatal_error,
               "kv_copies": engine.kv_copies if caching else None})
    fleet = llm_fleet_tables(core)
    return LlmResult(scn, summary, requests, steps, tokens, queue, meta,
                     *(fleet if fleet is not None else (None, None)))
