"""The ``servelab`` command line."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from calibration.profile import builtin_profiles
from servelab.endpoint_cli import register as register_endpoint
from servelab.roofline_cli import register as register_roofline
from sim.errors import UserError
from sim.scenario.llm import LlmScenario
from sim.scenario.schema import Scenario, builtin_scenarios
from sim.serving.core import InvariantError, PolicyError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="servelab: simulate and measure model-serving policies.")
console = Console()
err_console = Console(stderr=True, emoji=False)

# What a user can fix: bad input (every such error is a UserError naming the field) and files
# that cannot be read or written. Anything else is a bug and is reported as one (exit 3).
USER_ERRORS = (UserError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
               PermissionError, FileExistsError)


def _version(value: bool) -> None:
    if value:
        from servelab import __version__

        console.print(f"servelab {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print servelab's version and exit.")] = False) -> None:
    """servelab: simulate and measure model-serving policies."""


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error and exit non-zero (no traceback)."""
    text = " ".join(str(message).split())  # one line, whatever the message held
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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


TABLE_FORMATS = ("parquet", "csv")


def warn_stability(summary: dict[str, object]) -> None:
    """Print the stability verdict as a warning line when the run is not stable (a note
    when the device is busy at low load: that is not saturation).
    """
    from sim.metrics.stability import stability_note

    note = stability_note(summary)
    if note:
        level, text = note
        label = "[bold yellow]warning:[/]" if level == "warning" else "[cyan]note:[/]"
        err_console.print(f"{label} {text}", highlight=False, soft_wrap=True)


DRAIN_HELP = ("Stop draining this long after the last arrival (default: the window's length); "
              "what is left counts as in flight (censored).")
MAX_WALL_HELP = "Refuse when the predicted wall time exceeds this (seconds)."
FORCE_HELP = "Run live even when the simulator predicts an unstable or too long run."
MODEL_HELP = ("The model to run live (the scenario's model: name): minilm | mlp | cnn | "
              "module.path:factory (imported from the current directory) | hf:DIR_OR_CONFIG. "
              "Default: the model recorded in the scenario's profile.")


def _with_model(scenario: str, set_: list[str] | None, model: str | None) -> list[str] | None:
    """``--model X`` is ``--set model.name=X`` (request-level scenarios: an LLM scenario's
    decoder comes from its step profile or its model.params).
    """
    if model is None:
        return set_
    if _is_llm(scenario):
        fail("--model: an LLM scenario runs the decoder its step profile measured; set "
             "model.params in the scenario (e.g. --set model.params.layers=8) instead")
    return [*(set_ or []), f"model.name={model}"]


YES_HELP = ("Run even when the pre-flight estimate exceeds the budget (4 GiB of memory, "
            "10 minutes); without it such work is refused with the estimate.")


def _title(name: str, meta: dict[str, object]) -> str:
    wall = meta.get("wall_s")
    rate = meta.get("requests_per_wall_s")
    if isinstance(wall, float) and isinstance(rate, float):
        return f"[dim]{name}: simulated in {wall:.2f} s ({rate:,.0f} requests/s)[/]"
    return name


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


@app.command()
def calibrate(
    model: Annotated[str | None, typer.Option(
        help="minilm (default) | mlp | cnn | module.path:factory (imported from the current "
             "directory) | hf:DIR_OR_CONFIG (a Hugging Face encoder or decoder), or llm (a "
             "decoder's step profile; --config config.json, or --param shape=small|1b|8b and "
             "its sizes); with --endpoint: the served model's name (default: the first the "
             "server lists)")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    dtype: Annotated[str, typer.Option(help="fp32 | fp16 | bf16 (fp16 needs CUDA)")] = "fp32",
    threads: Annotated[int | None, typer.Option(
        help="CPU threads for torch (default: torch's choice). Calibrate with the thread "
             "count the live executor will use.")] = None,
    batch_sizes: Annotated[str, typer.Option(
        help="1-64 (dense to 16, then powers of two), 1-64:8, or 1,2,4,8")] = "1-64",
    reps: Annotated[int, typer.Option(help="Timed runs per batch size.")] = 30,
    warmup: Annotated[int, typer.Option(help="Untimed runs per batch size first.")] = 3,
    seed: Annotated[int, typer.Option(help="Seeds payloads and the shuffled order.")] = 0,
    compile_: Annotated[bool, typer.Option("--compile", help="torch.compile the model.")] = False,
    param: Annotated[list[str] | None, typer.Option(
        help="Runner parameter KEY=VALUE, e.g. --param width=512 (repeatable).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile JSON to write.")] = Path(
        "profiles/profile.json"),
    cold_idle_ms: Annotated[float, typer.Option(
        help="Also measure 'cold' runs, each after this idle gap (0: off).")] = 0.0,
    cold_reps: Annotated[int | None, typer.Option(
        help="Cold runs per batch size (default: half of --reps).")] = None,
    cold_after_ms: Annotated[float, typer.Option(
        help="The simulator treats a batch as cold after this much replica idle time.")] = 10.0,
    load_reps: Annotated[int, typer.Option(
        min=0, help="Also time this many cold starts (build the runner, load weights, move to "
        "the device, first forward): autoscaled scenarios draw new replicas' start-up from "
        "them.")] = 0,
    endpoint: Annotated[str | None, typer.Option(
        help="Calibrate a running server instead: an LLM server behind an OpenAI-compatible "
        "endpoint (its step model and per-request overheads), or with --api kserve-v2|"
        "http-json a request-level server (bursts of exactly N simultaneous requests over "
        "--batch-sizes).")] = None,
    api: Annotated[str | None, typer.Option(
        help="--endpoint's protocol: openai-completions (default: an LLM server) | kserve-v2 "
        "| http-json (request-level servers)")] = None,
    endpoint_model: Annotated[str | None, typer.Option(
        help="--endpoint with --api kserve-v2: the KServe v2 model name.")] = None,
    window_ms: Annotated[float | None, typer.Option(
        help="--endpoint: the server's batching window (Ray Serve batch_wait_timeout_s), "
        "subtracted from bursts below --server-max-batch-size.")] = None,
    server_max_batch_size: Annotated[int | None, typer.Option(
        help="--endpoint: the server's largest batch (Ray Serve max_batch_size).")] = None,
    scenario: Annotated[str | None, typer.Option(
        help="--endpoint: take the request payload from this scenario's payload: section.")]
    = None,
    max_num_seqs: Annotated[int | None, typer.Option(
        help="With an LLM --endpoint: the server's max_num_seqs (vLLM does not expose it).")
    ] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        help="With an LLM --endpoint: the server's max_num_batched_tokens.")] = None,
    config: Annotated[Path | None, typer.Option(
        help="With --model llm: a Hugging Face config.json (Llama, Qwen2, Mistral...) or a "
             "directory holding one; the decoder takes its layers, hidden size, heads, KV "
             "heads, MLP width and vocabulary (random weights).")] = None,
    budget_s: Annotated[float | None, typer.Option(
        help="With --model llm: refuse a calibration estimated to take longer than "
        "this (seconds; default 600) unless --yes. With an LLM --endpoint: the most seconds "
        "probing may take (default 180).")] = None,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Run even when the pre-flight estimate exceeds the budget (4 GiB, "
        "10 minutes), or (--model llm) the time estimate exceeds --budget-s.")] = False,
) -> None:
    """Measure a model's batched latency curve; write the profile JSON and an HTML report.

    Ctrl-C writes what was measured so far.

    With --model llm: measure a Llama-architecture decoder's step time over a grid of step
    compositions and its error on held-out steps of the Azure trace; write a step profile.
    """
    from servelab.calibrate import parse_params, run_calibration

    if endpoint is not None and api in ("kserve-v2", "http-json"):
        from servelab.request_endpoint_cli import calibrate_endpoint_cmd as calibrate_requests

        calibrate_requests(endpoint, api, endpoint_model, batch_sizes, reps, seed, out,
                           window_ms, server_max_batch_size, scenario)
        return
    if endpoint is not None:
        if api not in (None, "openai-completions"):
            fail(f"--api {api!r}: allowed: openai-completions (an LLM server), kserve-v2, "
                 "http-json (request-level servers)")
        from servelab.endpoint_cli import calibrate_endpoint_cmd

        calibrate_endpoint_cmd(endpoint, model, out, 180.0 if budget_s is None else budget_s,
                               reps, max_num_seqs, max_num_batched_tokens, seed)
        return
    model = model or "minilm"
    if config is not None and model != "llm":
        fail("--config: only with --model llm (a Hugging Face encoder or decoder for "
             "request-level serving: --model hf:DIR_OR_CONFIG)")
    if model == "llm":
        from servelab.calibrate_llm import run_step_calibration

        try:
            run_step_calibration(device=device, dtype=dtype, threads=threads, reps=reps,
                                 warmup=warmup, seed=seed, params=parse_params(param or []),
                                 out=out, console=console, config=config,
                                 budget_s=600.0 if budget_s is None else budget_s, yes=yes)
        except USER_ERRORS as exc:
            fail(str(exc))
        return
    try:
        run_calibration(model=model, device=device, dtype=dtype, threads=threads,
                        batch_sizes=batch_sizes, reps=reps, warmup=warmup, seed=seed,
                        compile=compile_, params=param or [], out=out, console=console,
                        cold_idle_ms=cold_idle_ms, cold_reps=cold_reps,
                        cold_after_ms=cold_after_ms, load_reps=load_reps,
                        before_run=None if yes else _calibration_budget(reps + warmup))
    except USER_ERRORS as exc:
        fail(str(exc))


def _calibration_budget(runs_per_size: int) -> Callable[[object, list[int]], None]:
    """The pre-flight check of a calibration (one timed batch, then the estimate)."""
    from sim.experiments.preflight import check, estimate_calibration

    def before_run(runner: object, sizes: list[int]) -> None:
        check(estimate_calibration(runner, sizes, runs_per_size), "calibration")
    return before_run


@app.command("live")
def live_cmd(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML path or builtin:NAME.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory to write.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a field (repeatable)."),
    ] = None,
    batch_timeout_ms: Annotated[float | None, typer.Option(
        help="Fail a batch's requests when its model call takes longer (ms, > 0).")] = None,
    on_interrupt: Annotated[str, typer.Option(
        help="Ctrl-C or SIGTERM: drain (finish queued work) or abandon; a second signal "
             "ends the run at once. What was measured is written either way.")] = "drain",
    drain_timeout_s: Annotated[float | None, typer.Option(help=DRAIN_HELP)] = None,
    max_wall_s: Annotated[float, typer.Option(help=MAX_WALL_HELP)] = 600.0,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None,
) -> None:
    """Run SCENARIO in real time against the real model (same policies and schedule as sim)."""
    from executor.live_requests import live

    if on_interrupt not in ("drain", "abandon"):
        fail(f"--on-interrupt {on_interrupt!r}: allowed: drain, abandon")
    if batch_timeout_ms is not None and not (math.isfinite(batch_timeout_ms)
                                             and batch_timeout_ms > 0):
        fail(f"--batch-timeout-ms {batch_timeout_ms:g}: must be a finite number of "
             "milliseconds > 0 (leave it out for no batch timeout)")
    set_ = _with_model(scenario, set_, model)
    if _is_llm(scenario):
        if batch_timeout_ms is not None:
            fail("--batch-timeout-ms: not supported for LLM scenarios (a step serves many "
                 "requests at once); leave it out")
        _live_llm(scenario, out, set_, on_interrupt, drain_timeout_s, max_wall_s, force)
        return
    try:
        result = live(scenario, overrides=set_ or None, handle_sigint=True,
                      stop_mode=on_interrupt, drain_timeout_s=drain_timeout_s,
                      max_wall_s=max_wall_s, force=force,
                      batch_timeout_s=None if batch_timeout_ms is None else batch_timeout_ms / 1e3)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    except (PolicyError, InvariantError) as exc:
        fail(f"internal check failed (please report): {exc}", code=3)
        return
    if out is not None:
        result.write(out)
    warn_stability(result.summary)
    fatal = result.meta.get("fatal_error")
    if fatal:
        where = f"; what was recorded is in {out}" if out is not None else ""
        fail(f"the live run stopped: {fatal}{where}", code=1)
    for note in result.meta.get("calibration_warnings", []):
        err_console.print(f"[bold yellow]calibration mismatch:[/] {note}")
    from servelab.report import summary_table

    by = result.meta.get("stopped_by")
    early = (f", stopped early by {by}" if by else ", stopped early") if result.meta[
        "stopped_early"] else ""
    title = f"{result.scenario.name} (live{early})"
    console.print(summary_table(result.summary, title=title))
    health = result.summary["executor_health"]
    console.print("executor health (ms p50/p99): " + ", ".join(
        f"{k} {v['p50']:.3f}/{v['p99']:.3f}" for k, v in health.items() if v["count"]))
    if out is not None:
        console.print(f"run directory: {out}")


def _is_llm(scenario: str) -> bool:
    """Whether SCENARIO is an LLM scenario (a bad reference ends in one error line)."""
    from sim.llm import is_llm_source

    try:
        return is_llm_source(scenario)
    except USER_ERRORS as exc:
        fail(str(exc))
        return False


def _live_llm(scenario: str, out: Path | None, set_: list[str] | None, on_interrupt: str,
              drain_timeout_s: float | None, max_wall_s: float, force: bool) -> None:
    """``servelab live`` for an LLM scenario: the scheduler objects on the real decoder."""
    from executor.live_llm import live_llm
    from sim.llm import StepInvariantError

    try:
        result = live_llm(scenario, overrides=set_ or None, handle_sigint=True,
                          stop_mode=on_interrupt, drain_timeout_s=drain_timeout_s,
                          max_wall_s=max_wall_s, force=force)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    except StepInvariantError as exc:
        fail(f"internal check failed (please report): {exc}", code=3)
        return
    if out is not None:
        result.write(out)
    warn_stability(result.summary)
    for error in result.meta.get("step_errors", [])[:3]:
        err_console.print(f"[bold yellow]failed step:[/] {error}")
    from servelab.report import summary_table

    by = result.meta.get("stopped_by")
    early = (f", stopped early by {by}" if by else ", stopped early") if result.meta[
        "stopped_early"] else ""
    console.print(summary_table(result.summary, title=f"{result.scenario.name} (live{early})"))
    if out is not None:
        console.print(f"run directory: {out}")


@app.command("compare")
def compare_cmd(
    scenario: Annotated[str, typer.Argument(help="Scenario YAML path or builtin:NAME.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path(
        "runs/compare"),
    repeats: Annotated[int, typer.Option(help="Live runs (their spread is the yardstick).")] = 3,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a field (repeatable)."),
    ] = None,
    sweep_: Annotated[str | None, typer.Option(
        "--sweep", help="Comma-separated target loads, e.g. 0.3,0.6,0.8,0.9: device "
        "utilisation; for LLM scenarios offered rate over capacity.")] = None,
    probe: Annotated[str, typer.Option(
        "--probe", help="full: re-measure the device's speed and the dispatch overhead around "
        "each live run and predict on the profile refreshed by them (the stored profile's "
        "errors are kept too); overhead: the overhead only; off: the stored profile."),
    ] = "full",
    probe_budget_s: Annotated[float, typer.Option(
        "--probe-budget-s", min=0.1, help="Seconds each probe may take.")] = 3.0,
    drain_timeout_s: Annotated[float | None, typer.Option(help=DRAIN_HELP)] = None,
    max_wall_s: Annotated[float, typer.Option(
        help="Refuse when the predicted wall time of all live runs exceeds this (seconds)."),
    ] = 600.0,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="Measure this OpenAI-compatible server with bench instead of running live.")]
    = None,
    profile: Annotated[Path | None, typer.Option(
        help="With --endpoint: the step profile calibrate --endpoint wrote (its overheads "
        "and server knobs are applied).")] = None,
) -> None:
    """Simulate SCENARIO, run it live REPEATS times, and compare (table, JSON, HTML)."""
    from executor.compare import compare, sweep

    set_ = _with_model(scenario, set_, model)
    rhos: list[float] = []
    if sweep_:
        try:
            rhos = [float(x) for x in sweep_.split(",") if x.strip()]
        except ValueError:
            fail(f"--sweep {sweep_!r}: give comma-separated numbers, e.g. 0.3,0.6,0.8,0.9")
            return
    if endpoint is not None:
        from servelab.endpoint_cli import compare_endpoint_cmd

        if not _is_llm(scenario):
            fail("--endpoint: compare against a server takes LLM scenarios so far; for a "
                 "request-level server run servelab bench and servelab simulate on the "
                 "calibrated profile (see README, Measure a real server)")

        compare_endpoint_cmd(scenario, endpoint, profile, out, repeats, set_, probe,
                             drain_timeout_s, rhos, _compare_table)
        return
    if _is_llm(scenario):
        _compare_llm(scenario, out, repeats, set_, probe, drain_timeout_s, max_wall_s, force,
                     rhos)
        return

    try:
        if sweep_:
            frame = sweep(scenario, out, rhos, repeats=repeats, overrides=set_ or None,
                          progress=lambda m: console.print(f"[dim]{m}[/]"), probe_mode=probe,
                          probe_budget_s=probe_budget_s, drain_timeout_s=drain_timeout_s,
                          max_wall_s=max_wall_s, force=force)
            console.print(_fidelity_table(frame, REQUEST_FIDELITY_KEYS))
            console.print(f"fidelity curve: {out / 'fidelity.csv'}")
            return
        data = compare(scenario, out, repeats=repeats, overrides=set_ or None,
                       progress=lambda m: console.print(f"[dim]{m}[/]"), probe_mode=probe,
                       probe_budget_s=probe_budget_s, drain_timeout_s=drain_timeout_s,
                       max_wall_s=max_wall_s, force=force)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    except (PolicyError, InvariantError) as exc:
        fail(f"internal check failed (please report): {exc}", code=3)
        return
    for verdict_line in data.get("stability_warnings", []):
        err_console.print(f"[bold yellow]warning:[/] {verdict_line}", highlight=False,
                          soft_wrap=True)
    console.print(_compare_table(data))
    console.print(f"report: {out / 'report.html'}")


def _compare_llm(scenario: str, out: Path, repeats: int, set_: list[str] | None, probe: str,
                 drain_timeout_s: float | None, max_wall_s: float, force: bool,
                 rhos: list[float]) -> None:
    """``servelab compare`` (and ``--sweep``) for an LLM scenario."""
    from executor.compare_llm import compare_llm, sweep_llm

    try:
        if rhos:
            frame = sweep_llm(scenario, out, rhos, repeats=repeats, overrides=set_ or None,
                              probe_mode=probe, drain_timeout_s=drain_timeout_s,
                              max_wall_s=max_wall_s, force=force,
                              progress=lambda m: console.print(f"[dim]{m}[/]"))
            console.print(_fidelity_table(frame, LLM_FIDELITY_KEYS))
            console.print(f"capacity {frame['capacity_rps'].iloc[0]:.3g} req/s on the probed "
                          f"profile ({frame['capacity_stored_rps'].iloc[0]:.3g} on the stored "
                          "one); rho = offered rate / capacity")
            console.print(f"fidelity curve: {out / 'fidelity.csv'}")
            return
        data = compare_llm(scenario, out, repeats=repeats, overrides=set_ or None,
                           probe_mode=probe, drain_timeout_s=drain_timeout_s,
                           max_wall_s=max_wall_s, force=force,
                           progress=lambda m: console.print(f"[dim]{m}[/]"))
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(_compare_table(data))
    for p in data["probes"]:
        console.print(f"probe: prefill ×{p['prefill_scale']:.3f}, decode "
                      f"×{p['decode_scale']:.3f} against the stored profile "
                      f"(drift {p['drift']:.1%})")
    console.print(f"comparison: {out / 'compare.json'}")


def _compare_table(data: dict[str, object]) -> object:
    from rich.table import Table

    rows = data["rows"]
    assert isinstance(rows, list)
    probed = bool(data.get("probed"))
    table = Table(title=f"sim vs live — rho {rows[0]['rho']:.2f}, {data['repeats']} live runs"
                  + (" (sim on the probed profile)" if probed else ""))
    cols = ["metric", "sim", "live (median)", "error", "live min–max"]
    for col in cols + (["stored-profile error"] if probed else []):
        table.add_column(col, justify="right")
    for r in rows:
        cells = [r["label"], f"{r['sim']:.4g}", f"{r['live_median']:.4g}",
                 f"{100 * r['rel_error']:+.1f}%", f"{r['live_min']:.4g}–{r['live_max']:.4g}"]
        if probed:
            cells.append(f"{100 * r['rel_error_stored']:+.1f}%")
        table.add_row(*cells)
    return table


REQUEST_FIDELITY_KEYS = ("throughput_rps", "latency_ms.p50", "latency_ms.p99",
                         "mean_batch_size")
LLM_FIDELITY_KEYS = ("throughput_rps", "output_tokens_per_s", "ttft_ms.p50", "ttft_ms.p99",
                     "tpot_ms.p50", "tpot_ms.p99")


def _fidelity_table(frame: object, keys: Sequence[str]) -> object:
    import pandas as pd
    from rich.table import Table

    assert isinstance(frame, pd.DataFrame)
    table = Table(title="fidelity vs load (relative error sim vs live median)")
    for col in ("target rho", "rate req/s", *keys):
        table.add_column(col, justify="right")
    for rho, g in frame.groupby("target_rho"):
        errs = {r["metric"]: r["rel_error"] for _, r in g.iterrows()}
        table.add_row(f"{rho:g}", f"{g['rate_rps'].iloc[0]:.1f}",
                      *[f"{100 * errs.get(k, float('nan')):+.1f}%" for k in keys])
    return table


def _progress_bar(total_label: str) -> tuple[object, object]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn(total_label), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), console=console)
    return bar, bar.add_task(total_label, total=None)


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
        console.print(f"[yellow]first failure:[/] {first}")


def sim_load(scenario: str, overrides: list[str] | None) -> Scenario | LlmScenario:
    """Load and validate a scenario (request-level or LLM) for the experiment commands."""
    from sim.llm import load_any

    return load_any(scenario, overrides or None)


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


def _step_printer(header: str | None = None) -> Callable[[Any], None]:
    """A progress line per search candidate: its value, the verdict, and an honest ETA
    (mean time per candidate so far × the candidates left, once the answer is bracketed).
    ``header`` is printed before the first line (once the search's arguments were accepted).
    """
    import time

    start = time.perf_counter()
    pending = [header] if header else []

    def show(step: Any) -> None:
        while pending:
            console.print(f"[dim]{pending.pop()}[/]", highlight=False, soft_wrap=True)
        elapsed = time.perf_counter() - start
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in step.values.items())
        if step.left is None:
            todo = "bracketing"
        elif step.left == 0:
            todo = "done"
        else:
            todo = (f"at most {step.left} more, about "
                    f"{elapsed / step.done * step.left:.0f} s left")
        console.print(f"[dim]candidate {step.done}: {step.knob}={step.value:.4g} "
                      f"{'met' if step.met else 'missed'} ({metrics}); {elapsed:.0f} s so "
                      f"far, {todo}[/]", highlight=False, soft_wrap=True)

    return show


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


@app.command("dashboard")
def dashboard_cmd(
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 8501,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Start the Streamlit dashboard (no browser is opened when there is no display)."""
    import os
    from importlib import resources
    from importlib.util import find_spec

    from servelab.dashboard_proc import run_server

    if find_spec("streamlit") is None:
        fail("the dashboard needs streamlit: pip install 'servelab[dashboard]'")
    from dashboard.i18n import THEME_FONT

    app_path = str(resources.files("dashboard") / "app.py")
    headless = sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    cmd = [sys.executable, "-m", "streamlit", "run", app_path, "--server.port", str(port),
           "--server.address", address, "--server.headless", str(headless).lower(),
           "--browser.gatherUsageStats", "false",
           # the bundled CJK font: served from dashboard/static, used after Source Sans
           "--server.enableStaticServing", "true", "--theme.font", THEME_FONT]
    console.print(f"servelab dashboard on http://{address}:{port} (Ctrl-C to stop)")
    raise typer.Exit(run_server(cmd))


trace_app = typer.Typer(no_args_is_help=True, help="Inspect hash-block traces.")
app.add_typer(trace_app, name="trace")


@trace_app.command("stats")
def trace_stats_cmd(
    file: Annotated[str, typer.Argument(help="Bailian/Mooncake .jsonl, a CSV with hash_ids, "
                                             "or builtin:NAME.")],
    cache_blocks: Annotated[list[int] | None, typer.Option(
        help="LRU cache size in blocks of the trace's block size (repeatable).")] = None,
    block_size: Annotated[int | None, typer.Option(
        help="Tokens per hash id (default: 16 Bailian, 512 Mooncake; required for CSV).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto | bailian | mooncake | csv")
                   ] = "auto",
) -> None:
    """Requests, rate, length percentiles and the token hit rate of an infinite cache and of
    LRU caches of the given sizes (timing-free upper bounds).
    """
    from sim.scenario.hash_trace import read_hash_trace
    from sim.scenario.trace_stats import format_stats, trace_stats

    if block_size is not None and block_size < 1:
        fail(f"--block-size: must be >= 1, got {block_size}")
    if any(b < 0 for b in cache_blocks or []):
        fail("--cache-blocks: must be >= 0")
    try:
        stats = trace_stats(read_hash_trace(file, fmt, block_size), cache_blocks)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    for line in format_stats(stats):
        console.print(line, highlight=False)


profile_app = typer.Typer(no_args_is_help=True, help="Inspect latency profiles.")
app.add_typer(profile_app, name="profile")


@profile_app.command("show")
def profile_show(file: Annotated[str, typer.Argument(help="Profile JSON or builtin:NAME.")]
                 ) -> None:
    """Print a profile's metadata and per-batch-size table."""
    from servelab.calibrate import show_profile

    try:
        show_profile(file, console)
    except USER_ERRORS as exc:
        fail(str(exc))


@profile_app.command("compare")
def profile_compare(
    a: Annotated[str, typer.Argument(help="First profile (path or builtin:NAME).")],
    b: Annotated[str, typer.Argument(help="Second profile.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="HTML overlay to write.")] = None,
) -> None:
    """Compare two profiles side by side (median ratio per batch size); optional HTML overlay."""
    from servelab.calibrate import compare_profiles

    try:
        compare_profiles(a, b, out, console)
    except USER_ERRORS as exc:
        fail(str(exc))


register_roofline(app)  # servelab fit, servelab plan
register_endpoint(app)  # servelab bench, servelab server


def main() -> None:
    """Console-script entry point.

    A bug (any exception that is not a :class:`UserError`) prints one line saying so, with
    exit code 3; ``SERVELAB_DEBUG=1`` shows the traceback.
    """
    import os

    try:
        code = app(standalone_mode=False)  # click returns an Exit's code in this mode
    except KeyboardInterrupt:  # pragma: no cover - interactive
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        if type(exc).__name__ == "Abort":  # click's Ctrl-C at a prompt
            err_console.print("interrupted")
            sys.exit(130)
        show, exit_code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):  # click's usage error (exit 2)
            show()
            sys.exit(exit_code)
        if os.environ.get("SERVELAB_DEBUG"):
            raise
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        err_console.print(f"[bold red]internal error (please report; SERVELAB_DEBUG=1 shows "
                          f"the traceback):[/] {escape(text)}", highlight=False, soft_wrap=True)
        sys.exit(3)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
