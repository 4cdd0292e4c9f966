"""The run directory shared by ``servelab simulate`` and ``servelab live``.

Layout: ``scenario.yaml`` (resolved), ``requests.parquet``, ``batches.parquet``,
``queue.parquet``, ``summary.json``, ``meta.json`` (versions, host, device, seed, driver);
an autoscaled run adds ``replicas.parquet`` (the replica counts as a step series) and
``fleet_events.parquet`` (every launch, ready, retire and stop). A ``records: summary``
run writes only ``scenario.yaml``, ``summary.json`` and ``meta.json`` (``"records":
"summary"``).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from sim import native
from sim.scenario.schema import Scenario

if TYPE_CHECKING:
    from sim.serving.core import ServingCore

_PACKAGES = ("servelab", "simpy", "numpy", "pandas", "pyarrow", "pydantic", "torch")


def versions() -> dict[str, str]:
    """Installed versions of servelab and the packages that shape its results (read once
    per process: the package metadata lookup costs about 50 ms, a sixth of a dashboard
    re-simulation, and installed versions do not change under a running process).
    """
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def run_meta(scenario: Scenario, driver: str, device: dict[str, Any],
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Provenance of a run: config name, seed, driver, device, versions, host, time."""
    return {
        "driver": driver,
        "scenario": scenario.name,
        "seed": scenario.seed,
        "device": device,
        "versions": versions(),
        "compiled": native.compiled_modules(),
        "host": {"name": platform.node(), "platform": platform.platform(),
                 "processor": platform.processor() or platform.machine()},
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        **(extra or {}),
    }


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN and inf become null."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def write_json(path: Path, data: Any) -> None:
    """Write JSON with NaN/inf as null."""
    path.write_text(json.dumps(_clean(data), indent=2) + "\n")


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """Write one record table as parquet: dictionary-encode only the columns of names
    (status, reason, class, event), whose few values repeat; times and counts are written
    plain, which halves the time of writing a long run and gives smaller files.
    """
    named = [str(c) for c in frame.columns
             if isinstance(frame[c].dtype, pd.CategoricalDtype) or frame[c].dtype == object
             or pd.api.types.is_string_dtype(frame[c].dtype)]
    frame.to_parquet(path, index=False, use_dictionary=named or False)


def write_run_dir(out_dir: str | Path, scenario: Scenario, requests: pd.DataFrame,
                  batches: pd.DataFrame, queue: pd.DataFrame, summary: dict[str, Any],
                  meta: dict[str, Any],
                  fleet: tuple[pd.DataFrame, pd.DataFrame] | None = None, *,
                  tables: bool = True) -> Path:
    """Write a complete run directory and return its path (``fleet``: the replica series
    and the fleet events of an autoscaled run; ``tables``: False for a run that kept only
    its summary, which writes no parquet table).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.yaml").write_text(scenario.to_yaml())
    write_json(out / "meta.json", meta)
    if tables:
        write_table(requests, out / "requests.parquet")
        write_table(batches, out / "batches.parquet")
        write_table(queue, out / "queue.parquet")
    if fleet is not None:
        write_table(fleet[0], out / "replicas.parquet")
        write_table(fleet[1], out / "fleet_events.parquet")
    write_json(out / "summary.json", summary)
    return out


@dataclass
class Result:
    """A finished run: summary plus the record tables.

    Attributes:
        scenario: The resolved scenario.
        summary: Summary metrics (keys as in the design).
        requests: One row per request.
        batches: One row per batch.
        queue: Queue length step function.
        meta: Versions, host, seed, driver, wall time.
        replicas: Autoscaled runs: replica counts over time (``time_s, ready, starting,
            draining, replicas``); None otherwise.
        fleet_events: Autoscaled runs: ``time_s, replica, event``; None otherwise.
    """

    scenario: Scenario
    summary: dict[str, Any]
    requests: pd.DataFrame
    batches: pd.DataFrame
    queue: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    replicas: pd.DataFrame | None = None
    fleet_events: pd.DataFrame | None = None

    def write(self, out_dir: str | Path) -> Path:
        """Write the run directory (scenario, parquet tables, summary.json, meta.json; a
        ``records: summary`` run has no tables to write).
        """
        fleet = None if self.replicas is None or self.fleet_events is None else (
            self.replicas, self.fleet_events)
        tables = self.meta.get("records", "full") == "full"
        return write_run_dir(out_dir, self.scenario, self.requests, self.batches, self.queue,
                             self.summary, self.meta, fleet, tables=tables)


def fleet_tables(core: ServingCore) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The replica series and fleet events of an autoscaled core (None: fixed replicas)."""
    if core.fleet is None:
        return None
    return core.fleet.log.series(), core.fleet.log.event_frame()
