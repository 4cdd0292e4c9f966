"""``sim.llm.run(scenario) -> LlmResult``: simulate an LLM scenario on its step model.

The clock is a plain event loop (no SimPy): an engine runs one step after another while it
has work, and a step's time is the step model's. Arrivals that come during a step join the
scheduler when it ends; an idle engine waits for the next arrival or the scheduler's timer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.step_profile import load_step_profile
from sim.drivers.llm_overheads import apply_overheads, overheads_s
from sim.metrics.llm import summarize_llm
from sim.metrics.prefix import cached_tokens, check_pools, pools, prefix_cache_summary
from sim.metrics.rundir import run_meta, write_json, write_table
from sim.metrics.window import horizon_s as window_horizon_s
from sim.scenario.build import WORKLOADS, Streams, _knobs, build_fleet
from sim.scenario.hash_workload import hash_workload
from sim.scenario.llm import LlmScenario, load_llm_scenario
from sim.scenario.schema import check_run_args
from sim.scenario.step_time import LinearStepModel, ProfileStepModel, StepModel
from sim.scenario.tokens import request_tokens
from sim.scenario.workloads import ArrivalSchedule, OpenLoop
from sim.serving.fleet import ColdStart
from sim.serving.llm.affinity import PrefixAffinity
from sim.serving.llm.core import LlmCore
from sim.serving.llm.schedulers import (
    ContinuousScheduler,
    LlmScheduler,
    SarathiScheduler,
    StaticScheduler,
    VllmScheduler,
)
from sim.serving.llm.steps import StepDone
from sim.serving.types import status_labels


@dataclass
class LlmResult:
    """An LLM run's tables, summary and provenance.

    Attributes:
        scenario: The resolved scenario.
        summary: The metrics (see :mod:`sim.metrics.llm`).
        requests: One row per request (arrival, first token, finish, tokens, preemptions).
        steps: One row per engine step (start, duration, composition, KV and queue state).
        tokens: One row per output token (``id``, ``index``, ``time_s``).
        queue: Waiting-queue length over time (``time_s``, ``queue``, ``length``).
        meta: Versions, host, seed, driver, wall time.
    """

    scenario: LlmScenario
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    tokens: pd.DataFrame
    queue: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    replicas: pd.DataFrame | None = None
    fleet_events: pd.DataFrame | None = None

    def write(self, out_dir: str | Path) -> Path:
        """Write the run directory: scenario.yaml, requests/steps/tokens/queue.parquet,
        summary.json, meta.json (autoscaled: replicas.parquet, fleet_events.parquet).
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "scenario.yaml").write_text(self.scenario.to_yaml())
        write_json(out / "meta.json", self.meta)
        write_table(self.requests, out / "requests.parquet")
        write_table(self.steps, out / "steps.parquet")
        write_table(self.tokens, out / "tokens.parquet")
        write_table(self.queue, out / "queue.parquet")
        if self.replicas is not None and self.fleet_events is not None:
            write_table(self.replicas, out / "replicas.parquet")
            write_table(self.fleet_events, out / "fleet_events.parquet")
        write_json(out / "summary.json", self.summary)
        return out


def build_scheduler(scenario: LlmScenario) -> LlmScheduler:
    """A fresh scheduler for the scenario's ``policy``."""
    cfg = scenario.policy
    if cfg.kind == "static":
        return StaticScheduler(max_batch_size=cfg.max_batch_size, max_wait_ms=cfg.max_wait_ms)
    if cfg.kind == "continuous":
        return ContinuousScheduler(num_blocks=cfg.blocks(), block_size=cfg.block_size,
                                   max_num_seqs=cfg.max_num_seqs,
                                   max_num_batched_tokens=cfg.max_num_batched_tokens)
    if cfg.kind == "sarathi":
        return SarathiScheduler(num_blocks=cfg.blocks(), block_size=cfg.block_size,
                                max_num_seqs=cfg.max_num_seqs,
                                max_num_batched_tokens=cfg.max_num_batched_tokens,
                                enable_prefix_caching=cfg.enable_prefix_caching)
    return VllmScheduler(num_blocks=cfg.blocks(), block_size=cfg.block_size,
                         max_num_seqs=cfg.max_num_seqs,
                         max_num_batched_tokens=cfg.max_num_batched_tokens,
                         enable_chunked_prefill=cfg.enable_chunked_prefill,
                         long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                         prefill_first=cfg.prefill_first,
                         scheduling_policy=cfg.scheduling_policy,
                         enable_prefix_caching=cfg.enable_prefix_caching)


def build_step_model(scenario: LlmScenario) -> StepModel:
    """The step-time model of the scenario's ``service``."""
    s = scenario.service
    if s.kind == "llm_profile":
        return ProfileStepModel(load_step_profile(s.path), s.path)
    if s.kind == "llm_roofline":
        from sim.scenario.roofline.service import build_roofline

        return build_roofline(s)
    return LinearStepModel(s.base_ms, s.per_prefill_token_ms, s.per_decode_seq_ms,
                           s.per_kv_token_ms, s.per_prefill_context_ms,
                           s.per_prefill_sq_ms, s.per_prefill_seq_ms)


TOKEN_KEYS = ("prompt_tokens", "output_tokens", "prompt_tokens_column", "output_tokens_column",
              "prompt_tokens_max", "output_tokens_max")


def llm_schedule(scenario: LlmScenario) -> tuple[ArrivalSchedule, np.ndarray, np.ndarray]:
    """The arrival schedule and each request's (prompt, output) tokens for the seed. Token
    lengths come from their own stream, so changing them keeps the arrival times.
    """
    cfg = scenario.workload
    if cfg.kind == "hash_trace":
        schedule, prompt, output, _ = hash_workload(scenario)
        return schedule, prompt, output
    workload = WORKLOADS[cfg.kind](**_knobs(cfg, *TOKEN_KEYS))
    assert isinstance(workload, OpenLoop)  # LLM workloads are open loop
    streams = Streams.from_seed(scenario.seed)
    schedule = workload.schedule(streams.arrivals)
    prompt, output = request_tokens(scenario.workload, schedule, streams.classes)
    return schedule, prompt, output


def build_llm_core(scenario: LlmScenario) -> LlmCore:
    """The engine core with the scenario's requests and one scheduler per replica (shared
    with live).
    """
    keys = None
    if scenario.workload.kind == "hash_trace":
        schedule, prompt, output, keys = hash_workload(scenario)
    else:
        schedule, prompt, output = llm_schedule(scenario)
    fleet = build_fleet(scenario)
    aff = scenario.prefix_affinity
    return LlmCore(schedule.arrival_s, prompt, output,
                   [build_scheduler(scenario) for _ in range(scenario.fleet_size)],
                   routing=scenario.routing, priority=schedule.priority, fleet=fleet,
                   block_keys=keys, affinity=PrefixAffinity(
                       aff.balance_abs_threshold, aff.balance_rel_threshold,
                       aff.cache_threshold))


def llm_cold_start(scenario: LlmScenario) -> ColdStart | None:
    """An autoscaled LLM scenario's cold start (``autoscaling.cold_start_s``)."""
    cfg = scenario.autoscaling
    if cfg is None:
        return None
    return ColdStart(np.empty(0), float(cfg.cold_start_s or 0.0),
                     Streams.from_seed(scenario.seed).cold_start)


def simulate(core: LlmCore, model: StepModel, until_s: float = math.inf,
             cold_start: ColdStart | None = None) -> float:
    """Run the core's replicas on the step model until every request is done (or
    ``until_s``); return the end time.

    The clock only: it calls :meth:`sim.serving.llm.core.LlmCore.step` (which applies steps
    ending, engines becoming ready, control periods and arrivals in one fixed order and
    plans the next steps), gives each started step the step model's time, draws each
    launched engine's cold start, and moves to the next event.
    """
    running: dict[int, StepDone] = {}
    ready_at: dict[int, float] = {}
    finished: list[StepDone] = []
    ready: list[tuple[int, float]] = []
    now = 0.0
    while True:
        actions = core.step(now, finished, ready=ready)
        if core.fleet is not None:
            assert cold_start is not None, "an autoscaled core needs a cold-start model"
            for r in actions.cancel:  # a scale-down during its cold start: never ready
                del ready_at[r]
            for r in actions.launch:
                ready_at[r] = now + cold_start.sample_s()
        for begun in actions.start:
            running[begun.replica] = StepDone(begun.replica, begun.plan, begun.comp, now,
                                              now + model.step_s(begun.comp))
        ends = [done.end_s for done in running.values()]
        nxt = min([actions.wake_s, *ends, *ready_at.values()])
        if nxt == math.inf:
            return now
        if nxt >= until_s:  # stop: steps still running are not recorded (censored)
            return max(now, until_s) if ends or core.next_arrival_s() < math.inf else now
        now = max(now, nxt)
        finished = [done for done in running.values() if done.end_s <= now]
        for done in finished:
            del running[done.replica]
        ready = [(r, at_s) for r, at_s in sorted(ready_at.items(), key=lambda x: x[1])
                 if at_s <= now]
        for r, _ in ready:
            del ready_at[r]


def horizon_s(scenario: LlmScenario, arrival_s: np.ndarray) -> float:
    """End of the measurement window (:func:`sim.metrics.window.horizon_s` of the last arrival)."""
    return window_horizon_s(scenario, float(arrival_s[-1]) if arrival_s.size else 0.0)


def decoder_capacity(scenario: LlmScenario, core: LlmCore) -> tuple[int, int]:
    """(KV-cache slots, tokens per slot) a live decoder needs for this scenario's requests:
    the scheduler's sequence limit and the longest prompt + output.
    """
    cfg = scenario.policy
    slots = int(getattr(cfg, "max_num_seqs", 0) or getattr(cfg, "max_batch_size", 1))
    longest = int((core.prompt_tokens + core.output_tokens).max()) if core.arrival_s.size \
        else 1
    return slots, longest + 1


def tables(core: LlmCore) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The requests, steps, tokens and queue tables of a finished core."""
    n = core.admitted
    requests = pd.DataFrame({
        "id": np.arange(n), "replica": core.replica[:n], "priority": core.priority[:n],
        "arrival_s": core.arrival_s[:n],
        "prompt_tokens": core.prompt_tokens[:n], "output_tokens": core.output_tokens[:n],
        "first_token_s": core.first_token_s[:n], "finish_s": core.finish_s[:n],
        "status": pd.Categorical(status_labels(core.status[:n])),
        "reason": core.reason[:n].astype(str), "preemptions": core.preemptions[:n],
        "work_tokens": core.work_tokens[:n]})
    steps = pd.DataFrame({k: np.asarray(v) for k, v in vars(core.steps).items()})
    if steps.empty:
        steps = pd.DataFrame({k: np.empty(0) for k in vars(core.steps)})
    end = int(core.token_offset[n])
    counts = np.diff(core.token_offset[:n + 1])  # no slots for a request refused on arrival
    tokens = pd.DataFrame({
        "id": np.repeat(np.arange(n, dtype=np.int64), counts),
        "index": (np.arange(end) - np.repeat(core.token_offset[:n], counts)).astype(np.int64),
        "time_s": core.token_s[:end]})
    queue = pd.DataFrame({"time_s": np.asarray(core.queue_time_s),
                          "queue": np.asarray(core.queue_replica, dtype=np.int32),
                          "length": np.asarray(core.queue_len, dtype=np.int64)})
    return requests, steps, tokens, queue


def run(scenario: LlmScenario | dict[str, Any] | str | Path,
        overrides: list[str] | dict[str, Any] | None = None, *,
        drain_timeout_s: float | None = None,
        step_model: Callable[[StepModel], StepModel] | None = None) -> LlmResult:
    """Simulate an LLM scenario.

    Args:
        scenario: An :class:`LlmScenario`, a dict, a YAML path, or ``builtin:NAME``.
        overrides: Dotted-key overrides, e.g. ``{"policy.max_num_batched_tokens": 512}``.
        drain_timeout_s: Stop this long after the horizon; what is unfinished stays in flight
            (censored). None: drain every request.
        step_model: Wraps the scenario's step-time model (given it, returns the model to
            simulate with), e.g. a :class:`sim.scenario.step_time.ReplayStepModel` of the
            step times a live run measured.

    Raises:
        ScenarioError: the scenario is invalid.
        StepInvariantError: a step broke a limit or lost a token (a bug).
    """
    check_run_args(drain_timeout_s=drain_timeout_s)
    scn = load_llm_scenario(scenario, overrides)
    t0 = time.perf_counter()
    core = build_llm_core(scn)
    model = build_step_model(scn)
    if step_model is not None:
        model = step_model(model)
    horizon = horizon_s(scn, core.arrival_s)
    arrival_s = core.arrival_s
    over = overheads_s(scn)
    if over.request_s:  # the core sees a request when it is past the API and tokenisation
        core.arrival_s = core.arrival_s + over.request_s
    until = math.inf if drain_timeout_s is None else horizon + drain_timeout_s
    end_s = simulate(core, model, until, llm_cold_start(scn))
    counts = core.close()
    check_pools(core)
    wall_s = time.perf_counter() - t0
    requests, steps, tokens, queue = tables(core)
    caching = bool(pools(core))
    if caching:
        requests["cached_tokens"] = cached_tokens(core)
    token_s = core.token_s
    if any(over):
        requests, tokens, token_s = apply_overheads(requests, tokens, core.token_s,
                                                    core.token_offset, arrival_s,
                                                    over.per_token_s, over.post_decode_s)
    num_blocks = core.limits.num_blocks
    summary = summarize_llm(requests, token_s, core.token_offset, steps, queue,
                            warmup_s=scn.warmup_s, horizon_s=horizon, end_s=end_s,
                            num_blocks=num_blocks, ttft_slo_ms=scn.slo.ttft_ms,
                            tpot_slo_ms=scn.slo.tpot_ms, driver="sim",
                            replicas=scn.fleet_size,
                            price_per_replica_hour=scn.price_per_replica_hour,
                            fleet=llm_fleet_tables(core))
    if caching:
        summary["prefix_cache"] = prefix_cache_summary(core)
    meta = run_meta(scn, driver="sim", device={"kind": "simulated",  # type: ignore[arg-type]
                                               "service": repr(model),
                                               "scheduler": repr(core.scheduler)},
                    extra={"kind": "llm", "end_s": end_s, "wall_s": wall_s,
                           "status_counts": counts, "drain_timeout_s": drain_timeout_s,
                           "steps": len(steps), "num_gpu_blocks": num_blocks,
                           "extrapolated_steps": getattr(model, "extrapolated", 0),
                           "requests_per_wall_s": len(requests) / wall_s if wall_s else None,
                           "tokens_per_wall_s": int(core.token_offset[core.admitted]) / wall_s
                           if wall_s else None})
    fleet = llm_fleet_tables(core)
    return LlmResult(scn, summary, requests, steps, tokens, queue, meta,
                     *(fleet if fleet is not None else (None, None)))


def llm_fleet_tables(core: LlmCore) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The replica series and fleet events of an autoscaled core (None: fixed engines)."""
    if core.fleet is None:
        return None
    return core.fleet.log.series(), core.fleet.log.event_frame()
