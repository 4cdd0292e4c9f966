"""servelab bench against the local stub: counts, token counts, the metric definitions
(``vllm bench serve``'s) on hand-checked cases, and the run directory ``live`` writes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from executor.endpoint.bench import _outcome_tables, bench, bench_summary, make_jobs
from executor.endpoint.chat_prompts import ChatPrompts
from executor.endpoint.client import Job, Outcome
from executor.endpoint.server_info import EndpointError
from sim.drivers.llm_simulate import llm_schedule
from sim.scenario.llm import load_llm_scenario
from tests.executor.endpoint.conftest import write_scenario


def _summary(outs: list[Outcome], jobs: list[Job]) -> dict[str, object]:
    requests, token_s, offset, _ = _outcome_tables(outs, jobs, np.zeros(len(jobs), np.int8))
    return bench_summary(requests, token_s, offset, outs, warmup_s=0.0, window_end_s=10.0,
                         end_s=10.0, ttft_slo_ms=None, tpot_slo_ms=None, cpu_share=0.1)


def test_metric_definitions_on_a_hand_checked_case() -> None:
    # request 0: sent at 0.0, chunks of one token at 0.10, 0.15, 0.25 s
    # request 1: sent at 1.0, a one-token chunk at 1.10 then a two-token chunk at 1.20 s
    jobs = [Job(0, 0.0, [1], 1, 3), Job(1, 1.0, [1], 1, 3)]
    a = Outcome(0, 0.0, started_s=0.0, sent_s=0.0, chunk_s=[0.10, 0.15, 0.25],
                chunk_tokens=[1, 1, 1], status="ok")
    b = Outcome(1, 1.0, started_s=1.0, sent_s=1.0, chunk_s=[1.10, 1.20],
                chunk_tokens=[1, 2], status="ok")
    s = _summary([a, b], jobs)
    assert s["ttft_ms"]["mean"] == pytest.approx(100.0)  # first chunk - send, both
    assert s["e2e_ms"]["p50"] == pytest.approx((250.0 + 200.0) / 2)  # last chunk - send
    # TPOT = (E2E - TTFT) / (output tokens - 1): (250-100)/2 = 75 and (200-100)/2 = 50
    assert s["tpot_ms"]["mean"] == pytest.approx(62.5)
    # ITL per chunk, pooled: 50, 100 (request 0) and 100 (request 1), no zero gap
    assert s["itl_ms"]["mean"] == pytest.approx(250.0 / 3)
    assert s["itl_ms"]["max"] == pytest.approx(100.0)
    assert s["ok"] == 2 and s["client"]["tokens_received"] == 6


def test_failed_and_unfinished_requests_are_left_out_of_the_latencies() -> None:
    jobs = [Job(0, 0.0, [1], 1, 2), Job(1, 0.5, [1], 1, 2), Job(2, 0.6, [1], 1, 2)]
    ok = Outcome(0, 0.0, started_s=0.0, sent_s=0.0, chunk_s=[0.1, 0.2],
                 chunk_tokens=[1, 1], status="ok")
    few = Outcome(1, 0.5, started_s=0.5, sent_s=0.5, chunk_s=[0.9], chunk_tokens=[1],
                  status="failed", cause="too_few_tokens")
    flying = Outcome(2, 0.6, started_s=0.6, sent_s=0.6, chunk_s=[0.7], chunk_tokens=[1])
    s = _summary([ok, few, flying], jobs)
    assert (s["ok"], s["failed"], s["in_flight"]) == (1, 1, 1)
    assert s["ttft_ms"]["max"] == pytest.approx(100.0)
    assert s["client"]["errors_by_cause"] == {"too_few_tokens": 1}


def test_prompts_have_the_scenarios_lengths_and_no_shared_prefix(tmp_path: Path) -> None:
    scn = load_llm_scenario(write_scenario(tmp_path / "s.yaml", n_requests=50,
                                           prompt_tokens={"dist": "uniform", "low": 20,
                                                          "high": 60}))
    schedule, prompt, output = llm_schedule(scn)
    jobs = make_jobs(schedule.arrival_s, prompt, output, "openai-completions", 3, (10, 250))
    assert [len(j.prompt) for j in jobs] == prompt.tolist()
    assert [j.scheduled_s for j in jobs] == schedule.arrival_s.tolist()
    heads = {tuple(j.prompt[:4]) for j in jobs}  # type: ignore[index]
    assert len(heads) == len(jobs)
    assert all(10 <= t < 250 for j in jobs for t in j.prompt)  # type: ignore[union-attr]


def test_bench_on_the_stub_keeps_the_schedule_and_the_stubs_timing(stub_url: str,
                                                                   tmp_path: Path) -> None:
    # the stub sends the first token 40 ms after the request, then one every 10 ms
    path = write_scenario(tmp_path / "timed.yaml", rate_rps=10, n_requests=10,
                          output_tokens=6)
    result = bench(path, stub_url, model="timed:40:10")
    req = result.requests
    assert len(req) == 10 and (req["status"] == "ok").all()
    assert (req["received_tokens"] == 6).all() and (req["server_prompt_tokens"] == 40).all()
    schedule, _, _ = llm_schedule(result.scenario)
    assert req["scheduled_s"].tolist() == schedule.arrival_s.tolist()
    assert (req["send_lag_s"] >= 0).all()
    ttft = (req["first_token_s"] - req["arrival_s"]).to_numpy() * 1e3
    e2e = (req["finish_s"] - req["arrival_s"]).to_numpy() * 1e3
    # the server cannot answer before its own delays: 40 ms, and 40 + 5 × 10 ms
    assert ttft.min() >= 40.0 and e2e.min() >= 90.0
    assert result.summary["ttft_ms"]["p50"] == pytest.approx(float(np.median(ttft)))
    tokens = result.tokens
    assert len(tokens) == 60 and (tokens.groupby("id").size() == 6).all()
    assert result.summary["client"]["cpu_share"] > 0


def test_run_directory_is_lives(stub_url: str, tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "dir.yaml", n_requests=4)
    out = bench(path, stub_url, model="instant").write(tmp_path / "run")
    names = {p.name for p in out.iterdir()}
    assert {"scenario.yaml", "requests.parquet", "steps.parquet", "tokens.parquet",
            "queue.parquet", "summary.json", "meta.json"} <= names
    meta = json.loads((out / "meta.json").read_text())
    assert meta["driver"] == "bench" and meta["kind"] == "llm"
    assert meta["server_models"]["data"][0]["id"] == "instant"
    assert meta["server_config"]["block_size"] == 16
    assert meta["server_config"]["num_blocks"] == 1024
    assert 0 < meta["client_cpu_share"] < 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["driver"] == "bench" and summary["ok"] == 4
    live_cols = ["id", "replica", "priority", "arrival_s", "prompt_tokens", "output_tokens",
                 "first_token_s", "finish_s", "status", "reason", "preemptions",
                 "work_tokens"]
    assert list(pd.read_parquet(out / "requests.parquet").columns[:12]) == live_cols
    assert list(pd.read_parquet(out / "tokens.parquet").columns[:3]) == ["id", "index",
                                                                         "time_s"]


def test_max_concurrency_bounds_the_requests_in_flight(stub_url: str, tmp_path: Path) -> None:
    # 6 requests at once, each ~60 ms: with 2 slots they go in three waves
    path = write_scenario(tmp_path / "conc.yaml", rate_rps=1000, n_requests=6,
                          output_tokens=3)
    result = bench(path, stub_url, model="timed:40:10", max_concurrency=2)
    req = result.requests.sort_values("arrival_s")
    starts, ends = req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()
    in_flight = [int(((starts <= t) & (ends > t)).sum()) for t in starts]
    assert max(in_flight) <= 2
    # the later waves waited for a slot: the third request by schedule gets one only when
    # one of the first two has finished, at least the stub's 40 + 2 × 10 ms after its send
    # (a sleep never ends early), so it waited at least that less the time between the
    # earlier send and its own start (about 58 ms at 1 ms spacing; a client that ignored
    # the limit waits 0)
    by_schedule = result.requests.sort_values("scheduled_s")
    sent = by_schedule["arrival_s"].to_numpy()
    started = (by_schedule["scheduled_s"] + by_schedule["send_lag_s"]).to_numpy()
    assert req["client_wait_s"].max() >= (sent[:2].min() + 0.040 + 2 * 0.010 - started[2]
                                          - 1e-9), by_schedule
    assert math.isfinite(result.summary["e2e_ms"]["p50"])


def test_chat_api_counts_tokens_from_the_deltas(stub_url: str, tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "chat.yaml", n_requests=3, output_tokens=5)
    result = bench(path, stub_url, api="openai-chat", model="instant")
    assert (result.requests["status"] == "ok").all()
    assert (result.requests["received_tokens"] == 5).all()
    assert result.meta["device"]["api"] == "openai-chat"


def test_chat_prompts_have_the_scenarios_token_counts(stub_url: str, tmp_path: Path) -> None:
    # the stub's template adds 7 tokens and counts one per word: the text is cut to fit
    from executor.endpoint.stub import CHAT_TEMPLATE_TOKENS

    path = write_scenario(tmp_path / "chat.yaml", n_requests=6, prompt_tokens=40,
                          output_tokens=3)
    result = bench(path, stub_url, api="openai-chat", model="instant")
    req = result.requests
    assert result.meta["chat_template_tokens"] == CHAT_TEMPLATE_TOKENS
    assert (req["server_prompt_tokens"] == 40).all() and (req["prompt_tokens"] == 40).all()
    assert result.summary["client"]["prompt_token_mismatches"] == 0
    texts = {str(j.prompt) for j in make_jobs(
        np.zeros(6), np.full(6, 40), np.full(6, 3), "openai-chat", 3, (10, 250),
        ChatPrompts(CHAT_TEMPLATE_TOKENS, tuple("abcdefgh")))}
    assert len(texts) == 6  # unique per request
    # a mismatch the server reports is counted: token-id prompts the stub counts as is
    outs = [Outcome(0, 0.0, started_s=0.0, sent_s=0.0, chunk_s=[0.1], chunk_tokens=[1],
                    status="ok", server_prompt_tokens=41)]
    assert _summary(outs, [Job(0, 0.0, [1], 40, 1)])["client"][
        "prompt_token_mismatches"] == 1


def test_chat_prompts_shorter_than_the_template_are_refused(stub_url: str,
                                                           tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "chat.yaml", n_requests=2, prompt_tokens=5)
    with pytest.raises(EndpointError, match="prompt_tokens 5: the server's chat template"):
        bench(path, stub_url, api="openai-chat", model="instant")
