"""Replaying measured times: ``sim.run(service=...)`` and ``sim.llm.run(step_model=...)``
give each batch (each step) the time a live run measured for it, in dispatch order."""

from __future__ import annotations

import numpy as np
import pytest

import sim
import sim.llm
from sim.errors import UserError
from sim.scenario.service import ReplayService
from sim.scenario.step_time import ReplayStepModel

BASE = {"seed": 1, "service": {"kind": "constant", "ms": 2},
        "workload": {"kind": "constant", "rate_rps": 100, "n_requests": 20},
        "policy": {"kind": "greedy", "max_batch_size": 4}}


def test_each_batch_takes_its_measured_time_then_the_model_draws() -> None:
    measured = [0.004, 0.001, 0.0075]
    result = sim.run(BASE, service=lambda model: ReplayService(measured, model))
    took = (result.batches["finish_s"] - result.batches["start_s"]).to_numpy()
    np.testing.assert_allclose(took[:3], measured, atol=1e-12)
    np.testing.assert_allclose(took[3:], 0.002, atol=1e-12)  # past the measured: the model
    assert "ReplayService(batches=3" in result.meta["device"]["service"]
    plain = sim.run(BASE)  # the scenario's own times without the hook
    np.testing.assert_allclose(plain.batches["finish_s"] - plain.batches["start_s"], 0.002)


def test_per_replica_replay_follows_each_replicas_own_order() -> None:
    cfg = {**BASE, "replicas": 2, "routing": "round_robin"}
    # replica 0's batches take 5 ms, replica 1's 1 ms, whatever the global dispatch order
    measured = [0.005, 0.001] * 10
    replicas = [0, 1] * 10
    result = sim.run(cfg, service=lambda model: ReplayService(measured, model,
                                                              replicas=replicas))
    b = result.batches
    took = b["finish_s"] - b["start_s"]
    np.testing.assert_allclose(took[b["replica"] == 0], 0.005, atol=1e-12)
    np.testing.assert_allclose(took[b["replica"] == 1], 0.001, atol=1e-12)


def test_a_bad_measured_time_is_a_field_error() -> None:
    with pytest.raises(UserError, match=r"durations_s\[1\]"):
        ReplayService([0.001, float("nan")], None)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="replicas: one per duration"):
        ReplayService([0.001], None, replicas=[0, 1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"durations_s\[0\]"):
        ReplayStepModel([-1.0], None)  # type: ignore[arg-type]


def test_llm_steps_take_their_measured_times() -> None:
    cfg = {"seed": 2, "service": {"kind": "llm_linear", "base_ms": 1, "per_decode_seq_ms": 0.1},
           "workload": {"kind": "poisson", "rate_rps": 20, "n_requests": 5,
                        "prompt_tokens": {"dist": "uniform", "low": 5, "high": 20},
                        "output_tokens": {"dist": "uniform", "low": 2, "high": 6}},
           "policy": {"kind": "vllm", "num_gpu_blocks": 60, "block_size": 8,
                      "max_num_seqs": 8, "max_num_batched_tokens": 64}}
    measured = [0.003, 0.002, 0.005]
    result = sim.llm.run(cfg, step_model=lambda model: ReplayStepModel(measured, model))
    steps = result.steps.sort_values("start_s")
    np.testing.assert_allclose(steps["duration_s"].to_numpy()[:3], measured, atol=1e-12)
    plain = sim.llm.run(cfg)
    assert plain.steps["duration_s"].iloc[0] != pytest.approx(0.003)
