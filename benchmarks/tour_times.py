"""Wall time of every command in the README's Tour, run as written in an empty directory.

The commands are read from README.md's "## Tour" section the way ``tests/test_readme_tour.py``
reads them, but nothing is shortened: each runs exactly as a newcomer would type it, in
order, in one fresh temporary directory (later commands use what earlier ones wrote, e.g.
``my.yaml``). Each command's wall time and exit status go into a table; the issue's target
is under one minute per command.

Usage: python benchmarks/tour_times.py [--note TEXT]
Writes benchmarks/results/tour_times.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET_S = 60.0
sys.path.insert(0, str(ROOT))

from tests.test_readme_tour import tour_commands  # noqa: E402  (the README's own parser)


def time_commands(commands: list[list[str]], cwd: Path) -> list[dict[str, object]]:
    """Run each command in ``cwd`` in turn; one row per command with its wall time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    servelab = shutil.which("servelab")
    rows: list[dict[str, object]] = []
    for words in commands:
        argv = [servelab, *words[1:]] if servelab else [sys.executable, "-m", "servelab.cli",
                                                        *words[1:]]
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              check=False)
        wall_s = time.perf_counter() - start
        rows.append({"command": shlex.join(words), "wall_s": round(wall_s, 2),
                     "exit": done.returncode,
                     "last_line": (done.stdout.strip() or done.stderr.strip()
                                   ).splitlines()[-1:] or [""]})
        print(f"{wall_s:7.1f} s  exit {done.returncode}  {shlex.join(words)}", flush=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
    return rows


def write(rows: list[dict[str, object]], note: str) -> None:
    """The markdown table and the JSON beside it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(),
            "cpus": os.cpu_count(), "loadavg_1min_end": round(load[0], 2), "note": note}
    total = sum(float(str(r["wall_s"])) for r in rows)
    lines = ["# README Tour: wall time per command", "",
             f"Every command of README.md's Tour, as written, in order, in one empty "
             f"directory; {meta['when']}, {meta['cpus']} CPUs. Target: each under "
             f"{TARGET_S:.0f} s. Total {total:.0f} s.", *(["", note] if note else []), "",
             "| # | command | wall (s) | exit | under 1 min |", "|---:|---|---:|---:|:---:|"]
    for k, row in enumerate(rows, 1):
        ok = "yes" if float(str(row["wall_s"])) < TARGET_S and row["exit"] == 0 else "no"
        lines.append(f"| {k} | `{row['command']}` | {row['wall_s']} | {row['exit']} | {ok} |")
    (RESULTS / "tour_times.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "tour_times.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                        indent=1) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Time the Tour and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--note", default="", help="how the run was made (into the results)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="servelab-tour-") as tmp:
        rows = time_commands(tour_commands(), Path(tmp))
    write(rows, args.note)


if __name__ == "__main__":
    main()
