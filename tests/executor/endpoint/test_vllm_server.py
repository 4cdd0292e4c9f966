"""servelab bench against a real vLLM (CPU build, tiny random-weight Llama) on a loopback
port: counts, exact token counts, and TTFT/ITL checked against the server's own /metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from executor.endpoint.bench import bench
from tests.executor.endpoint.conftest import bench_cli, write_scenario

pytestmark = pytest.mark.slow


def _delta(result: Any, name: str) -> float:
    before = result.meta["server_metrics_before"]["values"].get(name, 0.0)
    return float(result.meta["server_metrics_after"]["values"][name] - before)


LONE_PROBES = 12


def _lone_way_ms(url: str, tmp_path: Path) -> tuple[float, float]:
    """The client's way to vLLM and back around its TTFT stamps, and its standard error (ms):
    :data:`LONE_PROBES` requests of the test's prompt length, one output token each, one at a
    time (``max_concurrency`` 1: each is sent after the last one finished), our mean TTFT
    less vLLM's own over the same requests.
    """
    path = write_scenario(tmp_path / "lone.yaml", rate_rps=20, n_requests=LONE_PROBES,
                          prompt_tokens=100, output_tokens=1)
    probe = bench(path, url, max_concurrency=1)
    assert (probe.requests["status"] == "ok").all(), probe.requests["error"].tolist()
    served = _delta(probe, "time_to_first_token_seconds_count")
    assert served == LONE_PROBES
    server_ms = _delta(probe, "time_to_first_token_seconds_sum") / served * 1e3
    ours = (probe.requests["first_token_s"] - probe.requests["arrival_s"]).to_numpy() * 1e3
    return float(ours.mean()) - server_ms, float(ours.std(ddof=1) / np.sqrt(ours.size))


def test_bench_counts_tokens_and_matches_the_servers_own_metrics(vllm_server: Any,
                                                                 tmp_path: Path) -> None:
    # 6 requests, 2 per second, 100-token prompts, 16 output tokens each
    path = write_scenario(tmp_path / "vllm.yaml", rate_rps=2, n_requests=6,
                          prompt_tokens=100, output_tokens=16)
    result = bench(path, vllm_server.url)
    req = result.requests
    assert len(req) == 6 and (req["status"] == "ok").all(), req["error"].tolist()
    assert (req["received_tokens"] == 16).all()
    assert (req["server_prompt_tokens"] == 100).all()  # token-id prompts: exact lengths
    assert result.meta["server_models"]["data"][0]["id"] == "tiny-llama"
    config = result.meta["server_config"]
    assert config["block_size"] > 0 and config["num_blocks"] > 0
    # the server's own histograms over the same requests (the snapshot before the run is
    # taken after the preflight request): its TTFT runs from the API server's arrival stamp
    # to the iteration stamp of the output processor that handles the first token (both in
    # the API server: vllm/v1/metrics/stats.py, IterationStats), ours from before we send to
    # after we read that token, so ours is at least its mean, exactly
    served = _delta(result, "time_to_first_token_seconds_count")
    assert served == 6
    server_ttft_ms = _delta(result, "time_to_first_token_seconds_sum") / served * 1e3
    ours = (req["first_token_s"] - req["arrival_s"]).to_numpy() * 1e3
    assert ours.mean() >= server_ttft_ms, (ours.mean(), server_ttft_ms)
    # and longer by the way in and out (our send to vLLM's arrival stamp, its first-token
    # stamp to our read), which vLLM does not stamp per request: a probe taken here measures
    # it, the same client and prompt length on the same server, one request at a time
    way_ms, way_se_ms = _lone_way_ms(vllm_server.url, tmp_path)
    # one-sided, 1 false alarm in 100 runs: Student's t on the smaller sample's degrees of
    # freedom, over both means' standard errors (each TTFT's spread holds the server's part
    # as well as the way's, so these overstate the way's own error). What it catches: a
    # first token stamped at a later chunk than the first (+1 ITL or more, 10-30 ms here,
    # against a margin of about 5 ms quiet and 13 ms beside two hogs; the probe's one-token
    # streams have no later chunk to stamp), or a client whose way grows when its streams
    # overlap (the run's do, the probe's do not: a blocked event loop); not a send stamp
    # taken early, which the probe shares
    run_se_ms = float(ours.std(ddof=1) / np.sqrt(ours.size))
    t99 = float(stats.t.ppf(0.99, min(ours.size, LONE_PROBES) - 1))
    excess_ms = float(ours.mean()) - server_ttft_ms
    assert excess_ms <= way_ms + t99 * float(np.hypot(run_se_ms, way_se_ms)), (
        excess_ms, way_ms, run_se_ms, way_se_ms)
    # the server's inter-token latency is per token; ours per chunk (vllm bench serve's), and
    # a busy API server sends several tokens in one chunk: compare the per-token mean gap
    itl_n = _delta(result, "inter_token_latency_seconds_count")
    assert itl_n == 6 * 15
    server_itl_ms = _delta(result, "inter_token_latency_seconds_sum") / itl_n * 1e3
    ours_itl_ms = float((req["finish_s"] - req["first_token_s"]).sum() / itl_n * 1e3)
    # our first-to-last span of a request is the server's plus the last chunk's way to us
    # minus the first one's; each way is at most what our TTFT exceeds the server's by (the
    # client + HTTP path of this run), so the spans differ by at most twice that, per request
    # (the mean way carries our TTFTs' sampling error: 3 standard errors of their mean)
    way_ms = max(float(ours.mean()) - server_ttft_ms, 0.0) + 3 * float(
        ours.std(ddof=1) / np.sqrt(ours.size))
    assert abs(ours_itl_ms - server_itl_ms) * itl_n <= 2 * way_ms * served
    # per chunk >= per token: the same spans over no more gaps (exact, up to rounding)
    assert result.summary["itl_ms"]["mean"] >= ours_itl_ms * (1 - 1e-9)
    tpot = ((req["finish_s"] - req["first_token_s"]) / 15).to_numpy() * 1e3
    assert result.summary["tpot_ms"]["p50"] == pytest.approx(float(np.median(tpot)))


def test_bench_cli_on_vllm_writes_the_run_directory(vllm_server: Any, tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "cli.yaml", rate_rps=4, n_requests=4, prompt_tokens=50,
                          output_tokens=8)
    out = tmp_path / "run"
    proc = bench_cli(str(path), "--endpoint", vllm_server.url, "--out", str(out),
                     "--max-concurrency", "2", timeout_s=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["driver"] == "bench" and summary["ok"] == 4
    meta = json.loads((out / "meta.json").read_text())
    assert "cache_config_info" in meta["server_config"]


def test_chat_prompts_have_exact_lengths_through_vllms_chat_template(vllm_server: Any,
                                                                     tmp_path: Path) -> None:
    # the fixture's vLLM renders chat requests with the tiny model's template
    # (servers.TINY_CHAT_TEMPLATE): every request's prompt, template included, must have the
    # scenario's token count as vLLM itself counts it, and its output the forced length
    path = write_scenario(tmp_path / "chat.yaml", rate_rps=4, n_requests=8,
                          prompt_tokens={"dist": "uniform", "low": 30, "high": 200},
                          output_tokens={"dist": "uniform", "low": 4, "high": 24})
    out = tmp_path / "chat"
    proc = bench_cli(str(path), "--endpoint", vllm_server.url, "--api", "openai-chat",
                     "--out", str(out), timeout_s=300)
    assert proc.returncode == 0, proc.stderr
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 8 and (req["status"] == "ok").all(), req["error"].tolist()
    assert req["prompt_tokens"].nunique() > 1  # lengths vary, so each one is checked
    assert (req["server_prompt_tokens"] == req["prompt_tokens"]).all(), req[
        ["prompt_tokens", "server_prompt_tokens"]]
    assert (req["received_tokens"] == req["output_tokens"]).all()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["device"]["api"] == "openai-chat"
    assert meta["chat_template_tokens"] >= 1 and len(meta["chat_units"]) >= 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["client"]["prompt_token_mismatches"] == 0
    # vLLM's own count of the prompt tokens it processed agrees
    before = meta["server_metrics_before"]["values"].get("prompt_tokens_total", 0.0)
    after = meta["server_metrics_after"]["values"]["prompt_tokens_total"]
    assert after - before == req["prompt_tokens"].sum()
