"""Issue 28's ledger: each input its list (items 1-10) names, reproduced as the issue describes
it and run on today's code, with what it prints now.

Every case runs in its own subprocess (``python -m servelab.cli`` with this checkout first on
``PYTHONPATH``, or ``python -c`` for the Python API and the dashboard's own restore and upload
functions), in its own folder holding the issue's ``base.yaml`` (constant 1 ms service,
Poisson 100 req/s, 200 requests, greedy max 4), under a wall-clock limit and a memory guard
(the process tree is killed past :data:`KILL_RSS_MB`). The signal cases send their signals
while the child runs: SIGTERM and Ctrl-C on ``live`` (its model a stand-in built from a
``module:factory``, one that hangs on its sixth batch where the case is about a hung call),
SIGTERM and SIGKILL on a sweep's parent, then a look for its workers still running.

Each row: the case, what the issue saw, the exit code (a signal's death as 128 + its number),
the one line it prints now (or the result's key numbers), peak RSS (the larger of the process
tree's summed RSS, polled from ``/proc`` every 20 ms, and ``wait4``'s maxrss; Linux), wall
time and a verdict:
``field error`` (exit 2, one ``error:`` line naming the field, no traceback), ``correct
result`` (the numbers the issue says were wrong, now right) or ``STILL BAD`` (with why).

Usage: ``python benchmarks/issue28_cases.py [ITEM ...]`` (all 60: 2 minutes on 2 cores, 5
beside a load of 5). Writes ``benchmarks/results/issue28_cases.md`` (only when all ran) and
prints the table; ``ITEM`` (``4b``) runs only those cases.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.lifecycle import HUNG_GRACE_S  # noqa: E402
from tests.sim.test_bad_input import LLM  # noqa: E402  (its LLM scenario)

RESULTS = ROOT / "benchmarks" / "results"
TIMEOUT_S = 60.0  # per case: a hang shows as a kill at this limit
KILL_RSS_MB = 4000.0  # a runaway case is killed here (the issue saw 1.7 to 9.5 GB)
MEMORY_OK_MB = 1500.0  # a case above this is STILL BAD (torch's import alone is ~500 MB)
SLACK_S = 3.0  # an exit's allowance past a bound: writing the records and the interpreter's exit
WIDTH = 200  # characters of a printed line kept in the table

BASE: dict[str, Any] = {
    "seed": 1,
    "service": {"kind": "constant", "ms": 1},
    "workload": {"kind": "poisson", "rate_rps": 100, "n_requests": 200},
    "policy": {"kind": "greedy", "max_batch_size": 4},
}
AUTOSCALED = {"kind": "concurrency", "min_replicas": 0, "max_replicas": 2, "cold_start_s": 1}

# the live cases' model: a 1 ms stand-in (the scenario's constant service); ``hang`` never
# returns from its sixth call (batch 5), as tests/executor/test_live_stop.py builds one.
# Building it writes the monotonic time to ``ready`` (the run starts right after)
FACTORY = """
import threading, time
from pathlib import Path
from executor.testing import SleepRunner

class _Hang(SleepRunner):
    def run_batch(self, payloads):
        if self.calls == 5:
            self.calls += 1
            threading.Event().wait()  # never returns
        return super().run_batch(payloads)

def fast(**kwargs):
    Path("ready").write_text(repr(time.monotonic()))
    return SleepRunner(lambda n: 0.001)

def hang(**kwargs):
    Path("ready").write_text(repr(time.monotonic()))
    return _Hang(lambda n: 0.001)
"""

API = """
import sys, yaml
import sim
from sim.errors import UserError
base = yaml.safe_load(open("base.yaml"))
try:
{body}
except UserError as exc:
    print(f"error: {{type(exc).__name__}}: {{exc}}", file=sys.stderr)
    sys.exit(2)
"""


@dataclass
class Outcome:
    """What one child did."""

    code: int  # exit status; a signal's death as 128 + its number
    stdout: str
    stderr: str
    wall_s: float
    rss_mb: float
    killed: str = ""  # why the runner killed it (timeout, memory), or ""
    notes: dict[str, Any] = field(default_factory=dict)  # what a driver measured

    @property
    def text(self) -> str:
        """Both streams, stderr first."""
        return self.stderr + "\n" + self.stdout


Check = Callable[[Outcome, Path], tuple[bool, str]]
Drive = Callable[[subprocess.Popen[bytes], Path, dict[str, Any]], None]


@dataclass
class Case:
    """One input of the issue's list."""

    item: str  # the item number and a letter
    label: str
    before: str  # what the issue saw
    shown: str  # the command as a user types it
    argv: list[str]  # after ``python``
    check: Check
    setup: Callable[[Path], object] | None = None
    drive: Drive | None = None
    timeout_s: float = TIMEOUT_S


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= WIDTH else text[:WIDTH] + " …"


def _lines(out: Outcome) -> list[str]:
    """The printed lines that are not a search's or a sweep's progress."""
    return [line.strip() for line in out.text.splitlines() if line.strip()
            and not line.startswith(("searching ", "candidate ")) and "━" not in line
            and "No runtime found" not in line]  # streamlit's note when imported bare


def field_error(text: str) -> Check:
    """Exit 2, no traceback, exactly one ``error:`` line and no other, holding ``text``."""

    def check(out: Outcome, where: Path) -> tuple[bool, str]:
        lines = _lines(out)
        errors = [line for line in lines if line.startswith("error:")]
        shown = errors[0] if len(errors) == 1 else " / ".join(lines[-3:])
        why = (f"exit {out.code}" if out.code != 2 else
               "a traceback" if "Traceback" in out.text else
               f"{len(lines)} lines" if len(lines) != 1 or len(errors) != 1 else
               f"no {text!r}" if text not in " ".join(errors[0].split()) else "")
        return not why, shown if not why else f"{why}: {shown}"

    return check


def sh(*args: str) -> list[str]:
    return ["-m", "servelab.cli", *args]


def api(body: str) -> list[str]:
    return ["-c", API.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "))]


def write_yaml(where: Path, name: str, data: object) -> None:
    (where / name).write_text(data if isinstance(data, str) else yaml.safe_dump(data))


def with_(section: str, **changes: object) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(BASE))
    if section:
        data[section] = {**data.get(section, {}), **changes}
    else:
        data.update(changes)
    return data


def scenario_file(data: dict[str, Any] | str, files: dict[str, str] | None = None
                  ) -> Callable[[Path], None]:
    """A setup writing ``s.yaml`` (and ``files`` beside it)."""

    def setup(where: Path) -> None:
        for name, text in (files or {}).items():
            (where / name).write_text(text)
        write_yaml(where, "s.yaml", data)

    return setup


def summary(where: Path, run: str = "r") -> dict[str, Any]:
    path = where / run / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


# -- item 1: sweep resume ---------------------------------------------------------------------
SWEEP = ["sweep", "base.yaml", "--grid", "policy.max_batch_size=1,2", "--seeds", "1",
         "--out", "d"]


def first_sweep(where: Path) -> None:
    subprocess.run([sys.executable, *sh(*SWEEP)], cwd=where, env=ENV, capture_output=True,
                   timeout=120, check=True)


def edit_yaml(where: Path) -> None:
    first_sweep(where)
    write_yaml(where, "base.yaml", with_("workload", rate_rps=3000))


def tear_last_line(where: Path) -> None:
    first_sweep(where)
    log = where / "d" / "runs.jsonl"
    whole = log.read_text()
    log.write_text(whole[: len(whole) - 40])  # a write cut short


def changed_sweep(out: Outcome, where: Path) -> tuple[bool, str]:
    """Refused naming the difference, or re-run at the new rate (either is what the issue
    asks for).
    """
    if out.code == 2:
        return field_error("workload.rate_rps: 100.0 -> 3000.0")(out, where)
    import pandas as pd

    offered = pd.read_parquet(where / "d" / "results.parquet")["offered_rps"]
    return bool((offered > 1000).all()), f"exit {out.code}; offered {list(offered.round(1))}"


def torn_resumed(out: Outcome, where: Path) -> tuple[bool, str]:
    lines = (where / "d" / "runs.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # raises (a STILL BAD row) on a torn line
    said = next((line for line in _lines(out) if " runs (" in line), "")
    ok = out.code == 0 and len(rows) == 2 and said.startswith("2 runs (0 failed)")
    return ok, f"{said}; runs.jsonl: {len(rows)} whole rows"


# -- item 2, 3: memory and overflow -----------------------------------------------------------
def huge_batch(out: Outcome, where: Path) -> tuple[bool, str]:
    s = summary(where)
    ok = out.code == 0 and s.get("ok") == 200
    return ok, f"exit {out.code}; ok {s.get('ok')} of 200, mean batch {s.get('mean_batch_size')}"


def ten_requests(out: Outcome, where: Path) -> tuple[bool, str]:
    s = summary(where)
    return (out.code == 0 and s.get("requests") == 10,
            f"exit {out.code}; requests {s.get('requests')}, ok {s.get('ok')}")


def llm_refused_row(out: Outcome, where: Path) -> tuple[bool, str]:
    import pandas as pd

    path = where / "r" / "requests.parquet"
    if out.code != 0 or not path.exists():
        return False, _one_line(out.text[-300:])
    reasons = list(pd.read_parquet(path).sort_values("id")["reason"].fillna(""))
    return reasons == ["kv_cache_too_small", ""], f"reasons per request: {reasons}"


def llm_all_refused(out: Outcome, where: Path) -> tuple[bool, str]:
    """Each request refused as too big for the KV cache (64 blocks), at no memory cost."""
    import pandas as pd

    path = where / "r" / "requests.parquet"
    if out.code != 0 or not path.exists():
        return False, f"exit {out.code}: " + _one_line(" ".join(_lines(out))[-300:])
    reasons = pd.read_parquet(path)["reason"].value_counts().to_dict()
    s = summary(where)
    return reasons == {"kv_cache_too_small": 20}, (
        f"exit 0; ok {s.get('ok')}, rejected {s.get('rejected')} {reasons}; stability "
        f"{s.get('stability', {}).get('verdict')}")


def big_sizes(unit: int, top: int) -> Check:
    """Every batch's items a whole number of ``unit``-sized requests, the largest ``top``,
    the mean batch positive (the issue saw sizes wrap to negative numbers).
    """

    def check(out: Outcome, where: Path) -> tuple[bool, str]:
        import pandas as pd

        path = where / "r" / "batches.parquet"
        if out.code != 0 or not path.exists():
            return False, f"exit {out.code}: " + _one_line(" ".join(_lines(out))[-300:])
        items = pd.read_parquet(path)["items"].astype("int64")
        s = summary(where)
        ok = (int(items.max()) == top and int(items.min()) > 0 and bool((items % unit == 0).all())
              and s["mean_batch_size"] > 0)
        return ok, (f"exit 0; batch items min {int(items.min()):,} max {int(items.max()):,} "
                    f"(dtype {items.dtype}), mean batch {s['mean_batch_size']:.3g} requests")

    return check


# -- item 4: live -----------------------------------------------------------------------------
def wait_ready(where: Path, proc: subprocess.Popen[bytes], within_s: float = 40) -> float:
    end = time.monotonic() + within_s
    while time.monotonic() < end and _alive(proc.pid):
        with contextlib.suppress(OSError, ValueError):
            return float((where / "ready").read_text())
        time.sleep(0.02)
    raise RuntimeError("the live run never built its model")


def signals_at(*plan: tuple[float, signal.Signals]) -> Drive:
    """Send each signal at its time (s after the model was built)."""

    def drive(proc: subprocess.Popen[bytes], where: Path, notes: dict[str, Any]) -> None:
        ready = wait_ready(where, proc)
        for at_s, sig in plan:
            time.sleep(max(0.0, ready + at_s - time.monotonic()))
            notes.setdefault("sent", []).append(time.monotonic())
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        notes["ready"] = ready

    return drive


def no_signal(proc: subprocess.Popen[bytes], where: Path, notes: dict[str, Any]) -> None:
    notes["ready"] = wait_ready(where, proc)


def live_written(by: str | None, within_s: float | None) -> Check:
    """Exit 0 with the run directory written (stopped by ``by``); the exit at most
    ``within_s`` after the last signal, or after the run's end when none was sent.
    """

    def check(out: Outcome, where: Path) -> tuple[bool, str]:
        meta_path = where / "run" / "meta.json"
        if out.code != 0 or not meta_path.exists():
            written = "written" if meta_path.exists() else "missing"
            return False, (f"exit {out.code}, run directory {written}: "
                           + _one_line(" ".join(_lines(out))[-200:]))
        meta = json.loads(meta_path.read_text())
        s = summary(where, "run")
        counts = {k: v for k, v in (meta.get("status_counts") or {}).items() if v}
        tail = (f"stopped_by {meta.get('stopped_by')}; {s.get('requests')} requests "
                f"{counts}; unfinished batches {meta.get('unfinished_batches')}")
        ok = meta.get("stopped_by") == by and s.get("requests", 0) > 0
        shown = "exit 0; run directory written"
        if within_s is not None:
            sent = out.notes.get("sent")
            start = sent[-1] if sent else out.notes["ready"] + meta["end_s"]
            after_s = out.notes["exited"] - start
            what = "last signal" if sent else f"run's end (end_s {meta['end_s']:.2f})"
            shown += f"; exited {after_s:.1f} s after the {what} (bound {within_s:g} s)"
            ok = ok and after_s <= within_s
        shown += "; " + tail
        return ok, shown

    return check


def batch_timeout_row(out: Outcome, where: Path) -> tuple[bool, str]:
    import pandas as pd

    req = pd.read_parquet(where / "run" / "requests.parquet")
    batches = pd.read_parquet(where / "run" / "batches.parquet").set_index("batch_id")
    timed = req[req["reason"] == "batch_timeout"]
    if out.code != 0 or timed.empty:
        return False, f"exit {out.code}; {len(timed)} requests failed/batch_timeout"
    bid = int(timed["batch_id"].iloc[0])
    row = batches.loc[bid]
    ok = bool(row["failed"]) and set(timed["status"]) == {"failed"}
    return ok, (f"exit 0; requests {sorted(timed['id'])} failed/batch_timeout; batch {bid}: "
                f"failed {bool(row['failed'])}, finish_s {row['finish_s']}")


# -- processes, from /proc (Linux) ------------------------------------------------------------
def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (PID 1 in a container may never reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process ended meanwhile
        return found
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):  # the thread ended meanwhile
            found |= {int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text()
                      .split()}
    for child in list(found):
        found |= _descendants(child)
    return found


def _tree_rss_mb(pid: int) -> float:
    """The resident memory of ``pid`` and its descendants now (MB)."""
    total = 0
    for each in (pid, *_descendants(pid)):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{each}/statm").read_text().split()[1])
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- item 6: sweep workers --------------------------------------------------------------------


def kill_sweep(sig: signal.Signals) -> Drive:
    def drive(proc: subprocess.Popen[bytes], where: Path, notes: dict[str, Any]) -> None:
        end, workers = time.monotonic() + 40, set[int]()
        while len(workers) < 2 and time.monotonic() < end and _alive(proc.pid):
            workers = _descendants(proc.pid)
            time.sleep(0.05)
        time.sleep(0.5)  # inside their first simulations
        notes["workers"] = sorted(workers)
        notes["alive_before"] = sum(_alive(p) for p in workers)
        os.kill(proc.pid, sig)
        killed, left = time.monotonic(), list(workers)
        # the kernel's death signal acts at once, the watchdog within its period: 5 s
        while left and time.monotonic() < killed + 5.0:
            time.sleep(0.05)
            left = [p for p in left if _alive(p)]
        notes["gone_s"] = time.monotonic() - killed
        ps = subprocess.run(["ps", "-o", "pid=,ppid=,stat=", "-p", ",".join(map(str, workers))],
                            capture_output=True, text=True) if workers else None
        notes["left"] = left
        notes["ps"] = " ".join((ps.stdout if ps else "").split())
        for pid in left:  # this ledger leaves nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    return drive


def workers_gone(out: Outcome, where: Path) -> tuple[bool, str]:
    workers, left = out.notes.get("workers", []), out.notes.get("left", [])
    ok = len(workers) >= 2 and out.notes.get("alive_before") == len(workers) and not left
    return ok, (f"exit {out.code}; {len(workers)} workers running before the signal, "
                f"{len(left)} running {out.notes.get('gone_s', math.nan):.2f} s after it "
                f"(ps: {out.notes.get('ps') or 'none'})")


# -- items 7, 9: results ----------------------------------------------------------------------
def verdict_is(verdict: str, reason: str) -> Check:
    def check(out: Outcome, where: Path) -> tuple[bool, str]:
        st = summary(where).get("stability", {})
        ok = out.code == 0 and st.get("verdict") == verdict and reason in st.get("reason", "")
        return ok, (f"exit {out.code}; completions {summary(where).get('completions')}; "
                    f"stability {st.get('verdict')}: {st.get('reason')}")

    return check


def rate_1e12(out: Outcome, where: Path) -> tuple[bool, str]:
    text = " ".join(out.text.split())
    note = next((line for line in _lines(out) if "throughput" in line and ":" in line
                 and not line.startswith(("│", "┃"))), "")
    ok = (out.code == 0 and "throughput is not measured" in text
          and "throughput is the capacity" not in text)
    return ok, f"exit {out.code}; completions {summary(where).get('completions')}; {note}"


# -- item 8: the dashboard --------------------------------------------------------------------
RESTORE = """
import sys
from dashboard.restore import RestoreError, restorable
name = sys.argv[1]
try:
    restorable(open(name, "rb").read(), name)
    print("restored")
except RestoreError as exc:  # the Explore page shows st.error(f"Could not restore {exc}")
    print(f"error: Could not restore {exc}", file=sys.stderr)
    sys.exit(2)
"""
CALIBRATION_UPLOAD = """
import json, sys
from calibration.profile import LatencyProfile, ProfileError
from dashboard.state import parse_upload
name = sys.argv[1]
try:  # as dashboard/app_pages/profiles.py reads an upload
    LatencyProfile.from_dict(parse_upload(open(name, "rb").read(), name), source=name)
    print("loaded")
except (ValueError, ProfileError, UnicodeDecodeError, json.JSONDecodeError) as exc:
    message = str(exc)  # shown as the page shows it: the file's name once
    shown = message if message.startswith(f"{name}: ") else f"{name}: {message}"
    print(f"error: {shown}", file=sys.stderr)
    sys.exit(2)
"""


def restore_case(item: str, label: str, name: str, data: object, text: str) -> Case:
    def setup(where: Path) -> None:
        write_yaml(where, "t.csv", "TIMESTAMP\n0.0\n0.1\n0.2\n")
        write_yaml(where, name, data)

    return Case(item, f"Explore restore: {label}", "traceback", f"dashboard restore {name}",
                ["-c", RESTORE, name], field_error(text), setup=setup)


# -- the list ---------------------------------------------------------------------------------
def llm_trace(output: str) -> Callable[[Path], None]:
    return scenario_file({**LLM, "workload": {
        "kind": "trace", "path": "llm.csv", "prompt_tokens_column": "ContextTokens",
        "output_tokens_column": "GeneratedTokens"}},
        {"llm.csv": f"TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,{output}\n1,10,5\n"})


def yaml_bomb_params() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join(["*" + "abcdefghi"[i]] * 9) + "]")
    body = "\n".join("    " + line for line in lines)
    return yaml.safe_dump(BASE) + "model:\n  name: mlp\n  params:\n" + body + "\n"


def trace(text: str, **extra: object) -> Callable[[Path], None]:
    return scenario_file(with_("", workload={"kind": "trace", "path": "t.csv", **extra}),
                         {"t.csv": text})


LIVE_BEFORE_HANG = "held 60 s past the drain deadline"


def cases() -> list[Case]:
    sim_r = ["simulate", "s.yaml", "--out", "r"]
    return [
        # 1 -- a resumed sweep
        Case("1a", "resumed sweep after --set workload.rate_rps=3000",
             "'2 runs (0 failed)', offered 100.2 req/s",
             "servelab sweep base.yaml --grid policy.max_batch_size=1,2 --seeds 1 --out d "
             "--set workload.rate_rps=3000 (after the same without --set)",
             sh(*SWEEP, "--set", "workload.rate_rps=3000"), changed_sweep,
             setup=first_sweep),
        Case("1b", "resumed sweep after editing the YAML (rate 3000)",
             "'2 runs (0 failed)', old results", "servelab sweep base.yaml ... --out d "
             "(base.yaml edited to rate_rps 3000)", sh(*SWEEP), changed_sweep,
             setup=edit_yaml),
        Case("1c", "resume with a torn last line of runs.jsonl", "internal JSONDecodeError",
             "servelab sweep base.yaml ... --out d (runs.jsonl cut 40 chars short)", sh(*SWEEP),
             torn_resumed, setup=tear_last_line),
        # 2 -- small inputs that took gigabytes
        Case("2a", "--set policy.max_batch_size=1000000000", "9.5 GB in 25 s",
             "servelab simulate base.yaml --set policy.max_batch_size=1000000000 --out r",
             sh("simulate", "base.yaml", "--set", "policy.max_batch_size=1000000000", "--out",
                "r"), huge_batch),
        Case("2b", "3-row trace, rate_scale 1e9, n_requests 10", "5.7 GB",
             "servelab simulate s.yaml --out r", sh(*sim_r), ten_requests,
             setup=trace("TIMESTAMP\n0\n1\n2\n", rate_scale=1e9, n_requests=10)),
        Case("2c", "LLM trace row with 1e9 output tokens (too big for the KV cache)", "3.2 GB",
             "servelab simulate s.yaml --out r", sh(*sim_r), llm_refused_row,
             setup=llm_trace("1000000000")),
        Case("2d", "YAML alias bomb in model.params, with --out", "1.7 GB",
             "servelab simulate s.yaml --out r", sh(*sim_r), field_error("model.params"),
             setup=scenario_file(yaml_bomb_params())),
        Case("2e", "--grid policy.max_batch_size=1:1000000000:1", "4.4 GB before any run",
             "servelab sweep base.yaml --grid policy.max_batch_size=1:1000000000:1",
             sh("sweep", "base.yaml", "--grid", "policy.max_batch_size=1:1000000000:1"),
             field_error("at most 10,000")),
        Case("2f", "n_requests=1e9", "starts, no estimate or warning",
             "servelab simulate base.yaml --set workload.n_requests=1000000000",
             sh("simulate", "base.yaml", "--set", "workload.n_requests=1000000000"),
             field_error("workload.n_requests: this run would take")),
        Case("2g", "calibrate --batch-sizes 1-1000000000", "starts, no estimate or warning",
             "servelab calibrate --model mlp --device cpu --threads 1 --batch-sizes "
             "1-1000000000 --out p.json",
             sh("calibrate", "--model", "mlp", "--device", "cpu", "--threads", "1",
                "--batch-sizes", "1-1000000000", "--out", "p.json"),
             field_error("--batch-sizes: this calibration would take")),
        # 3 -- overflow
        Case("3a", "trace size 1e12", "size [-727379968, 1], negative mean batch, exit 0",
             "servelab simulate s.yaml --out r (size_column n: 1e12, 1, 1)", sh(*sim_r),
             big_sizes(1, 10**12),
             setup=trace("TIMESTAMP,n\n0,1000000000000\n0.5,1\n1,1\n", size_column="n")),
        Case("3b", "workload.size 1.5e9", "internal OverflowError",
             "servelab simulate s.yaml --out r (workload.size: 1.5e+9)", sh(*sim_r),
             big_sizes(1_500_000_000, 2 * 1_500_000_000),
             setup=scenario_file(with_("workload", size=1.5e9))),
        Case("3c", "workload.size 2^31", "internal OverflowError",
             "servelab simulate base.yaml --set workload.size=2147483648 --out r",
             sh("simulate", "base.yaml", "--set", f"workload.size={2**31}", "--out", "r"),
             big_sizes(2**31, 2 * 2**31)),
        Case("3d", "workload.size 2^63", "internal OverflowError",
             "servelab simulate base.yaml --set workload.size=9223372036854775808",
             sh("simulate", "base.yaml", "--set", f"workload.size={2**63}"),
             field_error("workload.size")),
        Case("3e", "LLM output_tokens 1e11", "MemoryError (745 GiB)",
             "servelab simulate llm.yaml --out r (workload.output_tokens: 100000000000)",
             sh(*sim_r), llm_all_refused,
             setup=scenario_file({**LLM, "workload": {**LLM["workload"],
                                                      "output_tokens": 10**11}})),
        Case("3f", "LLM output_tokens 2^62", "'negative dimensions'",
             "servelab simulate llm.yaml (workload.output_tokens: 2^62)",
             sh("simulate", "s.yaml"), field_error("workload.output_tokens"),
             setup=scenario_file({**LLM, "workload": {**LLM["workload"],
                                                      "output_tokens": 2**62}})),
        # 4 -- live runs
        Case("4a", "SIGTERM mid-run of live", "exit 143, nothing written",
             "servelab live base.yaml --model m28:fast --out run; SIGTERM 0.7 s in",
             sh("live", "base.yaml", "--model", "m28:fast", "--out", "run"),
             live_written("SIGTERM", None),
             drive=signals_at((0.7, signal.SIGTERM))),
        Case("4b", "a model call that hangs (drain deadline 0.5 s)", LIVE_BEFORE_HANG,
             "servelab live base.yaml --model m28:hang --drain-timeout-s 0.5 --out run",
             sh("live", "base.yaml", "--model", "m28:hang", "--drain-timeout-s", "0.5",
                "--out", "run"), live_written(None, HUNG_GRACE_S + SLACK_S), drive=no_signal),
        Case("4c", "Ctrl-C twice while a model call hangs (drain 60 s)",
             "Ctrl-C ignored while the hung call is joined",
             "servelab live base.yaml --model m28:hang --drain-timeout-s 60 --out run; SIGINT "
             "at 1 s and 1.5 s", sh("live", "base.yaml", "--model", "m28:hang",
                                     "--drain-timeout-s", "60", "--out", "run"),
             live_written("SIGINT", SLACK_S),
             drive=signals_at((1.0, signal.SIGINT), (1.5, signal.SIGINT))),
        Case("4d", "SIGTERM while a model call hangs (drain 0.5 s)", "everything lost",
             "servelab live base.yaml --model m28:hang --drain-timeout-s 0.5 --out run; "
             "SIGTERM at 1 s", sh("live", "base.yaml", "--model", "m28:hang",
                                  "--drain-timeout-s", "0.5", "--out", "run"),
             live_written("SIGTERM", 0.5 + HUNG_GRACE_S + SLACK_S),
             drive=signals_at((1.0, signal.SIGTERM))),
        Case("4e", "--batch-timeout-ms 100 on a hung call",
             "request failed/batch_timeout, its batch finish_s NaN failed False",
             "servelab live base.yaml --model m28:hang --batch-timeout-ms 100 "
             "--drain-timeout-s 0.5 --out run",
             sh("live", "base.yaml", "--model", "m28:hang", "--batch-timeout-ms", "100",
                "--drain-timeout-s", "0.5", "--out", "run"), batch_timeout_row, drive=no_signal),
        Case("4f", "--batch-timeout-ms 0", "accepted: all requests fail, exit 0",
             "servelab live base.yaml --model m28:fast --batch-timeout-ms 0",
             sh("live", "base.yaml", "--model", "m28:fast", "--batch-timeout-ms", "0"),
             field_error("--batch-timeout-ms 0")),
        Case("4g", "--batch-timeout-ms -5", "accepted: all requests fail, exit 0",
             "servelab live base.yaml --model m28:fast --batch-timeout-ms -5",
             sh("live", "base.yaml", "--model", "m28:fast", "--batch-timeout-ms", "-5"),
             field_error("--batch-timeout-ms -5")),
        Case("4h", "--drain-timeout-s nan", "accepted: all requests fail, exit 0",
             "servelab live base.yaml --model m28:fast --drain-timeout-s nan",
             sh("live", "base.yaml", "--model", "m28:fast", "--drain-timeout-s", "nan"),
             field_error("--drain-timeout-s nan")),
        # 5 -- hangs
        Case("5a", "autoscaling cold_start_s .inf, min_replicas 0", "hang",
             "servelab simulate s.yaml", sh("simulate", "s.yaml"),
             field_error("autoscaling.cold_start_s"),
             setup=scenario_file(with_("", autoscaling={**AUTOSCALED,
                                                        "cold_start_s": math.inf}))),
        Case("5b", "autoscaling control_period_s 1e-9", "hang", "servelab simulate s.yaml",
             sh("simulate", "s.yaml"), field_error("autoscaling.control_period_s"),
             setup=scenario_file(with_("", autoscaling={
                 **AUTOSCALED, "min_replicas": 1, "control_period_s": 1e-9}))),
        Case("5c", "MMPP mean_dwell_s 1e-12", "hang and 475 MB", "servelab simulate s.yaml",
             sh("simulate", "s.yaml"), field_error("workload.mean_dwell_s"),
             setup=scenario_file(with_("", workload={
                 "kind": "mmpp", "rates_rps": [100, 0], "mean_dwell_s": 1e-12,
                 "n_requests": 200}))),
        Case("5d", "capacity --over workload.n_requests", "hang",
             "servelab capacity base.yaml --slo p99_ms=10 --over workload.n_requests",
             sh("capacity", "base.yaml", "--slo", "p99_ms=10", "--over",
                "workload.n_requests"), field_error("not a load knob")),
        # 6 -- sweeps killed from outside
        *[Case(f"6{letter}", f"{sig.name} on a sweep's parent", "workers orphaned to PID 1",
               f"servelab sweep base.yaml --grid policy.max_batch_size=1:40:1 --set "
               f"workload.n_requests=400000 --seeds 1 --workers 2; {sig.name} on the parent",
               sh("sweep", "base.yaml", "--grid", "policy.max_batch_size=1:40:1", "--set",
                  "workload.n_requests=400000", "--seeds", "1", "--workers", "2"),
               workers_gone, drive=kill_sweep(sig))
          for letter, sig in (("a", signal.SIGTERM), ("b", signal.SIGKILL))],
        # 7 -- internal errors instead of a field error
        Case("7a", "mixed time zones in a trace", "internal error",
             "servelab simulate s.yaml", sh("simulate", "s.yaml"),
             field_error("workload.timestamp_column"),
             setup=trace("TIMESTAMP\n2024-01-01T00:00:00+00:00\n2024-01-01T00:00:01+05:00\n"
                         "2024-01-01T00:00:02\n")),
        Case("7b", "time_scale 1e-300", "ZeroDivisionError", "servelab simulate s.yaml --out r",
             sh(*sim_r), verdict_is("unstable", "throughput is not measured"),
             setup=trace("TIMESTAMP\n0\n1\n2\n", time_scale=1e-300)),
        Case("7c", "--grid workload.rate_rps=nan:nan:nan", "internal error",
             "servelab sweep base.yaml --grid workload.rate_rps=nan:nan:nan",
             sh("sweep", "base.yaml", "--grid", "workload.rate_rps=nan:nan:nan"),
             field_error("must be finite")),
        Case("7d", "preferred_batch_sizes [8, 16] with max_batch_size 4",
             "field named, but exit 3 as internal", "servelab simulate s.yaml",
             sh("simulate", "s.yaml"), field_error("policy.preferred_batch_sizes"),
             setup=scenario_file(with_("", policy={
                 "kind": "dynamic", "max_batch_size": 4, "preferred_batch_sizes": [8, 16]}))),
        # 8 -- the dashboard
        restore_case("8a", "a trace workload", "trace.yaml",
                     with_("", workload={"kind": "trace", "path": "t.csv"}),
                     "workload.kind 'trace'"),
        Case("8b", "Explore restore: the shipped llm-demo.yaml",
             "ValueError: 'trace' is not in list", "dashboard restore llm-demo.yaml",
             ["-c", RESTORE, "llm-demo.yaml"], field_error("an LLM scenario"),
             setup=lambda w: (w / "llm-demo.yaml").write_bytes(
                 (ROOT / "servelab" / "scenarios" / "llm-demo.yaml").read_bytes())),
        restore_case("8c", "seed: [1, 2]", "seed.yaml", with_("", seed=[1, 2]), "seed"),
        restore_case("8d", "slo_ms: fast", "slo.yaml", with_("", slo_ms="fast"), "slo_ms"),
        restore_case("8e", "workload: hello", "workload.yaml", with_("", workload="hello"),
                     "workload"),
        restore_case("8f", "queue: {max_len: -5}", "queue.yaml",
                     with_("", queue={"max_len": -5}), "max_len"),
        Case("8g", "Calibration upload: 100,000-deep JSON", "RecursionError",
             "dashboard calibration upload deep.json", ["-c", CALIBRATION_UPLOAD, "deep.json"],
             field_error("nested more than 100 levels deep"),
             setup=lambda w: (w / "deep.json").write_text("[" * 100_000 + "]" * 100_000)),
        # 9 -- silently wrong
        Case("9a", "max_wait_ms .inf with max batch 1000", "'stable', throughput 0",
             "servelab simulate s.yaml", sh("simulate", "s.yaml"),
             field_error("policy.max_wait_ms"),
             setup=scenario_file(with_("", policy={"kind": "dynamic", "max_batch_size": 1000,
                                                   "max_wait_ms": math.inf}))),
        Case("9b", "fixed batch 1e6", "'stable', throughput 0",
             "servelab simulate s.yaml --out r", sh(*sim_r),
             verdict_is("unstable", "no request finished"),
             setup=scenario_file(with_("", policy={"kind": "fixed", "batch_size": 10**6}))),
        Case("9c", "capacity --slo p99_ms=1e-300", "a met answer; no candidate met it",
             "servelab capacity base.yaml --slo p99_ms=1e-300",
             sh("capacity", "base.yaml", "--slo", "p99_ms=1e-300"),
             field_error("no candidate holds")),
        Case("9d", "capacity --tol nan", "the first bracket",
             "servelab capacity base.yaml --slo p99_ms=10 --tol nan",
             sh("capacity", "base.yaml", "--slo", "p99_ms=10", "--tol", "nan"),
             field_error("--tol")),
        Case("9e", "capacity --slo error_rate=2", "blamed on the load knob",
             "servelab capacity base.yaml --slo error_rate=2",
             sh("capacity", "base.yaml", "--slo", "error_rate=2"),
             field_error("--slo error_rate")),
        Case("9f", "sim.run(base, drain_timeout_s=-1e9)", "NaN throughput",
             "python: sim.run(base, drain_timeout_s=-1e9)",
             api("sim.run(base, drain_timeout_s=-1e9)"), field_error("drain_timeout_s")),
        Case("9g", "sim.run(base, drain_timeout_s=-1)", "silently stops early",
             "python: sim.run(base, drain_timeout_s=-1)",
             api("sim.run(base, drain_timeout_s=-1)"), field_error("drain_timeout_s")),
        Case("9h", "fractional trace sizes (2.9)", "truncated to 2",
             "servelab simulate s.yaml", sh("simulate", "s.yaml"),
             field_error("workload.size_column"),
             setup=trace("TIMESTAMP,n\n0,2.9\n1,1\n", size_column="n")),
        Case("9i", "fractional LLM token counts (2.9)", "truncated to 2",
             "servelab simulate s.yaml", sh("simulate", "s.yaml"),
             field_error("workload.output_tokens_column"),
             setup=llm_trace("2.9")),
        Case("9j", "a trace row overflowing to inf after time_scale", "row dropped",
             "servelab simulate s.yaml (rows 0, 1e300; time_scale 1e10)",
             sh("simulate", "s.yaml"), field_error("workload.time_scale"),
             setup=trace("TIMESTAMP\n0\n1e300\n", time_scale=1e10)),
        Case("9k", "LLM warmup_s .inf", "accepted", "servelab simulate s.yaml",
             sh("simulate", "s.yaml"), field_error("warmup_s"),
             setup=scenario_file({**LLM, "warmup_s": math.inf})),
        Case("9l", "a second --grid for the same key", "replaces the first",
             "servelab sweep base.yaml --grid policy.max_batch_size=1 --grid "
             "policy.max_batch_size=2",
             sh("sweep", "base.yaml", "--grid", "policy.max_batch_size=1", "--grid",
                "policy.max_batch_size=2"), field_error("given twice")),
        Case("9m", "linear cv 1e6", "every latency exactly 0", "servelab simulate s.yaml",
             sh("simulate", "s.yaml"), field_error("service.cv"),
             setup=scenario_file(with_("", service={"kind": "linear", "base_ms": 1,
                                                    "per_item_ms": 0, "cv": 1e6}))),
        Case("9n", "rate_rps 1e12", "throughput 0 under 'throughput is the capacity'",
             "servelab simulate base.yaml --set workload.rate_rps=1e12 --out r",
             sh("simulate", "base.yaml", "--set", "workload.rate_rps=1e12", "--out", "r"),
             rate_1e12),
        # 10 -- minor
        Case("10a", "sim.run(base, service_seed=-1)", "raw exception",
             "python: sim.run(base, service_seed=-1)", api("sim.run(base, service_seed=-1)"),
             field_error("service_seed")),
        Case("10b", "sim.run(base, overrides={3: 4})", "raw exception",
             "python: sim.run(base, overrides={3: 4})", api("sim.run(base, overrides={3: 4})"),
             field_error("overrides: key 3")),
        Case("10c", "a self-referencing model.params", "raw exception at Result.write",
             "python: params['self'] = params; sim.run(...).write('r')",
             api("""
                 params = {}
                 params["self"] = params
                 sim.run({**base, "model": {"name": "mlp", "params": params}}).write("r")
                 """), field_error("model.params.self: refers to itself")),
        Case("10d", "any file given as a trace", "the error echoes the file's first line",
             "servelab simulate s.yaml (path: secret.txt, first line 'TOKEN=hunter2-…')",
             sh("simulate", "s.yaml"), no_echo,
             setup=scenario_file(with_("", workload={"kind": "trace", "path": "secret.txt"}),
                                 {"secret.txt": "TOKEN=hunter2-do-not-print\nmore,text\n"})),
        Case("10e", "builtin:../../pyproject.toml as a trace", "read outside the data folder",
             "servelab simulate s.yaml (path: builtin:../../pyproject.toml)",
             sh("simulate", "s.yaml"), field_error("workload.path"),
             setup=scenario_file(with_("", workload={
                 "kind": "trace", "path": "builtin:../../pyproject.toml"}))),
    ]


def no_echo(out: Outcome, where: Path) -> tuple[bool, str]:
    ok, shown = field_error("workload")(out, where)
    if "hunter2" in out.text:
        return False, f"echoes the first line: {shown}"
    return ok, shown


# -- running ----------------------------------------------------------------------------------
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000", "NO_COLOR": "1"}


def run_child(case: Case, where: Path) -> Outcome:
    """Run ``case`` in ``where``; kill its process group past the time or memory limit."""
    out_path, err_path = where / "stdout.txt", where / "stderr.txt"
    notes: dict[str, Any] = {}
    with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, *case.argv], cwd=where, env=ENV,
                                stdout=out_file, stderr=err_file, start_new_session=True)
    driver = None
    if case.drive is not None:
        drive = case.drive

        def target() -> None:
            try:
                drive(proc, where, notes)
            except Exception as exc:  # shown in the row
                notes["drive_error"] = f"{type(exc).__name__}: {exc}"

        driver = threading.Thread(target=target, daemon=True)
        driver.start()
    killed, peak_mb, status, usage = "", 0.0, 0, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = time.monotonic()
        rss = _tree_rss_mb(proc.pid)
        peak_mb = max(peak_mb, rss)
        if not killed and (now - t0 > case.timeout_s or rss > KILL_RSS_MB):
            killed = (f"killed after {case.timeout_s:.0f} s" if rss <= KILL_RSS_MB else
                      f"killed at {rss:.0f} MB")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.02)
    notes["exited"] = time.monotonic()
    wall_s = notes["exited"] - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if driver is not None:
        driver.join(30)
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    peak_mb = max(peak_mb, usage.ru_maxrss / 1024 if usage is not None else 0.0)
    return Outcome(code, out_path.read_text(errors="replace"),
                   err_path.read_text(errors="replace"), wall_s, peak_mb, killed, notes)


def run_case(case: Case, where: Path) -> dict[str, Any]:
    where.mkdir()
    write_yaml(where, "base.yaml", BASE)
    (where / "m28.py").write_text(FACTORY)
    if case.setup is not None:
        case.setup(where)
    out = run_child(case, where)
    try:
        ok, shown = case.check(out, where)
    except Exception as exc:  # a check that cannot read the result: bad
        ok, shown = False, f"check failed: {type(exc).__name__}: {exc}; " + _one_line(
            " ".join(_lines(out))[-200:])
    why = [w for w in (out.killed, out.notes.get("drive_error"),
                       f"{out.rss_mb:.0f} MB" if out.rss_mb > MEMORY_OK_MB else "",
                       "" if ok else "not the expected outcome") if w]
    # a right outcome is an error naming the field (exit 2) or a correct result
    kind = "field error" if out.code == 2 else "correct result"
    verdict = kind if not why else "STILL BAD: " + "; ".join(why)
    return {"item": case.item, "case": case.label, "command": case.shown,
            "before": case.before, "exit": out.code, "now": _one_line(shown),
            "rss_mb": out.rss_mb, "wall_s": out.wall_s, "verdict": verdict}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def header() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return (f"Python {platform.python_version()}, {platform.machine()}, "
            f"{platform.system()} {platform.release()}, {os.cpu_count()} cores (load "
            f"{os.getloadavg()[0]:.1f} at the start), commit {commit}"
            f"{' with local changes' if dirty else ''}")


def main() -> None:
    head = header()
    only = set(sys.argv[1:])  # item ids to run (all when none)
    t0 = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="issue28-") as tmp:
        for case in cases():
            if only and case.item not in only:
                continue
            row = run_case(case, Path(tmp) / case.item)
            print(f"{row['item']:>4} {row['verdict'][:40]:40} {row['wall_s']:5.1f} s "
                  f"{row['rss_mb']:6.0f} MB  {row['now'][:90]}", flush=True)
            rows.append(row)
    total_s = time.monotonic() - t0
    bad = [r for r in rows if r["verdict"].startswith("STILL BAD")]
    counts = {v: sum(r["verdict"] == v for r in rows)
              for v in ("field error", "correct result")}
    lines = [
        "# Issue 28's cases on today's code", "",
        f"`python benchmarks/issue28_cases.py` — {len(rows)} inputs of the issue's list "
        f"(items 1-10), {total_s:.0f} s; {head}.", "",
        f"{counts['field error']} give a one-line error naming the field, "
        f"{counts['correct result']} a correct result, {len(bad)} are STILL BAD. Each ran in "
        f"its own subprocess under a {TIMEOUT_S:.0f} s limit (killed at {KILL_RSS_MB:.0f} MB); "
        "`base.yaml` is the issue's (constant 1 ms, Poisson 100 req/s, 200 requests, greedy "
        "max 4). Exit: the process's status (a death by signal as 128 + its number). Peak "
        "RSS: the larger of the tree's summed RSS (polled every 20 ms) and wait4's maxrss. "
        "Live cases "
        "run `--model m28:fast|hang`, a 1 ms stand-in built by a module:factory (`hang` never "
        "returns from batch 5). The dashboard cases call `dashboard.restore.restorable` and "
        "the Calibration page's upload parsing, as the pages do.", "",
        "| # | case | command | before (issue) | exit | what it prints now | peak RSS MB "
        "| wall s | verdict |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['item']} | {_cell(r['case'])} | `{_cell(r['command'])}` | "
                     f"{_cell(r['before'])} | {r['exit']} | `{_cell(r['now'])}` | "
                     f"{r['rss_mb']:.0f} | {r['wall_s']:.1f} | {r['verdict']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not only:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / "issue28_cases.md"
        out.write_text(text)
        print(f"wrote {out}")
    print(f"{len(rows)} cases: {counts}, {len(bad)} STILL BAD"
          + (": " + ", ".join(r["item"] for r in bad) if bad else ""))


if __name__ == "__main__":
    main()
