"""servelab bench --api kserve-v2|http-json on bad endpoints, bad servers and bad flags: each a
one-line error (exit 2, no traceback) or a run that goes on and counts its failures by cause;
Ctrl-C and SIGTERM keep what was measured.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from executor.endpoint.request_bench import bench_requests
from executor.endpoint.servers import free_port
from tests.executor.endpoint.conftest import (
    REPO,
    bench_cli,
    env,
    one_line_error,
    signal_mid_run,
)


def write_rl_scenario(path: Path, model: str = "instant", **workload: Any) -> Path:
    """A small request-level scenario with a KServe v2 payload."""
    load = {"kind": "constant", "rate_rps": 20, "n_requests": 8, **workload}
    path.write_text(yaml.safe_dump({
        "name": path.stem, "seed": 3, "service": {"kind": "linear", "base_ms": 5,
                                                  "per_item_ms": 1},
        "workload": load,
        "policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5, "timer": "first"},
        "payload": {"model": model, "inputs": [{"name": "input", "datatype": "BYTES",
                                                "shape": [-1]}]}}))
    return path


def test_unreachable_endpoint(tmp_path: Path) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml")
    proc = bench_cli(str(path), "--endpoint", f"http://127.0.0.1:{free_port()}", "--api",
                     "kserve-v2")
    one_line_error(proc, "cannot reach", "connection refused")


def test_unknown_model_and_wrong_path_404(stub_url: str, tmp_path: Path) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml")
    proc = bench_cli(str(path), "--endpoint", stub_url, "--api", "kserve-v2", "--model",
                     "nosuch")
    one_line_error(proc, "404", "no model 'nosuch'")
    proc = bench_cli(str(path), "--endpoint", stub_url, "--api", "http-json", "--set",
                     "payload.path=/wrong")
    one_line_error(proc, "404", "--api")


@pytest.mark.parametrize(("args", "needle"), [
    (["--api", "kserve-v2", "--set", "payload.model=null"], "needs the model's name"),
    (["--api", "kserve-v2", "--set", "payload.inputs=[{name: x, shape: [0]}]"],
     "payload.inputs.shape"),
    (["--api", "kserve-v2", "--set", "workload={kind: closed, clients: 2, n_requests: 4}"],
     "workload.kind: 'closed'"),
    (["--api", "kserve-v2", "--max-concurrency", "0"], "--max-concurrency 0: must be >= 1"),
    (["--api", "http-json", "--drain-timeout-s", "0"], "--drain-timeout-s 0: must be > 0"),
    (["--api", "kserve-v2", "--set", "payload.datatype=FP32"], "payload.datatype"),
])
def test_bad_flags_and_payloads(stub_url: str, tmp_path: Path, args: list[str],
                                needle: str) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml")
    one_line_error(bench_cli(str(path), "--endpoint", stub_url, *args), needle)


def test_malformed_or_wrong_answers_stop_before_the_run(stub_url: str, tmp_path: Path) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml")
    for model, needle in (("malformed", "not JSON"), ("badshape", "expected 1 rows")):
        proc = bench_cli(str(path), "--endpoint", stub_url, "--api", "kserve-v2", "--model",
                         model)
        one_line_error(proc, needle)


def test_server_errors_are_counted_by_cause_and_the_run_goes_on(stub_url: str,
                                                                tmp_path: Path) -> None:
    # the stub answers 200, 500, 429, 503 in turn; the preflight request takes the first 200
    path = write_rl_scenario(tmp_path / "s.yaml", model="errors~cli")
    proc = bench_cli(str(path), "--endpoint", stub_url, "--api", "kserve-v2", "--out",
                     str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["client"]["errors_by_cause"] == {"http_429": 2, "http_500": 2,
                                                    "http_503": 2}
    assert summary["ok"] == 2 and summary["failed"] == 6
    assert "failed (http_503): 2 requests" in proc.stderr


@pytest.mark.parametrize(("mode", "cause"), [
    ("cut", "connection_cut"), ("malformed", "malformed_json"), ("badshape", "bad_response")])
def test_broken_answers_mid_run_fail_with_their_cause(stub_url: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     mode: str, cause: str) -> None:
    # the preflight would refuse these servers outright; skip it to see the run's counting
    monkeypatch.setattr("executor.endpoint.request_bench.preflight", lambda *a: None)
    path = write_rl_scenario(tmp_path / "s.yaml", model=mode, n_requests=3)
    result = bench_requests(path, stub_url, api="kserve-v2")
    assert result.summary["client"]["errors_by_cause"] == {cause: 3}
    assert result.summary["ok"] == 0 and result.summary["failed"] == 3
    assert all(e and "\n" not in e for e in result.requests["error"])


def test_a_server_slower_than_the_drain_deadline(stub_url: str, tmp_path: Path) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml", n_requests=3)
    result = bench_requests(path, stub_url, api="kserve-v2")  # the preflight sees a fast one
    assert result.summary["ok"] == 3
    slow = write_rl_scenario(tmp_path / "slow.yaml", model="sleep:30000", n_requests=3)
    monkey_t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("executor.endpoint.request_bench.preflight", lambda *a: None)
        result = bench_requests(slow, stub_url, api="kserve-v2", drain_timeout_s=0.5)
        assert time.perf_counter() - monkey_t0 < 15  # the deadline ended it, not the server
        assert result.summary["in_flight"] == 3 and result.summary["censored"] == 3
        assert result.meta["drain_timed_out"] is True
        timed = bench_requests(slow, stub_url, api="kserve-v2", request_timeout_s=0.3)
    assert timed.summary["client"]["errors_by_cause"] == {"timeout": 3}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_keeps_what_was_measured(stub_url: str, tmp_path: Path,
                                                  sig: signal.Signals) -> None:
    path = write_rl_scenario(tmp_path / "s.yaml", model="sleep:20", rate_rps=10,
                             n_requests=200)
    out = tmp_path / "run"
    proc, stderr = signal_mid_run(["bench", str(path), "--endpoint", stub_url, "--api",
                                   "kserve-v2", "--out", str(out)], "bench: 200 requests", sig)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "stopped at" in stderr
    requests = pd.read_parquet(out / "requests.parquet")
    assert 3 <= len(requests) < 200
    assert (requests["status"] == "ok").sum() >= 3
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stopped_early"] is True and meta["requests_sent"] == len(requests)
    assert meta["driver"] == "bench" and "batches" in meta["not_visible"]


def _calibrate_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", "calibrate", *args],
                          capture_output=True, text=True, timeout=120, env=env(), cwd=REPO)


@pytest.mark.parametrize(("args", "needle"), [
    (["--api", "grpc"], "--api 'grpc': allowed: openai-completions (an LLM server), kserve-v2"),
    (["--server-max-batch-size", "4", "--batch-sizes", "1,8"],
     "--server-max-batch-size 4: below the burst size 8"),
    (["--window-ms", "-1"], "--window-ms -1: must be >= 0"),
    (["--reps", "1"], "--reps 1: need at least 2"),
    (["--endpoint-model", "nosuch"], "no model 'nosuch'"),
])
def test_calibrate_endpoint_bad_flags(stub_url: str, tmp_path: Path, args: list[str],
                                      needle: str) -> None:
    base = ["--endpoint", stub_url, "--api", "kserve-v2", "--endpoint-model", "instant",
            "--out", str(tmp_path / "p.json")]
    one_line_error(_calibrate_cli(*base, *args), needle)


def test_calibrate_endpoint_cli_writes_a_profile_simulate_reads(stub_url: str,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    proc = _calibrate_cli("--endpoint", stub_url, "--api", "http-json", "--batch-sizes",
                          "1,2", "--reps", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "N=  2" in proc.stdout and out.is_file()
    scn = write_rl_scenario(tmp_path / "s.yaml")
    sim_proc = subprocess.run([sys.executable, "-m", "servelab.cli", "simulate", str(scn),
                               "--set", f"service={{kind: profile, path: {out}}}", "--set",
                               "policy.max_batch_size=2"],
                              capture_output=True, text=True, timeout=120, env=env(), cwd=REPO)
    assert sim_proc.returncode == 0, sim_proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_calibrate_endpoint_signal_keeps_the_bursts_done(stub_url: str, tmp_path: Path,
                                                         sig: signal.Signals) -> None:
    out = tmp_path / "p.json"
    # 3 sizes x 30 bursts of a 20 ms model: about 10 s planned; stopped after ~1.5 s
    proc, text = signal_mid_run(
        ["calibrate", "--endpoint", stub_url, "--api", "kserve-v2", "--endpoint-model",
         f"sleep:20~{sig.name}", "--batch-sizes", "1,2,4", "--reps", "30", "--out", str(out)],
        "calibrating", sig, stream="stdout")
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "interrupted — partial profile" in text, text
    profile = json.loads(out.read_text())
    partial = profile["endpoint"]["partial"]
    assert partial["stopped_by"] == sig.name
    assert 0 < partial["bursts_done"] < partial["bursts_planned"] == 90
    counts = {int(n): len(v) for n, v in profile["samples_s"].items()}
    assert sum(counts.values()) == partial["bursts_done"]
    assert counts == {int(n): k for n, k in partial["per_size"].items() if k}
