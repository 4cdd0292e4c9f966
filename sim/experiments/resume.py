"""Resuming a sweep: its output folder records which scenario its rows belong to.

``OUT/sweep.json`` holds the base scenario, the records mode and the servelab version; a
sweep into a folder that holds another scenario's runs is refused, naming what changed.
``OUT/runs.jsonl`` holds one JSON row per finished run; a torn last line (a write cut short)
is dropped so that run is redone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.errors import UserError

if TYPE_CHECKING:
    from sim.scenario.llm import LlmScenario
    from sim.scenario.schema import Scenario


class ResumeError(UserError):
    """The output folder holds runs that cannot be resumed by this sweep."""


def servelab_version() -> str:
    """The installed servelab's version ("unknown" when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("servelab")
    except metadata.PackageNotFoundError:
        return "unknown"


MANIFEST = "sweep.json"


def check_same_sweep(out_dir: Path, base: Scenario | LlmScenario, records: str) -> None:
    """Record the sweep's base scenario in ``out_dir/sweep.json``, or check that the one
    recorded there is this one, so ``runs.jsonl`` never mixes two experiments.

    Raises:
        ResumeError: the directory holds another scenario's (or servelab's) runs; the
            message names the first fields that differ.
    """
    manifest = out_dir / MANIFEST
    mine = {"servelab": servelab_version(), "records": records,
            "scenario": base.model_dump(mode="json")}
    log = out_dir / "runs.jsonl"
    if manifest.exists():
        try:
            theirs = json.loads(manifest.read_text())
        except json.JSONDecodeError:
            theirs = None
        if theirs != mine:
            diff = _differences(theirs if isinstance(theirs, dict) else {}, mine)
            raise ResumeError(f"--out {str(out_dir)!r} holds the runs of a different sweep "
                                  f"({'; '.join(diff[:3]) or 'unreadable ' + MANIFEST}); "
                                  "use another --out, or delete that folder to start over")
    elif log.exists() and log.stat().st_size > 0:
        raise ResumeError(f"--out {str(out_dir)!r} holds runs.jsonl without {MANIFEST} "
                              "(an older servelab, or another tool): its runs cannot be "
                              "matched to this scenario; use another --out")
    else:
        manifest.write_text(json.dumps(mine, indent=1, sort_keys=True))


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted fields that differ between two JSON trees: ``workload.rate_rps: 100 -> 3000``."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                out.append(f"{where}: {old.get(key, 'absent')} -> {new.get(key, 'absent')}")
            else:
                out.extend(_differences(old[key], new[key], where))
        return [d.removeprefix("scenario.") for d in out]
    return [] if old == new else [f"{path}: {old} -> {new}"]


def read_runs(log: Path) -> dict[str, dict[str, Any]]:
    """The rows of ``runs.jsonl`` by key. A torn last line (a write cut short by a kill or
    a full disk) is dropped from the file, so the sweep reruns that one run and appends after
    whole lines.

    Raises:
        ResumeError: a line other than the last is not JSON (the file was edited).
    """
    if not log.exists():
        return {}
    data = log.read_bytes()
    rows: dict[str, dict[str, Any]] = {}
    lines = data.splitlines(keepends=True)
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    offset = 0
    for i, line in enumerate(lines):
        if line.strip():
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not an object")
            except ValueError:
                if i != last:
                    raise ResumeError(f"{log}: line {i + 1} is not a JSON row; fix or "
                                          "delete that line to resume") from None
                with log.open("r+b") as fh:  # torn tail: keep the whole lines before it
                    fh.truncate(offset)
                break
            if "key" in row:
                rows[str(row["key"])] = row
        offset += len(line)
    return rows


