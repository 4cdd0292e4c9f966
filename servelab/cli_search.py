"""``servelab sweep``, ``capacity`` and ``replicas``: experiments over many simulations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servelab.cli_app import (
    USER_ERRORS,
    YES_HELP,
    _progress_bar,
    _step_printer,
    app,
    console,
    err_console,
    fail,
    sim_load,
)


@app.command("sweep")
def sweep_cmd(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML path or builtin:NAME.")],
    grid: Annotated[list[str], typer.Option(
        help="KEY=V1,V2,... or KEY=START:STOP:STEP (repeatable).")],
    seeds: Annotated[int, typer.Option(help="Seeds per grid point (0..n-1).")] = 5,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path(
        "runs/sweep"),
    workers: Annotated[int | None, typer.Option(help="Local processes (default: cores).")] = None,
    dask: Annotated[str | None, typer.Option(
        help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (or DASK_SCHEDULER_ADDRESS).")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a base field (repeatable)."),
    ] = None,
    records: Annotated[str, typer.Option(
        "--records", help="summary (default): each run keeps only what its summary needs; "
        "full: each keeps its tables while it runs (same numbers, more memory); sketch: "
        "summary with fixed-size latency sketches (percentiles within a relative 3.05e-5).")
    ] = "summary",
    yes: Annotated[bool, typer.Option("--yes", "-y", help=YES_HELP)] = False,
) -> None:
    """Simulate every grid point with every seed; results.parquet, CSV and an HTML report.

    Finished runs are appended to OUT/runs.jsonl as they complete: Ctrl-C keeps them and
    re-running with the same OUT skips them.
    """
    from servelab.sweep_report import write_sweep_report
    from sim.experiments import parse_grid, sweep

    try:
        base = sim_load(scenario, set_)
        grid_dict = parse_grid(grid)
        bar, task = _progress_bar("runs")
        shown: list[bool] = []

        def progress(done: int, total: int) -> None:
            if not shown:  # the bar appears with the first run, after every check passed
                bar.start()  # type: ignore[attr-defined]
                shown.append(True)
            bar.update(task, completed=done, total=total)  # type: ignore[attr-defined]

        try:
            frame = sweep(base, grid_dict, seeds, workers=workers, dask=dask, out_dir=out,
                          progress=progress, records=records, yes=yes)
        finally:
            if shown:
                bar.stop()  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        fail(f"interrupted; finished runs are kept in {out / 'runs.jsonl'} (re-run to resume)",
             code=130)
        return
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    frame.to_parquet(out / "results.parquet", index=False)
    frame.to_csv(out / "results.csv", index=False)
    write_sweep_report(frame, list(grid_dict), out / "report.html")
    failed = int((frame["error"] != "").sum())
    console.print(f"{len(frame)} runs ({failed} failed): {out / 'results.parquet'}, "
                  f"{out / 'report.html'}")
    from sim.experiments.capacity import unstable_runs

    unstable = unstable_runs(frame)
    if unstable:
        err_console.print(f"[bold yellow]warning:[/] {unstable} of {len(frame)} runs are "
                          "unstable (offered load above capacity or a growing queue): their "
                          "latency percentiles only say how long the run lasted "
                          "(column stability.verdict)", highlight=False, soft_wrap=True)
    if failed:
        first = frame.loc[frame["error"] != "", "error"].iloc[0]
        if failed == len(frame):  # nothing measured: not a sweep that worked
            fail(f"every run failed; the first: {first}", code=1)
        console.print(f"[yellow]first failure:[/] {first}")


@app.command("capacity")
def capacity_cmd(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML path or builtin:NAME.")],
    slo: Annotated[list[str], typer.Option(
        help="Objective KEY=VALUE: p50_ms, p95_ms, p99_ms, mean_ms, error_rate, goodput_frac "
             "(repeatable; all must hold).")],
    over: Annotated[str, typer.Option(help="The load knob to search.")] = "workload.rate_rps",
    seeds: Annotated[int, typer.Option(help="Replications per candidate.")] = 3,
    tol: Annotated[float, typer.Option(help="Relative width of the final bracket.")] = 0.02,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Directory for capacity.json and runs.parquet.")] = None,
    workers: Annotated[int | None, typer.Option(
        help="Local processes per candidate (default: cores).")] = None,
    dask: Annotated[str | None, typer.Option(
        help="Dask scheduler address, e.g. tcp://10.0.0.5:8786.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a base field, e.g. --set policy.max_batch_size=16 "
        "(repeatable).")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help=YES_HELP)] = False,
) -> None:
    """The highest load at which SCENARIO holds the SLO (bracketing + bisection)."""
    from sim.experiments.capacity import capacity, check_objectives
    from sim.metrics.rundir import write_json

    try:
        base = sim_load(scenario, set_)
        check_objectives(base, slo)  # a bad objective: one error line, before progress
        header = (f"searching {over} for {' '.join(slo)}: {seeds} runs per candidate; "
                  "doubling or halving until bracketed, then bisecting")
        result = capacity(base, slo, over=over, seeds=seeds, tol=tol, workers=workers,
                          dask=dask, on_step=_step_printer(header), yes=yes)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    lo, hi = result.interval
    console.print(f"max {over} holding {result.slo}: [bold]{result.max_value:.4g}[/] "
                  f"(met at {lo:.4g}, failed at {hi:.4g}; {seeds} seeds per candidate, "
                  f"{len(result.evaluations)} candidates)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "capacity.json", result.to_dict())
        result.runs.to_parquet(out / "runs.parquet", index=False)
        console.print(f"written: {out / 'capacity.json'}")


@app.command("replicas")
def replicas_cmd(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML path or builtin:NAME.")],
    target_rps: Annotated[float, typer.Option(help="The load to hold (requests per second).")],
    slo: Annotated[list[str], typer.Option(
        help="Objective KEY=VALUE, as for capacity: p99_ms, error_rate, ... (repeatable; all "
             "must hold).")],
    seeds: Annotated[int, typer.Option(help="Replications per replica count.")] = 3,
    max_replicas: Annotated[int, typer.Option(
        min=1, help="Give up above this many replicas.")] = 256,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Directory for replicas.json and runs.parquet.")] = None,
    workers: Annotated[int | None, typer.Option(
        help="Local processes per replica count (default: cores).")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a base field (repeatable).")] = None,
) -> None:
    """The fewest replicas that hold the SLO at TARGET_RPS, with cost per million requests."""
    from sim.experiments.capacity import check_objectives, replicas_needed
    from sim.metrics.rundir import write_json

    try:
        base = sim_load(scenario, set_)
        check_objectives(base, slo)  # a bad objective: one error line, before progress
        if not target_rps > 0:
            fail(f"--target-rps {target_rps:g}: must be > 0")
        console.print(f"[dim]replica counts for {' '.join(slo)} at {target_rps:g} req/s: "
                      f"{seeds} runs per count; doubling from 1 until it holds, then "
                      "bisecting[/]", soft_wrap=True)
        answer = replicas_needed(base, target_rps, slo, seeds=seeds,
                                 max_replicas=max_replicas, workers=workers,
                                 on_step=_step_printer())
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    cost = answer["cost_per_million_usd"]
    console.print(f"[bold]{answer['replicas']}[/] replicas hold {answer['slo']} at "
                  f"{target_rps:g} req/s (P99 "
                  f"{answer.get('latency_ms.p99', answer.get('e2e_ms.p99')):.1f} ms"
                  + (f", {cost:.2f} USD per million requests" if cost else "") + ")")
    console.print(f"tried: {answer['tried']}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        runs = answer.pop("runs")
        write_json(out / "replicas.json", answer)
        runs.to_parquet(out / "runs.parquet", index=False)
        console.print(f"written: {out / 'replicas.json'}")
    else:
        answer.pop("runs", None)

