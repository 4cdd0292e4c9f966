"""`servelab dashboard` ends its Streamlit server when it is killed (no orphan on the port)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
        return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_killing_the_cli_ends_the_server(signum: int) -> None:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = subprocess.Popen([sys.executable, "-m", "servelab.cli", "dashboard", "--port",
                            str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while not answers(port):
            assert cli.poll() is None, "the dashboard exited before serving"
            assert time.monotonic() < deadline, "the dashboard did not start in 90 s"
            time.sleep(0.5)
        children = Path(f"/proc/{cli.pid}/task/{cli.pid}/children")
        servers = [int(p) for p in children.read_text().split()] if children.exists() else []
        cli.send_signal(signum)  # the CLI's pid only, as `kill PID` does
        assert cli.wait(timeout=30) == 0
        # the server's own group (the CLI started it in a new session) is gone too
        deadline = time.monotonic() + 15
        while answers(port) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not answers(port), "the Streamlit server still answers after the CLI ended"
        with socket.socket() as s:  # and nothing listens on the port (TIME_WAIT allowed)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:  # a failed run must not leave its server behind either
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
        for pid in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
