"""The calibration commands behind ``servelab calibrate`` and ``servelab profile``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from calibration.cold_start import measure_load
from calibration.measure import calibrate, parse_batch_sizes
from calibration.model_runners import build_runner
from calibration.profile import LatencyProfile, load_profile, profile_summary
from calibration.report import write_report
from sim.errors import UserError
from sim.scenario.schema import cli_value


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["width=512", "depth=2"]`` -> ``{"width": 512, "depth": 2}`` (values read as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--param {item!r}: expected KEY=VALUE, e.g. --param width=512")
        key, raw = item.split("=", 1)
        out[key.strip()] = cli_value(raw)
    return out


def run_calibration(*, model: str, device: str, dtype: str, threads: int | None,
                    batch_sizes: str, reps: int, warmup: int, seed: int, compile: bool,
                    params: list[str], out: Path, console: Console, cold_idle_ms: float = 0.0,
                    cold_reps: int | None = None, cold_after_ms: float = 10.0,
                    load_reps: int = 0,
                    before_run: Callable[[Any, list[int]], None] | None = None,
                    ) -> LatencyProfile | None:
    """Build the runner, sweep with a progress bar, write profile + report (also on Ctrl-C);
    with ``load_reps`` also time that many cold starts (:mod:`calibration.cold_start`).
    """
    sizes = parse_batch_sizes(batch_sizes)
    for name, value in (("--reps", reps), ("--warmup", warmup)):
        if value < (1 if name == "--reps" else 0):
            raise UserError(f"{name} {value}: must be >= {1 if name == '--reps' else 0}")
    runner = build_runner(model, device=device, dtype=dtype, threads=threads, compile=compile,
                          params=parse_params(params))
    if before_run is not None:  # the CLI's pre-flight estimate (may refuse)
        before_run(runner, sizes)
    info = runner.describe()
    where = info.get("device", {})
    console.print(f"calibrating [bold]{runner.name}[/] on {where.get('name', where)} "
                  f"({info.get('dtype')}, {info.get('threads')} threads): sizes {sizes}, "
                  f"{reps} reps each")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("warm-up and probe", total=len(sizes) * reps)

        def step(done: int, total: int, size: int) -> None:
            bar.update(task, completed=done, total=total, description=f"batch {size:>4}")

        result = calibrate(runner, sizes, reps=reps, warmup=warmup, seed=seed, progress=step,
                           cold_idle_s=cold_idle_ms / 1e3, cold_reps=cold_reps,
                           cold_after_s=cold_after_ms / 1e3)
    for size, why in result.infeasible.items():
        console.print(f"[yellow]batch size {size} infeasible:[/] {why}")
    if result.profile is None:
        raise UserError("no batch size could be measured (all infeasible or interrupted "
                         "before the first timed run)")
    profile = result.profile
    if load_reps > 0 and not result.interrupted:
        console.print(f"timing {load_reps} cold starts (build, weights, device, first forward)")
        load = measure_load(model, reps=load_reps, device=device, dtype=dtype,
                            threads=threads, params=parse_params(params))
        profile = dataclasses.replace(
            profile, load_samples_s=np.asarray(load["samples_s"]),
            meta={**profile.meta, "load": {k: v for k, v in load.items() if k != "samples_s"}})
        totals = np.asarray(load["samples_s"])
        console.print(f"cold start: median {np.median(totals):.3f} s, min {totals.min():.3f} s,"
                      f" max {totals.max():.3f} s over {load_reps}")
    result.profile = profile
    path = result.profile.save(out)
    report = write_report([result.profile], path.with_suffix(".html"))
    state = "[yellow]interrupted — partial profile[/]" if result.interrupted else "done"
    console.print(f"{state}: {path} and {report} in {result.elapsed_s:.1f} s")
    show(result.profile, console)
    return result.profile


def _ms(value: float) -> str:
    """Milliseconds to four significant figures (at least one decimal): fits the column."""
    v = abs(value)
    return f"{value:.{3 if v < 10 else 2 if v < 100 else 1 if v < 1000 else 0}f}"


def show(profile: LatencyProfile, console: Console, title: str | None = None) -> None:
    """Print a profile's per-size table (fits 80 columns; a cell that would not fits by
    wrapping, never by an ellipsis).
    """
    meta = profile.meta
    table = Table(title=title or f"{profile.name} — {meta.get('dtype')}, "
                  f"{meta.get('threads')} threads, torch {meta.get('torch_version')}"
                  f"{' — SYNTHETIC' if meta.get('synthetic') else ''}",
                  box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="times in ms; ±se%: standard error of the median; per item: "
                          "median / batch")
    for col in ("batch", "n", "median", "±se%", "p5", "p95", "p99", "CV", "per item",
                "items/s"):
        table.add_column(col, justify="right", overflow="fold")
    for row in profile_summary(profile):
        b = row["batch_size"]
        table.add_row(str(b), str(row["n"]), _ms(row["median_ms"]),
                      f"{row['se_median_pct']:.1f}", _ms(row["p5_ms"]), _ms(row["p95_ms"]),
                      _ms(row["p99_ms"]), f"{row['cv']:.3f}", _ms(row["median_ms"] / b),
                      f"{b / row['median_ms'] * 1e3:,.0f}")
    console.print(table)
    fit = meta.get("fit")
    if fit:
        console.print(f"fit: {json.dumps(fit)}")


def show_profile(ref: str, console: Console) -> None:
    """``servelab profile show``: a request-level profile, or an LLM step profile."""
    from calibration.profile import builtin_profiles
    from calibration.step_profile import builtin_step_profiles
    from calibration.step_show import is_step_profile, show_step_profile
    from sim.scenario.schema import builtin_scenarios

    name = ref.removeprefix("builtin:")
    known = [*builtin_profiles(), *builtin_step_profiles()]
    profiles = ", ".join(f"builtin:{n}" for n in known)
    if ref.startswith("builtin:") and name in builtin_scenarios():
        raise UserError(f"{ref} is a scenario, not a profile: `servelab simulate {ref}` runs "
                        f"it; profile show takes a profile: {profiles}")
    if ref.startswith("builtin:") and name not in known:
        raise UserError(f"profile show: unknown builtin profile {name!r}; available: "
                        f"{profiles}")
    if is_step_profile(ref):
        show_step_profile(ref, console)
        return
    show(load_profile(ref), console)


def compare_profiles(a: str, b: str, out: Path | None, console: Console) -> None:
    """``servelab profile compare``: medians side by side and their ratio."""
    pa, pb = load_profile(a), load_profile(b)
    table = Table(title=f"{pa.name} ({a}) vs {pb.name} ({b})")
    for col in ("batch", "A median ms", "B median ms", "B / A"):
        table.add_column(col, justify="right")
    for size in sorted(set(pa.batch_sizes) | set(pb.batch_sizes)):
        ma = pa.median_s(size) * 1e3 if size in pa.samples_s else None
        mb = pb.median_s(size) * 1e3 if size in pb.samples_s else None
        table.add_row(str(size), "–" if ma is None else f"{ma:.3f}",
                      "–" if mb is None else f"{mb:.3f}",
                      f"{mb / ma:.3f}" if ma and mb else "–")
    console.print(table)
    if out is not None:
        write_report([pa, pb], out, labels=[f"A: {pa.name}", f"B: {pb.name}"])
        console.print(f"overlay: {out}")
