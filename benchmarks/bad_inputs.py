"""What every tested bad input prints now: the CLI cases of ``tests/sim/test_bad_input.py``
(scenario files, flags) and the dashboard's upload cases, each run as the tests run it, with
its exit code and the one line it prints.

Usage: ``python benchmarks/bad_inputs.py`` (a few seconds). Writes
``benchmarks/results/bad_inputs.md``. The tests assert each line; this lists them for a
reader (and for a closing note that must say what each case prints).
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from typer.testing import CliRunner  # noqa: E402

from servelab.cli import app  # noqa: E402
from tests.sim import test_bad_input as cases  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WIDTH = 220  # characters of a printed line kept in the table


def _error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()
             and not line.startswith(("searching ", "candidate "))]
    line = lines[0] if len(lines) == 1 else " / ".join(lines)
    return line if len(line) <= WIDTH else line[:WIDTH] + " …"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def scenario_rows(tmp: Path) -> list[tuple[str, int, str]]:
    """``servelab simulate FILE -q`` on each bad scenario file."""
    rows = []
    for i, (label, make, _field) in enumerate(cases.ALL_CASES):
        where = tmp / f"s{i}"
        where.mkdir()
        path = cases.write(where, make(where))
        result = CliRunner().invoke(app, ["simulate", path, "-q"])
        rows.append((label, result.exit_code, _error_line(result.output)))
    return rows


def flag_rows(tmp: Path) -> list[tuple[str, int, str]]:
    """The bad flags of ``simulate``, ``sweep``, ``capacity`` and ``live``."""
    rows = []
    for i, (label, args, _text) in enumerate(cases.FLAG_CASES):
        where = tmp / f"f{i}"
        where.mkdir()
        path = cases.write(where, {**cases.GOOD, "model": {"name": "mlp"}})
        argv = [a.format(path=path, tmp=where) for a in args]
        result = CliRunner().invoke(app, argv)
        shown = " ".join("FILE" if a == path else a for a in argv)
        rows.append((f"{label} (`servelab {shown}`)", result.exit_code,
                     _error_line(result.output)))
    return rows


def upload_rows() -> list[tuple[str, int, str]]:
    """The dashboard's upload parser (exit code: not a process; 0 shown as '—')."""
    from dashboard.state import UploadError, parse_upload

    rows = []
    for label, data, name, _text in cases.UPLOAD_CASES:
        try:
            parse_upload(data, name)
            message = "(accepted)"
        except UploadError as err:
            message = str(err)
        rows.append((f"dashboard upload: {label}", -1, message))
    return rows


def main() -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows = [(label.replace(tmp_name, "TMP"), code, text.replace(tmp_name, "TMP"))
                for label, code, text in scenario_rows(tmp) + flag_rows(tmp) + upload_rows()]
    wall_s = time.perf_counter() - t0
    lines = ["# What each tested bad input prints", "",
             f"`python benchmarks/bad_inputs.py` — {len(rows)} cases, {wall_s:.0f} s, "
             f"Python {platform.python_version()}, {platform.machine()}. Exit 2 is a user "
             "error; the dashboard's upload cases raise `UploadError` (shown as exit —).", "",
             "| case | exit | what it prints |", "|---|---|---|"]
    for label, code, text in rows:
        lines.append(f"| {_cell(label)} | {'—' if code < 0 else code} | `{_cell(text)}` |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bad_inputs.md"
    out.write_text("\n".join(lines) + "\n")
    bad = [r for r in rows if r[1] not in (2, -1) or r[2] == "(accepted)"]
    print("\n".join(lines))
    print(f"\nwrote {out}; {len(rows)} cases, {len(bad)} not refused (exit 2 or UploadError)")


if __name__ == "__main__":
    main()
