"""``servelab live`` and ``servelab compare``: real-time runs and sim-vs-live comparison."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from servelab.cli_app import (
    DRAIN_HELP,
    FORCE_HELP,
    MAX_WALL_HELP,
    MODEL_HELP,
    USER_ERRORS,
    _is_llm,
    _with_model,
    app,
    console,
    err_console,
    fail,
    warn_stability,
)
from sim.serving.core import InvariantError, PolicyError

REQUEST_FIDELITY_KEYS = ("throughput_rps", "latency_ms.p50", "latency_ms.p99",
                         "mean_batch_size")


LIVE_YES_HELP = ("Run even when the run would hold more memory than the budget (4 GiB: its "
                 "records, and per replica its model and a batch, or an LLM engine's "
                 "decoder and KV cache); without it such a run is refused before any "
                 "model is loaded.")

LLM_FIDELITY_KEYS = ("throughput_rps", "output_tokens_per_s", "ttft_ms.p50", "ttft_ms.p99",
                     "tpot_ms.p50", "tpot_ms.p99")



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
    yes: Annotated[bool, typer.Option("--yes", "-y", help=LIVE_YES_HELP)] = False,
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
        _live_llm(scenario, out, set_, on_interrupt, drain_timeout_s, max_wall_s, force, yes)
        return
    try:
        result = live(scenario, overrides=set_ or None, handle_sigint=True,
                      stop_mode=on_interrupt, drain_timeout_s=drain_timeout_s,
                      max_wall_s=max_wall_s, force=force, yes=yes,
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


def _live_llm(scenario: str, out: Path | None, set_: list[str] | None, on_interrupt: str,
              drain_timeout_s: float | None, max_wall_s: float, force: bool,
              yes: bool = False) -> None:
    """``servelab live`` for an LLM scenario: the scheduler objects on the real decoder."""
    from executor.live_llm import live_llm
    from sim.llm import StepInvariantError

    try:
        result = live_llm(scenario, overrides=set_ or None, handle_sigint=True,
                          stop_mode=on_interrupt, drain_timeout_s=drain_timeout_s,
                          max_wall_s=max_wall_s, force=force, yes=yes)
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
    yes: Annotated[bool, typer.Option("--yes", "-y", help=LIVE_YES_HELP)] = False,
    model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="Measure this server with bench instead of running live (an OpenAI-compatible "
        "one for LLM scenarios; KServe v2 or plain JSON for request-level ones, see --api).")]
    = None,
    profile: Annotated[Path | None, typer.Option(
        help="With --endpoint: the profile calibrate --endpoint wrote (its overheads "
        "and server knobs are applied).")] = None,
    api: Annotated[str, typer.Option(
        help="With --endpoint and a request-level scenario: kserve-v2 or http-json.")]
    = "kserve-v2",
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
            from servelab.request_endpoint_cli import compare_requests_cmd

            compare_requests_cmd(scenario, endpoint, api, profile, out, repeats, set_, probe,
                                 drain_timeout_s, rhos, model, _compare_table)
            return
        compare_endpoint_cmd(scenario, endpoint, profile, out, repeats, set_, probe,
                             drain_timeout_s, rhos, _compare_table)
        return
    if _is_llm(scenario):
        _compare_llm(scenario, out, repeats, set_, probe, drain_timeout_s, max_wall_s, force,
                     rhos, yes)
        return

    try:
        if sweep_:
            frame = sweep(scenario, out, rhos, repeats=repeats, overrides=set_ or None,
                          progress=lambda m: console.print(f"[dim]{m}[/]"), probe_mode=probe,
                          probe_budget_s=probe_budget_s, drain_timeout_s=drain_timeout_s,
                          max_wall_s=max_wall_s, force=force, yes=yes)
            console.print(_fidelity_table(frame, REQUEST_FIDELITY_KEYS))
            console.print(f"fidelity curve: {out / 'fidelity.csv'}")
            return
        data = compare(scenario, out, repeats=repeats, overrides=set_ or None,
                       progress=lambda m: console.print(f"[dim]{m}[/]"), probe_mode=probe,
                       probe_budget_s=probe_budget_s, drain_timeout_s=drain_timeout_s,
                       max_wall_s=max_wall_s, force=force, yes=yes)
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
                 rhos: list[float], yes: bool = False) -> None:
    """``servelab compare`` (and ``--sweep``) for an LLM scenario."""
    from executor.compare_llm import compare_llm, sweep_llm

    try:
        if rhos:
            frame = sweep_llm(scenario, out, rhos, repeats=repeats, overrides=set_ or None,
                              probe_mode=probe, drain_timeout_s=drain_timeout_s,
                              max_wall_s=max_wall_s, force=force, yes=yes,
                              progress=lambda m: console.print(f"[dim]{m}[/]"))
            console.print(_fidelity_table(frame, LLM_FIDELITY_KEYS))
            console.print(f"capacity {frame['capacity_rps'].iloc[0]:.3g} req/s on the probed "
                          f"profile ({frame['capacity_stored_rps'].iloc[0]:.3g} on the stored "
                          "one); rho = offered rate / capacity")
            console.print(f"fidelity curve: {out / 'fidelity.csv'}")
            return
        data = compare_llm(scenario, out, repeats=repeats, overrides=set_ or None,
                           probe_mode=probe, drain_timeout_s=drain_timeout_s,
                           max_wall_s=max_wall_s, force=force, yes=yes,
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

