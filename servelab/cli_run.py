"""``servelab simulate``, ``demo``, ``init``, ``compile`` and ``scenarios``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from calibration.profile import builtin_profiles
from servelab.cli_app import (
    TABLE_FORMATS,
    USER_ERRORS,
    YES_HELP,
    _title,
    app,
    console,
    err_console,
    fail,
    sim_load,
    warn_stability,
)
from sim.scenario.schema import builtin_scenarios
from sim.serving.core import InvariantError, PolicyError


@app.command()
def simulate(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML path or builtin:NAME.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory to write.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a field, e.g. --set policy.max_batch_size=16 (repeatable)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No table.")] = False,
    records: Annotated[str | None, typer.Option(
        "--records", help="full: keep the request, batch and queue tables; summary: keep "
        "only what the summary needs (same numbers, little memory, no tables written); "
        "sketch: as summary, with the latency samples as a fixed-size sketch (percentiles "
        "within a relative 3.05e-5 or 1 ns). Default: the scenario's records (full).")
    ] = None,
    format_: Annotated[str, typer.Option(
        "--format", help="Table files in the run directory: parquet (default) or csv.")
    ] = "parquet",
    yes: Annotated[bool, typer.Option("--yes", "-y", help=YES_HELP)] = False,
) -> None:
    """Simulate SCENARIO and print a summary; with --out, write the run directory."""
    from sim.experiments.preflight import check, estimate_run
    from sim.llm import StepInvariantError, run_any

    if format_ not in TABLE_FORMATS:
        fail(f"--format {format_!r}: allowed: {', '.join(TABLE_FORMATS)}")
    try:
        loaded = sim_load(scenario, set_)
        if not yes:
            check(estimate_run(loaded, records), "run")
        result = run_any(loaded, records=records)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    except (PolicyError, InvariantError, StepInvariantError) as exc:
        fail(f"internal check failed (please report): {exc}", code=3)
        return
    if out is not None:
        result.write(out)
        if format_ == "csv":
            from servelab.formats import tables_to_csv

            tables_to_csv(out)
    warn_stability(result.summary)
    if not quiet:
        console.print(_title(result.scenario.name, result.meta))
        from servelab.report import summary_table

        console.print(summary_table(result.summary, title=f"{result.scenario.name} (simulated)"))
        if out is not None:
            console.print(f"run directory: {out}")


@app.command()
def demo(out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Run directory to write.")] = None) -> None:
    """Simulate the shipped dynamic-batching demo scenario and print its summary."""
    simulate("builtin:dyn-demo", out=out, set_=None, quiet=False, records=None,
             format_="parquet", yes=False)


@app.command("init")
def init_cmd(
    file: Annotated[Path | None, typer.Argument(
        help="Scenario file to write (default: my.yaml, my-llm.yaml or my-autoscaling.yaml).")
    ] = None,
    kind: Annotated[str, typer.Option(
        help="request (dynamic batching on a measured profile) | llm (continuous batching "
             "on a measured step profile) | autoscaling (Ray Serve's target policy under a "
             "rising and falling load)")] = "request",
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")
                     ] = False,
) -> None:
    """Write a commented starter scenario that runs as is: servelab simulate FILE."""
    from servelab.starter import write_starter

    try:
        path = write_starter(kind, file, force=force)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(f"wrote {path}; next: servelab simulate {path}")


@app.command("compile")
def compile_cmd(
    clean: Annotated[bool, typer.Option(
        "--clean", help="Remove the compiled build: plain Python again.")] = False,
    status: Annotated[bool, typer.Option(
        "--status", help="Say whether a build is present and current; change nothing.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show mypyc's output.")] = False,
) -> None:
    """Compile the simulator's hot path with mypyc (optional: needs mypy and a C compiler).

    The same sources run compiled, with the same output for the same seed; without a build,
    after --clean, or when a source changed since the build, everything runs as plain Python.
    """
    from sim import native

    if status:
        present, stale = native.extension_paths(), native.stale_modules()
        if not present:
            console.print("compiled build: none (plain Python)")
        elif stale:
            console.print(f"compiled build: stale, not used (changed: {', '.join(stale)}); "
                          "run `servelab compile` again")
        else:
            console.print(f"compiled build: current, {len(native.MODULES)} modules "
                          f"({', '.join(native.MODULES)})")
        return
    if clean:
        removed = native.clean()
        console.print(f"removed {len(removed)} compiled files: plain Python" if removed
                      else "no compiled build to remove")
        return
    console.print(f"compiling {len(native.MODULES)} modules with mypyc (a minute or two)...")
    try:
        built = native.build(verbose=verbose)
    except native.BuildError as exc:
        message = str(exc)
        head, _, detail = message.partition("\n")
        if detail:
            err_console.print(escape(detail), highlight=False)
        fail(head)
    console.print(f"compiled {len(built)} files; `servelab compile --clean` removes them")


@app.command()
def scenarios() -> None:
    """List the shipped scenarios and profiles (usable as builtin:NAME)."""
    console.print("scenarios: " + ", ".join(f"builtin:{n}" for n in builtin_scenarios()))
    console.print("profiles:  " + ", ".join(f"builtin:{n}" for n in builtin_profiles()))
    from calibration.step_profile import builtin_step_profiles

    console.print("LLM step profiles: " + ", ".join(f"builtin:{n}"
                                                    for n in builtin_step_profiles()))

