"""Scripted experiments: sweeps, replications with confidence intervals, capacity planning.

Every task is one simulation that returns one flat summary row, so the same tasks run in local
processes (``workers``) or on an existing Dask cluster (``dask="tcp://host:port"``, or the
``DASK_SCHEDULER_ADDRESS`` environment variable) with identical results for the same seeds.
A sweep with an output directory appends each finished row to ``runs.jsonl`` as it arrives, so
Ctrl-C keeps what finished and re-running with the same directory skips it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.errors import UserError
from sim.experiments.resume import check_same_sweep, read_runs, servelab_version
from sim.metrics.summary import ok_requests
from sim.scenario.schema import Scenario, cli_value
from sim.serving.records import RECORDS

if TYPE_CHECKING:
    from sim.scenario.llm import LlmScenario

Progress = Callable[[int, int], None]  # (finished, total)
MAX_GRID_VALUES = 10_000  # values of one --grid key
MAX_TASKS = 100_000  # runs of one sweep (grid points x seeds)


class ExperimentError(UserError):
    """Bad experiment arguments (grid, SLO, ...)."""


# -- rows ------------------------------------------------------------------------------------
def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested summary -> flat row with dotted keys; lists and histograms become JSON text."""
    row: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and key != "batch_size_hist":
            row.update(flatten(value, f"{name}."))
        elif isinstance(value, Mapping | list):
            row[name] = json.dumps(value)
        else:
            row[name] = value
    return row


def _key(resolved: Mapping[str, Any], seed: int, records: str, version: str) -> str:
    """A run's resume key: the whole resolved scenario (grid point applied), its seed, the
    records mode and the servelab version, so a changed scenario or servelab is a new run.
    """
    text = json.dumps({"scenario": {**resolved, "seed": seed}, "records": records,
                       "servelab": version}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    """One simulation: base scenario (as a dict), overrides, seed."""

    base: dict[str, Any]
    point: dict[str, Any]
    seed: int
    key: str
    records: str = "summary"


def run_task(task: Task) -> dict[str, Any]:
    """Simulate one task; never raises (an error becomes the row's ``error``)."""
    from sim.llm import run_any

    row: dict[str, Any] = {"key": task.key, **task.point, "seed": task.seed, "error": ""}
    try:
        result = run_any(task.base, overrides={**task.point, "seed": task.seed},
                         records=task.records)
        row.update(flatten(result.summary))
        row["wall_s"] = result.meta.get("wall_s")
        row["records"] = result.meta.get("records", "full")
    except Exception as exc:  # a failing run is recorded and the sweep goes on
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


# -- grids -------------------------------------------------------------------------------------
def parse_grid_value(text: str) -> list[Any]:
    """``"1,2,4"`` -> [1, 2, 4]; ``"100:600:50"`` -> 100, 150, ..., 600 (inclusive)."""
    text = text.strip()
    if ":" in text and "," not in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ExperimentError(f"--grid {text!r}: a range is START:STOP:STEP")
        try:
            start, stop, step = (float(p) for p in parts)
        except ValueError:
            raise ExperimentError(f"--grid {text!r}: range bounds must be numbers") from None
        if not all(math.isfinite(v) for v in (start, stop, step)):
            raise ExperimentError(f"--grid {text!r}: START, STOP and STEP must be finite "
                                  "numbers")
        if step <= 0 or stop < start:
            raise ExperimentError(f"--grid {text!r}: need STEP > 0 and STOP >= START")
        count = math.floor((stop - start) / step + 0.5) + 1
        if count > MAX_GRID_VALUES:
            raise ExperimentError(f"--grid {text!r}: {count:,} values; at most "
                                  f"{MAX_GRID_VALUES:,} per key (raise STEP)")
        values = list(np.arange(start, stop + step / 2, step))
        as_int = all(float(v).is_integer() for v in (start, stop, step))
        return [int(v) if as_int else round(float(v), 10) for v in values]
    values = [cli_value(v) for v in text.split(",") if v.strip()]
    if not values:
        raise ExperimentError(f"--grid {text!r}: no values")
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            raise ExperimentError(f"--grid {text!r}: {value} is not a finite number")
    return values


def parse_grid(items: Iterable[str]) -> dict[str, list[Any]]:
    """``["policy.max_batch_size=1,2,4", "workload.rate_rps=100:600:50"]`` -> grid dict."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise ExperimentError(f"--grid {item!r}: expected KEY=VALUES, e.g. "
                                  "policy.max_batch_size=1,2,4,8")
        key, values = item.split("=", 1)
        if key.strip() in grid:
            raise ExperimentError(f"--grid {key.strip()}: given twice; give all its values in "
                                  f"one --grid, e.g. {key.strip()}=1,2,4")
        grid[key.strip()] = parse_grid_value(values)
    return grid


def load_any(source: Any, overrides: Any = None) -> Scenario | LlmScenario:
    """A request-level or LLM scenario, whichever ``source`` is (:func:`sim.llm.load_any`)."""
    from sim.llm import load_any as _load_any

    return _load_any(source, overrides)


def tasks_for(base: Scenario | LlmScenario, grid: Mapping[str, Sequence[Any]],
              seeds: int | Sequence[int], records: str = "summary") -> list[Task]:
    """The cross product of grid values and seeds (each point validated up front)."""
    if records not in RECORDS:
        raise ExperimentError(f"records: {records!r} is not one of {list(RECORDS)}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list:
        raise ExperimentError("seeds: need at least one")
    base_dict = base.model_dump(mode="json")
    keys = list(grid)
    version = servelab_version()
    total = math.prod(len(grid[k]) for k in keys) * len(seed_list)
    if total > MAX_TASKS:
        raise ExperimentError(f"--grid: {total:,} runs (grid points x seeds); at most "
                              f"{MAX_TASKS:,} in one sweep")
    out = []
    for combo in product(*(grid[k] for k in keys)):
        point = dict(zip(keys, combo, strict=True))
        # fail fast, naming the field, before any run
        resolved = load_any(base_dict, point).model_dump(mode="json")
        for seed in seed_list:
            out.append(Task(base_dict, point, int(seed),
                            _key(resolved, int(seed), records, version), records))
    return out


# -- execution ---------------------------------------------------------------------------------
def _dask_address(dask: str | None) -> str | None:
    return dask or os.environ.get("DASK_SCHEDULER_ADDRESS") or None


def execute(tasks: Sequence[Task], *, workers: int | None = None, dask: str | None = None,
            progress: Progress | None = None) -> Iterator[dict[str, Any]]:
    """Run tasks; yield rows as they finish (locally in processes, or on a Dask cluster)."""
    address = _dask_address(dask)
    total = len(tasks)
    if address is not None:
        yield from _execute_dask(tasks, address, progress)
        return
    n = workers or os.cpu_count() or 1
    if n <= 1 or total <= 1:
        for i, task in enumerate(tasks, 1):
            yield run_task(task)
            if progress:
                progress(i, total)
        return
    import multiprocessing

    from sim.experiments.orphans import die_with_parent

    # the workers die with this process, even when it is killed (see sim.experiments.orphans)
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork"),
                             initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        pending: set[Future[dict[str, Any]]] = {pool.submit(run_task, t) for t in tasks}
        done_count = 0
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    done_count += 1
                    yield fut.result()
                    if progress:
                        progress(done_count, total)
        finally:
            for fut in pending:
                fut.cancel()


def _execute_dask(tasks: Sequence[Task], address: str, progress: Progress | None
                  ) -> Iterator[dict[str, Any]]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ExperimentError("--dask: needs dask.distributed (pip install 'servelab[distributed]')"
                              ) from None
    with Client(address, timeout="10s") as client:  # type: ignore[no-untyped-call]
        futures = client.map(run_task, list(tasks), pure=False)
        for i, fut in enumerate(as_completed(futures), 1):  # type: ignore[no-untyped-call]
            yield fut.result()
            if progress:
                progress(i, len(tasks))


# -- public API ----------------------------------------------------------------------------------
def sweep(base_scenario: Scenario | LlmScenario | dict[str, Any] | str | Path,
          grid: Mapping[str, Sequence[Any]], seeds: int | Sequence[int] = 5, *,
          workers: int | None = None, dask: str | None = None, out_dir: str | Path | None = None,
          progress: Progress | None = None, records: str = "summary",
          yes: bool = False) -> pd.DataFrame:
    """Simulate every grid point with every seed.

    Args:
        base_scenario: The scenario the grid modifies.
        grid: Dotted key -> values, e.g. ``{"policy.max_batch_size": [1, 2, 4, 8]}``.
        seeds: Number of seeds (0..n-1) or the seeds themselves.
        workers: Local processes (default: all cores).
        dask: Address of an existing Dask scheduler (or ``DASK_SCHEDULER_ADDRESS``).
        out_dir: Append finished rows to ``out_dir/runs.jsonl`` and skip rows already there.
        progress: Called with (finished, total).
        records: ``summary`` (default): each run keeps only what its summary needs, so a
            long run fits in little memory (the same numbers as ``full``; see
            :func:`sim.run`).
        yes: Run even when the pre-flight estimate (:mod:`sim.experiments.preflight`) exceeds the
            budget; otherwise such a sweep raises :class:`sim.experiments.preflight.BudgetError`.

    Returns:
        One row per run: every grid value, ``seed``, ``error`` and every summary metric
        (nested keys dotted: ``latency_ms.p99``). Sorted by grid order then seed.
    """
    base = load_any(base_scenario)
    tasks = tasks_for(base, grid, seeds, records)
    if not yes:
        from sim.experiments.preflight import Estimate, check, estimate_many, estimate_run

        by_point: dict[str, Estimate] = {}
        estimates = []
        for t in tasks:
            point_key = json.dumps(t.point, sort_keys=True, default=str)
            if point_key not in by_point:
                by_point[point_key] = estimate_run(load_any(t.base, t.point), records)
            estimates.append(by_point[point_key])
        check(estimate_many(estimates, workers or os.cpu_count() or 1, "runs"), "sweep")
    order = {t.key: i for i, t in enumerate(tasks)}
    rows: dict[str, dict[str, Any]] = {}
    log: Path | None = None
    if out_dir is not None:
        log = Path(out_dir) / "runs.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        check_same_sweep(Path(out_dir), base, records)
        rows = {key: row for key, row in read_runs(log).items()
                if key in order and not row.get("error")}
    todo = [t for t in tasks if t.key not in rows]
    done_before = len(tasks) - len(todo)

    def tick(finished: int, total: int) -> None:
        if progress:
            progress(done_before + finished, len(tasks))

    if progress and done_before:
        progress(done_before, len(tasks))
    fh = log.open("a") if log is not None else None
    try:
        for row in execute(todo, workers=workers, dask=dask, progress=tick):
            rows[row["key"]] = row
            if fh is not None:
                fh.write(json.dumps(row, default=_json_default) + "\n")
                fh.flush()
    finally:
        if fh is not None:
            fh.close()
    ordered: list[dict[str, Any]] = sorted(rows.values(), key=lambda r: order[str(r["key"])])
    return pd.DataFrame(ordered)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _t_quantile(p: float, dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(p, dof))


def confidence_table(frame: pd.DataFrame, metrics: Sequence[str] | None = None,
                     confidence: float = 0.95) -> pd.DataFrame:
    """Mean, standard deviation and t-interval per metric over independent replications."""
    numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])
               and c not in ("seed",)]
    cols = list(metrics) if metrics else numeric
    out = []
    for col in cols:
        values = frame[col].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        k = values.size
        mean = float(values.mean()) if k else math.nan
        sd = float(values.std(ddof=1)) if k > 1 else math.nan
        half = _t_quantile(0.5 + confidence / 2, k - 1) * sd / math.sqrt(k) if k > 1 else math.nan
        out.append({"metric": col, "n": k, "mean": mean, "std": sd, "ci_low": mean - half,
                    "ci_high": mean + half, "confidence": confidence})
    return pd.DataFrame(out).set_index("metric")


def replicate(scenario: Scenario | dict[str, Any] | str | Path, seeds: int = 10, *,
              confidence: float = 0.95, metrics: Sequence[str] | None = None,
              workers: int | None = None, dask: str | None = None) -> pd.DataFrame:
    """Independent replications (seeds 0..n-1): mean and t-interval per metric."""
    frame = sweep(scenario, {}, seeds, workers=workers, dask=dask)
    failed = frame[frame["error"] != ""]
    if len(failed):
        raise ExperimentError(f"{len(failed)} replications failed: {failed['error'].iloc[0]}")
    return confidence_table(frame, metrics, confidence)


def batch_means(scenario: Scenario | dict[str, Any] | str | Path, batches: int = 10, *,
                metric: str = "latency_ms", stat: str = "mean", confidence: float = 0.95
                ) -> dict[str, float]:
    """Confidence interval from one long run split into ``batches`` consecutive windows of
    arrivals (after warm-up): the statistic per window, then a t-interval over windows.
    """
    from sim.drivers.simulate import run

    result = run(scenario)
    req = ok_requests(result.requests, result.scenario.warmup_s)
    column = {"latency_ms": req["finish_s"] - req["arrival_s"],
              "queue_ms": req["start_s"] - req["arrival_s"],
              "service_ms": req["finish_s"] - req["start_s"]}.get(metric)
    if column is None:
        raise ExperimentError(f"metric {metric!r}: allowed: latency_ms, queue_ms, service_ms")
    values = column.to_numpy() * 1e3
    parts = np.array_split(values, batches)
    q = {"mean": -1.0, "p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
    if stat not in q:
        raise ExperimentError(f"stat {stat!r}: allowed: {', '.join(q)}")
    per = np.array([p.mean() if stat == "mean" else np.percentile(p, q[stat]) for p in parts])
    mean, sd = float(per.mean()), float(per.std(ddof=1))
    half = _t_quantile(0.5 + confidence / 2, batches - 1) * sd / math.sqrt(batches)
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "batches": batches}


def pareto(frame: pd.DataFrame, x: str = "throughput_rps", y: str = "latency_ms.p99",
           maximize_x: bool = True, minimize_y: bool = True) -> pd.DataFrame:
    """The non-dominated rows (best x for its y and best y for its x)."""
    if x not in frame or y not in frame:
        raise ExperimentError(f"pareto: columns {x!r} and {y!r} must be in the frame")
    data = frame[np.isfinite(frame[x]) & np.isfinite(frame[y])]
    xs = data[x].to_numpy() * (1 if maximize_x else -1)
    ys = data[y].to_numpy() * (1 if minimize_y else -1)
    order = np.lexsort((ys, -xs))  # best x first, then best y
    keep, best_y = [], math.inf
    for i in order:
        if ys[i] < best_y:
            keep.append(i)
            best_y = ys[i]
    front: pd.DataFrame = data.iloc[sorted(keep, key=lambda i: xs[i])]
    return front
