"""Fixtures for the endpoint tests: the local stub server (fast) and a real vLLM server
(slow; its environment is created on first use, once, and cached).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def env() -> dict[str, str]:
    """The environment for subprocesses: this checkout's packages first."""
    return {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}


def write_scenario(path: Path, **workload: Any) -> Path:
    """A small LLM scenario (constant arrivals unless told otherwise) written to ``path``."""
    load = {"kind": "constant", "rate_rps": 20, "n_requests": 8, "prompt_tokens": 40,
            "output_tokens": 8, **workload}
    path.write_text(yaml.safe_dump({
        "name": path.stem, "seed": 3,
        "service": {"kind": "llm_linear", "base_ms": 5, "per_prefill_token_ms": 0.01,
                    "per_decode_seq_ms": 0.1},
        "workload": load,
        "policy": {"kind": "vllm", "max_num_seqs": 16, "max_num_batched_tokens": 512,
                   "block_size": 16, "num_gpu_blocks": 512},
        "warmup_s": 0}))
    return path


def bench_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``servelab bench ARGS`` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "servelab.cli", "bench", *args],
                          capture_output=True, text=True, timeout=timeout_s, env=env(),
                          cwd=REPO)


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """The command failed with exit 2 and one stderr line holding every needle, no
    traceback.
    """
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def signal_mid_run(args: list[str], first: str, sig: int, after: str | None = None,
                   wait_s: float = 1.5, stream: str = "stderr", after_lines: int = 1
                   ) -> tuple[subprocess.Popen[str], str]:
    """Start ``servelab ARGS``, wait for a line of ``stream`` starting with ``first`` (the
    signal handlers are in place by then) and, when given, ``after_lines`` lines containing
    ``after``, then ``wait_s``; send ``sig``; return the finished process and the rest of its
    output.
    """
    proc = subprocess.Popen([sys.executable, "-m", "servelab.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(), cwd=REPO)
    pipe = proc.stderr if stream == "stderr" else proc.stdout
    assert pipe is not None
    seen = []
    line = pipe.readline()
    seen.append(line)
    assert line.startswith(first), line
    found = 0
    while after is not None:
        found += after in line
        if found >= after_lines:
            break
        line = pipe.readline()
        seen.append(line)
        assert line, "".join(seen)
    time.sleep(wait_s)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc, "".join(seen) + (err if stream == "stderr" else out) + (
        out if stream == "stderr" else err)


@pytest.fixture(scope="session")
def stub_url() -> Iterator[str]:
    """The stub server (``executor.endpoint.stub``) on a free loopback port."""
    from executor.endpoint.servers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "executor.endpoint.stub", "--port",
                             str(port)], stdout=subprocess.PIPE, text=True, env=env(),
                            cwd=REPO)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
    proc.stdout.close()


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A real vLLM (CPU build) serving the tiny model; the environment is installed on first
    use (a progress line says so) and cached in ``$SERVELAB_SERVERS_DIR``.
    ``$SERVELAB_TEST_VLLM_URL`` points the tests at a server already running instead.
    """
    from executor.endpoint.servers import VllmServer, ensure_vllm

    running = os.environ.get("SERVELAB_TEST_VLLM_URL")
    if running:  # a server the developer keeps running (`servelab server run vllm`)
        yield type("Running", (), {"url": running.rstrip("/")})()
        return
    reporter = request.config.pluginmanager.getplugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    server = VllmServer(ensure_vllm(progress=say))
    say("servelab: starting vLLM on a loopback port (warm-up takes a minute or two) …")
    server.start()
    say(f"servelab: vLLM up at {server.url} in {server.started_s:.0f} s")
    yield server
    server.stop()


KSERVE_MINILM = {"model_name": "minilm", "max_batch_size": 8, "window_ms": 10.0,
                 "max_items": 16}


@pytest.fixture(scope="session")
def kserve_minilm(request: pytest.FixtureRequest) -> Iterator[Any]:
    """KServe's own model server (``kserve`` 0.21) serving MiniLM on a loopback port, with
    an in-process batcher of at most 8 requests and a 10 ms window (``KSERVE_MINILM``); the
    environment is installed on first use (a progress line says so) and cached in
    ``$SERVELAB_SERVERS_DIR``; stopped after the session.
    """
    from executor.endpoint.kserve_server import KServeServer, ensure_kserve

    reporter = request.config.pluginmanager.getplugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    server = KServeServer(ensure_kserve(progress=say), dict(KSERVE_MINILM))
    say("servelab: starting KServe's model server with MiniLM on a loopback port …")
    server.start()
    say(f"servelab: KServe up at {server.url} in {server.started_s:.0f} s")
    yield server
    server.stop()


def stub_batch_record(url: str, model: str) -> dict[str, list[float]]:
    """``GET /stub/batches/{model}`` of the request-level stub: its batcher's batch sizes and
    its timers' lateness (s) per batch, window and service apart; per answered request, its
    outside sleep's lateness (s) and its batch's index."""
    import json as _json
    import urllib.parse
    import urllib.request

    name = urllib.parse.quote(model, safe="")
    with urllib.request.urlopen(f"{url}/stub/batches/{name}", timeout=10) as resp:
        data: dict[str, list[float]] = _json.load(resp)
    return data
