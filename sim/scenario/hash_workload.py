"""A hash-block trace as an LLM scenario's workload: its arrivals, token lengths and the
engine block keys that let replicas share cached prefixes.
"""

from __future__ import annotations

import numpy as np

from sim.scenario.hash_trace import read_hash_trace, trace_keys
from sim.scenario.llm import HashTraceCfg, LlmScenario
from sim.scenario.workloads import ArrivalSchedule, WorkloadError


def hash_workload(scenario: LlmScenario
                  ) -> tuple[ArrivalSchedule, np.ndarray, np.ndarray, list[tuple[int, ...]]]:
    """(schedule, prompt tokens, output tokens, engine block keys) of a ``hash_trace``
    workload. Arrivals are ``(trace time - start_s) × time_scale``; ``duration_s`` keeps those
    before it (simulated seconds), ``n_requests`` the first so many.

    Raises:
        WorkloadError: the trace is unreadable, or the selection holds no request.
    """
    cfg = scenario.workload
    assert isinstance(cfg, HashTraceCfg)
    trace = read_hash_trace(cfg.path, cfg.format, cfg.block_size)
    arrival = (trace.arrival_s - cfg.start_s) * cfg.time_scale
    keep = arrival >= 0
    if cfg.duration_s is not None:
        keep &= arrival < cfg.duration_s
    rows = np.flatnonzero(keep)
    if cfg.n_requests is not None:
        rows = rows[: cfg.n_requests]
    if rows.size == 0:
        raise WorkloadError(f"workload: no request of {cfg.path!r} in the selection "
                            f"(start_s {cfg.start_s:g}, duration_s {cfg.duration_s})")
    engine_block_size = getattr(scenario.policy, "block_size", trace.block_size)
    keys = trace_keys(trace, engine_block_size)
    n = rows.size
    schedule = ArrivalSchedule(arrival[rows], np.ones(n, dtype=np.int64),
                               np.zeros(n, dtype=np.int64), rows=rows)
    return (schedule, trace.prompt_tokens[rows], trace.output_tokens[rows],
            [keys[i] for i in rows])
