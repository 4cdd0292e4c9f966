"""Autoscaling LLM engines in the simulator: the same fleet and autoscalers as the
request-level path, engines that finish what they hold before they stop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.llm import run

SERVICE = {"kind": "llm_linear", "base_ms": 6, "per_prefill_token_ms": 0.03,
           "per_decode_seq_ms": 0.08, "per_kv_token_ms": 0.00002}
TOKENS = {"prompt_tokens": {"dist": "lognormal", "mean": 600, "cv": 0.8, "max": 3000},
          "output_tokens": {"dist": "lognormal", "mean": 120, "cv": 1.0, "max": 600}}
POLICY = {"kind": "vllm", "num_gpu_blocks": 3000, "max_num_seqs": 32,
          "max_num_batched_tokens": 1024}


def scenario(**extra: Any) -> dict[str, Any]:
    workload = extra.pop("workload", {"kind": "sinusoid", "rate_rps": 6, "amplitude": 1.0,
                                      "period_s": 60, "duration_s": 120, **TOKENS})
    return {"name": "llm-scale", "seed": 3, "service": SERVICE, "workload": workload,
            "policy": POLICY, **extra}


@pytest.mark.parametrize("routing", ["jsq", "round_robin"])
def test_pinned_bounds_and_instant_cold_start_equal_fixed_engines_exactly(routing) -> None:
    fixed = run(scenario(replicas=3, routing=routing))
    scaled = run(scenario(routing=routing, autoscaling={
        "kind": "target", "min_replicas": 3, "max_replicas": 3, "cold_start_s": 0,
        "control_period_s": 0.5}))
    pd.testing.assert_frame_equal(fixed.requests, scaled.requests)
    pd.testing.assert_frame_equal(fixed.steps, scaled.steps)
    assert scaled.summary["ttft_ms"] == fixed.summary["ttft_ms"]
    assert scaled.summary["replica_seconds"] == pytest.approx(fixed.summary["replica_seconds"])


def test_after_scale_to_zero_the_first_request_waits_for_an_engine_to_load(tmp_path) -> None:
    path = Path(tmp_path) / "t.csv"
    pd.DataFrame({"t": [0.0, 1.0, 60.0]}).to_csv(path, index=False)
    workload = {"kind": "trace", "path": str(path), "timestamp_column": "t",
                "prompt_tokens": 100, "output_tokens": 10}
    result = run(scenario(workload=workload, autoscaling={
        "kind": "concurrency", "min_replicas": 0, "max_replicas": 2, "initial_replicas": 1,
        "target_concurrency": 4, "stable_window_s": 5, "panic_window_s": 1,
        "scale_to_zero_grace_s": 5, "cold_start_s": 8}))
    req = result.requests
    ttft = (req["first_token_s"] - req["arrival_s"]).to_numpy()
    one_step_s = (6 + 0.03 * 100) / 1e3
    assert ttft[:2] == pytest.approx([one_step_s] * 2)  # the resident engine
    assert ttft[2] == pytest.approx(8 + one_step_s)  # a whole cold start, then the prefill
    s = result.summary
    assert s["cold_starts"] == 1 and s["empty_fleet_wait_s"]["max"] == pytest.approx(8)
    assert s["replicas"]["min"] == 0


def test_engines_run_steps_only_while_ready_or_draining_and_lose_nothing() -> None:
    result = run(scenario(price_per_replica_hour=1.0, autoscaling={
        "kind": "target", "min_replicas": 1, "max_replicas": 4,
        "target_ongoing_requests": 6, "upscale_delay_s": 1, "downscale_delay_s": 5,
        "look_back_period_s": 2, "cold_start_s": 5}))
    req, steps, ev = result.requests, result.steps, result.fleet_events
    assert (req["status"] == "ok").all()  # every request finished its output
    assert {"launch", "ready", "retire", "stop"} <= set(ev["event"])
    for r, group in steps.groupby("replica"):
        mine = ev[ev["replica"] == r]
        up = mine.loc[mine["event"] == "ready", "time_s"].to_numpy()
        down = mine.loc[mine["event"] == "stop", "time_s"].to_numpy()
        for start in group["start_s"]:
            k = np.searchsorted(up, start, side="right") - 1
            assert k >= 0
            later = down[down >= up[k]]
            assert later.size == 0 or start < later[0]  # never after the engine stopped
    s = result.summary
    total = s["replica_seconds"]
    assert s["cost_per_million_usd"] == pytest.approx(
        total / 3600 / (s["throughput_rps"] * 120) * 1e6)
    assert 1 < s["replicas"]["mean"] < 4


def test_retire_newest_takes_the_engine_that_became_ready_last() -> None:
    # the fleet is shared: the LLM autoscaler retires by the same rule (Ray's newest-first)
    result = run(scenario(autoscaling={
        "kind": "target", "min_replicas": 1, "max_replicas": 4, "retire": "newest",
        "target_ongoing_requests": 6, "upscale_delay_s": 1, "downscale_delay_s": 5,
        "look_back_period_s": 2, "cold_start_s": 5}))
    ready_at_s: dict[int, float] = {}
    retired = 0
    for time_s, replica, event in result.fleet_events[["time_s", "replica",
                                                       "event"]].itertuples(index=False):
        if event == "ready":
            ready_at_s[replica] = time_s
        elif event == "retire":
            assert replica == max(ready_at_s, key=lambda r: (ready_at_s[r], r))
            del ready_at_s[replica]
            retired += 1
    assert retired >= 1 and (result.requests["status"] == "ok").all()


@pytest.mark.parametrize(("change", "text"), [
    ({"autoscaling": {"kind": "target", "max_replicas": 2}},
     "autoscaling.cold_start_s: an LLM engine's cold start"),
    ({"replicas": 2, "autoscaling": {"kind": "target", "max_replicas": 2, "cold_start_s": 1}},
     "leave replicas out"),
    ({"autoscaling": {"kind": "target", "min_replicas": 3, "max_replicas": 2,
                      "cold_start_s": 1}}, "autoscaling.min_replicas: 3 is above"),
    ({"autoscaling": {"kind": "target", "max_replicas": 2, "cold_start_s": 1,
                      "graceful_shutdown_wait_loop_s": 2}},
     "autoscaling.graceful_shutdown_wait_loop_s: not modelled for LLM engines"),
    ({"autoscaling": {"kind": "target", "max_replicas": 2, "cold_start_s": 1,
                      "outside_ms": 5}}, "autoscaling.outside_ms: not modelled for LLM engines"),
    ({"autoscaling": {"kind": "target", "max_replicas": 2, "cold_start_s": 1,
                      "graceful_shutdown_timeout_s": 20}},
     "autoscaling.graceful_shutdown_timeout_s: not modelled for LLM engines"),
])
def test_bad_llm_autoscaling_is_one_line(change: dict[str, Any], text: str) -> None:
    with pytest.raises(Exception) as info:
        run(scenario(**change))
    assert text in str(info.value) and "\n" not in str(info.value)


def test_a_scale_down_while_engines_load_cancels_them_and_reroutes_what_they_held(
        tmp_path) -> None:
    # from zero: the first arrival launches 3 engines (the schedule); the next ones wait on
    # the loading engines (none is ready); at 1 s the schedule wants 1: the two newest
    # launches (2, then 1) are cancelled, as Ray stops replicas not running yet first, and
    # the requests they held go back to the router (engine 0, still loading)
    times = np.append(np.arange(0.0, 0.9, 0.05), 6.0)  # the last one: the window to 6 s
    path = Path(tmp_path) / "t.csv"
    pd.DataFrame({"t": times}).to_csv(path, index=False)
    workload = {"kind": "trace", "path": str(path), "timestamp_column": "t",
                "prompt_tokens": 100, "output_tokens": 10}
    cfg = scenario(workload=workload, warmup_s=0, autoscaling={
        "kind": "schedule", "steps": [[0, 3], [1.0, 1]], "min_replicas": 0,
        "initial_replicas": 0, "cold_start_s": 4, "control_period_s": 0.5})
    result = run(cfg)
    req, steps, ev, s = result.requests, result.steps, result.fleet_events, result.summary
    assert ev[["time_s", "replica", "event"]].values.tolist() == [
        [0.0, 0, "launch"], [0.0, 1, "launch"], [0.0, 2, "launch"],
        [1.0, 2, "cancel"], [1.0, 1, "cancel"], [4.0, 0, "ready"]]
    assert (req["status"] == "ok").all() and len(req) == len(times)  # nothing lost
    assert (req["replica"] == 0).all() and set(steps["replica"]) == {0}
    assert (req["first_token_s"] >= 4.0).all()
    # replica-seconds over the window [0, 6 s]: engine 0 all of it, engines 1 and 2 from
    # 0 s to the cancel at 1 s (to their ready at 4 s, 6 s more, if they had loaded on)
    assert s["window_s"] == 6.0
    assert s["replica_seconds"] == pytest.approx(6.0 + 2 * 1.0, rel=1e-12)
    again = run(cfg)  # the same seed: the same output
    pd.testing.assert_frame_equal(again.requests, req)
    pd.testing.assert_frame_equal(again.fleet_events, ev)
