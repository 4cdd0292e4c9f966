"""Both LLM drivers call one :meth:`LlmCore.step`, so they apply events in the same order.

The case that used to differ: an engine finishes loading, then a request arrives, and the
driver only looks after both. The simulator made the engine ready first and routed the
arrival with it; the live driver admitted the arrival first, so it never saw the new engine.
Here the live driver is held inside one step (a scheduler call that stalls) while the engine
loads and the request arrives; the simulator, given the live run's measured load time as its
cold start, must route every request exactly as the live run did.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("torch")

import sim.llm
from executor.llm_driver import LiveLlmEngine
from sim.drivers.llm_simulate import build_llm_core
from sim.scenario.llm import load_llm_scenario

ARRIVAL_B_S = 0.5  # the second request: well after the launched engine finished loading
LOAD_S = 0.03  # the launched engine's load time (the loader's sleep)
STEP_S = 0.002  # the stand-in decoder's time per step


class FakeDecoder:
    """A decoder stand-in: every step takes :data:`STEP_S`; no model, no torch."""

    def __init__(self) -> None:
        self.cfg = SimpleNamespace(max_slots=8)

    def step(self, entries: list[Any]) -> None:
        time.sleep(STEP_S)

    def describe(self) -> dict[str, Any]:
        return {"name": "fake"}


def scenario(tmp_path: Path, cold_start_s: float) -> dict[str, Any]:
    trace = tmp_path / "two.csv"
    pd.DataFrame({"t": [0.0, ARRIVAL_B_S]}).to_csv(trace, index=False)
    return {"seed": 1,
            "service": {"kind": "llm_linear", "base_ms": STEP_S * 1e3,
                        "per_prefill_token_ms": 0, "per_decode_seq_ms": 0},
            # request A decodes for 400 steps (>= 0.8 s), so it is still running at B
            "workload": {"kind": "trace", "path": str(trace), "timestamp_column": "t",
                         "prompt_tokens": 8, "output_tokens": 400},
            "policy": {"kind": "vllm", "num_gpu_blocks": 400, "max_num_seqs": 8,
                       "max_num_batched_tokens": 64},
            "routing": "jsq",
            "autoscaling": {"kind": "target", "min_replicas": 1, "max_replicas": 2,
                            "target_ongoing_requests": 0.5, "upscale_delay_s": 0,
                            "downscale_delay_s": 60, "look_back_period_s": 0.05,
                            "control_period_s": 0.05, "cold_start_s": cold_start_s}}


def test_an_arrival_after_an_engine_loaded_is_routed_alike_by_both_drivers(tmp_path) -> None:
    core = build_llm_core(load_llm_scenario(scenario(tmp_path, LOAD_S)))
    loading = threading.Event()

    def loader(replica: int) -> FakeDecoder:
        loading.set()
        time.sleep(LOAD_S)
        return FakeDecoder()

    engine = LiveLlmEngine(core, [FakeDecoder(), None], drain_until_s=30.0, loader=loader)
    first = core.schedulers[0]
    plain_schedule = first.schedule
    stalled: list[float] = []

    def schedule(now_s: float) -> Any:
        # once the engine is loading, hold the driver inside this step until B is due:
        # the load ends and B arrives before the driver looks again
        if loading.is_set() and not stalled:
            stalled.append(now_s)
            while engine.now_s() < ARRIVAL_B_S + 0.05:
                time.sleep(0.005)
        return plain_schedule(now_s)

    first.schedule = schedule  # type: ignore[method-assign]
    engine.run()
    core.close()
    events = core.fleet.log.event_frame()  # type: ignore[union-attr]
    launched = events[events["replica"] == 1]
    launch_s = float(launched.loc[launched["event"] == "launch", "time_s"].min())
    ready_s = float(launched.loc[launched["event"] == "ready", "time_s"].min())
    assert stalled and stalled[0] < ready_s < ARRIVAL_B_S  # loaded inside the stall, before B
    live_replica = core.replica[: core.admitted].tolist()

    predicted = sim.llm.run(scenario(tmp_path, ready_s - launch_s))
    pev = predicted.fleet_events
    assert pev is not None
    pev = pev[pev["replica"] == 1]
    assert float(pev.loc[pev["event"] == "launch", "time_s"].min()) == pytest.approx(launch_s)
    assert float(pev.loc[pev["event"] == "ready", "time_s"].min()) == pytest.approx(ready_s)
    assert predicted.requests["replica"].tolist() == live_replica == [0, 1]
