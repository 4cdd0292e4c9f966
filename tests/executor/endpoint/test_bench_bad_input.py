"""servelab bench on bad endpoints, bad servers and bad flags: each a one-line error (exit 2,
no traceback) or a run that goes on and counts its failures by cause; Ctrl-C and SIGTERM
keep what was measured.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from executor.endpoint.bench import bench
from executor.endpoint.servers import free_port
from tests.executor.endpoint.conftest import (
    bench_cli,
    one_line_error,
    signal_mid_run,
    write_scenario,
)


def test_unreachable_endpoint(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "s.yaml")
    proc = bench_cli(str(path), "--endpoint", f"http://127.0.0.1:{free_port()}")
    one_line_error(proc, "cannot reach", "connection refused")


def test_wrong_path_404(stub_url: str, tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "s.yaml")
    proc = bench_cli(str(path), "--endpoint", f"{stub_url}/wrong", "--model", "instant")
    one_line_error(proc, "404", "--endpoint")
    proc = bench_cli(str(path), "--endpoint", f"{stub_url}/wrong")  # no model list there
    one_line_error(proc, "pass --model")


@pytest.mark.parametrize(("flags", "needle"), [
    (["--api", "grpc"], "--api 'grpc': allowed: openai-completions, openai-chat"),
    (["--token-ids", "9"], "--token-ids '9': expected LO:HI"),
    (["--max-concurrency", "0"], "--max-concurrency 0: must be >= 1"),
    (["--drain-timeout-s", "0"], "--drain-timeout-s 0: must be > 0"),
])
def test_bad_flags(stub_url: str, tmp_path: Path, flags: list[str], needle: str) -> None:
    path = write_scenario(tmp_path / "s.yaml")
    one_line_error(bench_cli(str(path), "--endpoint", stub_url, *flags), needle)


def test_not_an_llm_scenario(stub_url: str) -> None:
    one_line_error(bench_cli("builtin:dyn-demo", "--endpoint", stub_url), "LLM scenarios")


def test_server_errors_are_counted_by_cause_and_the_run_goes_on(stub_url: str,
                                                                tmp_path: Path) -> None:
    # the stub answers 200, 500, 429, 503 in turn; the preflight request takes the first 200
    path = write_scenario(tmp_path / "s.yaml", n_requests=8)
    proc = bench_cli(str(path), "--endpoint", stub_url, "--model", "errors#cli", "--out",
                     str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["client"]["errors_by_cause"] == {"http_429": 2, "http_500": 2,
                                                    "http_503": 2}
    assert summary["ok"] == 2 and summary["failed"] == 6
    assert "failed (http_503): 2 requests" in proc.stderr


@pytest.mark.parametrize(("mode", "cause"), [
    ("cut", "stream_cut"), ("malformed", "malformed_sse"), ("few", "too_few_tokens"),
    ("many", "too_many_tokens")])
def test_broken_streams_fail_with_their_cause(stub_url: str, tmp_path: Path, mode: str,
                                             cause: str) -> None:
    path = write_scenario(tmp_path / "s.yaml", n_requests=3)
    result = bench(path, stub_url, model=mode)
    assert result.summary["client"]["errors_by_cause"] == {cause: 3}
    assert result.summary["ok"] == 0
    errors = result.requests["error"].tolist()
    assert all(e and "\n" not in e for e in errors)
    if mode == "few":
        assert errors[0] == "received 7 of 8 output tokens"


def test_a_server_slower_than_the_drain_deadline(stub_url: str, tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "s.yaml", n_requests=3)
    t0 = time.perf_counter()
    result = bench(path, stub_url, model="slow:30", drain_timeout_s=0.5)
    assert time.perf_counter() - t0 < 15  # the deadline ended it, not the server
    assert result.summary["in_flight"] == 3 and result.summary["censored"] == 3
    assert result.meta["drain_timed_out"] is True
    timed = bench(path, stub_url, model="slow:30#t", request_timeout_s=0.3)
    assert timed.summary["client"]["errors_by_cause"] == {"timeout": 3}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_keeps_what_was_measured(stub_url: str, tmp_path: Path,
                                                  sig: signal.Signals) -> None:
    path = write_scenario(tmp_path / "s.yaml", rate_rps=10, n_requests=200)
    out = tmp_path / "run"
    # "bench: 200 requests to …": the handlers are in place
    proc, stderr = signal_mid_run(["bench", str(path), "--endpoint", stub_url, "--model",
                                   "timed:20:5", "--out", str(out)], "bench: 200 requests",
                                  sig)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "stopped at" in stderr
    requests = pd.read_parquet(out / "requests.parquet")
    assert 3 <= len(requests) < 200
    assert (requests["status"] == "ok").sum() >= 3
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stopped_early"] is True and meta["requests_sent"] == len(requests)
