"""Every example runs (reduced sizes) and shows the effect it is there to teach."""

from __future__ import annotations

import importlib

import pytest


def run(name: str):
    return importlib.import_module(f"examples.{name}").main(quick=True)


def test_batch_size_tradeoff() -> None:
    t = run("batch_size_tradeoff").set_index("policy.max_batch_size")
    assert t.loc[1, "latency_ms.p99"] > 10 * t.loc[16, "latency_ms.p99"]  # batch 1 cannot keep up


def test_max_wait_tradeoff() -> None:
    t = run("max_wait_tradeoff")
    seq = t[t["load"] == "1 sequential client"].set_index("max_wait_ms")
    assert (seq["mean_batch"] == 1).all()
    assert seq.loc[10, "p50_ms"] > seq.loc[0, "p50_ms"] + 9  # waits the full 10 ms for nothing


def test_burstiness() -> None:
    t = run("burstiness")
    unbounded = t[t["queue_bound"] == "none"].set_index("cv")
    assert unbounded.loc[4, "p99_ms"] > unbounded.loc[1, "p99_ms"]
    bounded = t[t["queue_bound"] == 32].set_index("cv")
    assert bounded["queue_len_max"].max() <= 32


def test_replicas_vs_batching() -> None:
    t = run("replicas_vs_batching")
    batching = t.iloc[0]
    assert batching["usd_per_million"] < t.iloc[1:]["usd_per_million"].min()


def test_routing() -> None:
    t = run("routing").set_index("routing")
    assert t.loc["shared", "latency_ms.mean"] < t.loc["round_robin", "latency_ms.mean"]


def test_trace_replay() -> None:
    t = run("trace_replay")
    assert t["utilization"].is_monotonic_increasing
    assert t["p99_ms"].is_monotonic_increasing


@pytest.mark.slow
def test_capacity_planning() -> None:
    answer = run("capacity_planning")
    assert answer["met"] and answer["replicas"] >= 3


def test_llm_chunked_prefill() -> None:
    t = run("llm_chunked_prefill").set_index("policy.max_num_batched_tokens")
    small, large = t.loc[256], t.loc[8192]
    assert small["ttft_ms.p99"] > large["ttft_ms.p99"]  # prompts spread over more steps
    assert small["tpot_ms.p99"] < large["tpot_ms.p99"]  # decodes no longer stall
    assert small["itl_ms.p99"] < large["itl_ms.p99"] / 2


def test_autoscaling() -> None:
    t = run("autoscaling")
    delay = t.groupby("autoscaling.downscale_delay_s")["replicas.mean"].mean()
    assert delay.loc[60] > delay.loc[5]  # a long downscale delay keeps replicas longer
    target = t.groupby("autoscaling.target_ongoing_requests")
    replicas = target["replicas.mean"].mean()
    assert replicas.loc[1] > replicas.loc[4]  # a low target holds more replicas
    assert target["latency_ms.p99"].mean().loc[4] > target["latency_ms.p99"].mean().loc[1]
    assert t["meets_slo"].any() and not t["meets_slo"].all()


def test_hardware_planning() -> None:
    t = run("hardware_planning").set_index(["service.device", "service.tp"])["tpot_ms.p50"]
    # decode reads the weights each step: TPOT follows the memory bandwidth
    assert 1.2 < t[("a100-80gb", 1)] / t[("h100-sxm", 1)] < 1.8  # 3.35 / 2.04 = 1.64
    assert t[("l40s", 1)] > t[("a100-80gb", 1)]
    for device in ("h100-sxm", "a100-80gb", "l40s"):
        assert t[(device, 2)] < 0.8 * t[(device, 1)]

def test_an_example_runs_the_way_the_readme_says(tmp_path) -> None:
    """The README runs examples with ``python -m examples.NAME`` from the clone's root."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what -m gives
    done = subprocess.run([sys.executable, "-m", "examples.batch_size_tradeoff", "--quick"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "greedy batching" in done.stdout
