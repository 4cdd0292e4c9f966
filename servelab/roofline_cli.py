"""``servelab fit`` and ``servelab plan``: the roofline step model's commands.

``fit`` learns the coefficients of ``service.kind: llm_roofline`` from measured step profiles
and from ``servelab bench`` runs (simulation in the loop);
``plan`` asks the simulator which device × tensor parallelism × replica count is cheapest
for a model, a load and SLOs. :func:`register` adds them to the CLI's typer app (the CLI's
helpers are imported when a command runs: :mod:`servelab.cli` imports this module).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

if TYPE_CHECKING:
    from rich.console import Console

    from sim.experiments.plan import Candidate
    from sim.scenario.roofline.model import Coefficients


def fit_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Coefficients JSON to write.")],
    profile: Annotated[list[str] | None, typer.Option(
        "--profile", help="A step profile (calibrate --model llm), path or builtin:NAME "
        "(repeatable: fit one coefficient set over several models).")] = None,
    bench: Annotated[list[Path] | None, typer.Option(
        "--bench", help="A servelab bench run directory (repeatable): fit by simulation in "
        "the loop to its TTFT and E2E percentiles, starting from the --profile fit or "
        "--coefficients.")] = None,
    model: Annotated[str | None, typer.Option(
        help="With --bench: the served model's config.json (or folder) or builtin:NAME.")]
    = None,
    device: Annotated[str | None, typer.Option(
        help="Device sheet: h100-sxm | a100-80gb | l40s | h200 | cpu | PATH.yaml (CPU "
             "profiles use the cpu sheet).")] = None,
    tp: Annotated[int, typer.Option(min=1, help="With --bench: the server's tensor "
                                    "parallelism.")] = 1,
    coefficients: Annotated[str, typer.Option(
        help="With --bench and no --profile: the set to start from (builtin | builtin:NAME "
             "| PATH); with --profile: the set whose request overheads the fit keeps "
             "(step profiles do not see them).")] = "builtin",
    holdout: Annotated[float | None, typer.Option(
        help="Share held out of the fit and reported: of the measured steps (default 0.25), "
             "of the bench directories (default 0.34).")] = None,
    max_evals: Annotated[int, typer.Option(
        help="With --bench: most simulations per directory the search may run.")] = 120,
    seed: Annotated[int, typer.Option(help="Seeds the held-out split.")] = 0,
    name: Annotated[str | None, typer.Option(help="Name stored in the file.")] = None,
) -> None:
    """Fit the roofline step model's coefficients to measured step profiles, bench runs,
    or both.

    Profiles: non-negative least squares on the relative error of every measured step.
    Bench runs: simulation in the loop, Nelder-Mead on the TTFT and E2E percentiles
    (from the profile fit when both are given). Prints the coefficients and the errors
    held out. Use the file as ``service.coefficients`` of an ``llm_roofline`` scenario.
    """
    from servelab.cli import USER_ERRORS, console, fail
    from sim.scenario.roofline.fit import fit, load_profile_data
    from sim.scenario.roofline.model import UNITS, load_coefficients

    if not profile and not bench:
        fail("give --profile PROFILE (step profiles) or --bench DIR (bench runs), or both")
        return
    try:
        coeffs = None
        if profile:
            data = [load_profile_data(p, device) for p in profile]
            coeffs = fit(data, holdout=0.25 if holdout is None else holdout, seed=seed,
                         name=name or out.stem)
            # a step profile times the engine alone: the request overheads stay the set's
            kept = load_coefficients(coefficients, data[0].device.kind)
            coeffs = replace(coeffs, overheads=dict(kept.overheads), meta={
                **coeffs.meta, "request_overheads_from": kept.name})
            _print_profile_fit(coeffs, sum(len(d.rows) for d in data), console)
            if kept.overheads and not bench:
                console.print(f"request overheads kept from {kept.name} (a step profile "
                              "does not see them; --coefficients or --bench sets them)")
        if bench:
            coeffs = _fit_bench(bench, model, device, tp, coeffs, coefficients,
                                0.34 if holdout is None else holdout, seed, max_evals,
                                name or out.stem)
        assert coeffs is not None
        path = coeffs.save(out)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    table = Table(title="coefficients")
    table.add_column("term")
    table.add_column("β", justify="right")
    table.add_column("unit")
    for term, value in coeffs.values.items():
        table.add_row(term, f"{value:.4g}", UNITS[term])
    for key, value in coeffs.overheads.items():
        table.add_row(f"request_overheads.{key}", f"{value:.4g}", "ms")
    console.print(table)
    console.print(f"coefficients: {path}")


def _print_profile_fit(coeffs: Coefficients, steps: int, console: Console) -> None:
    result = coeffs.meta["fit"]
    console.print(f"step-profile fit ({steps} measured steps):")
    for split in ("train", "held_out"):
        e = result[split]
        if e.get("n"):
            console.print(f"{split}: {e['n']} steps, |error| median {e['median_abs']:.1%}, "
                          f"p90 {e['p90_abs']:.1%}, mean signed {e['mean_signed']:+.1%}")
    if result["not_identified"]:
        console.print(f"not identified by these profiles (left at their defaults: 0, "
                      f"tp_allreduce_latency 1): "
                      f"{', '.join(result['not_identified'])}")


def _fit_bench(dirs: list[Path], model: str | None, device: str | None, tp: int,
               start: Coefficients | None, start_ref: str, holdout: float, seed: int,
               max_evals: int, name: str) -> Coefficients:
    """``fit --bench``: simulation in the loop; prints each run's errors."""
    from servelab.cli import console
    from sim.errors import UserError
    from sim.experiments.fit_bench import TARGETS, fit_bench, load_bench_run, mean_abs
    from sim.scenario.roofline.hardware import load_device
    from sim.scenario.roofline.model import load_coefficients
    from sim.scenario.roofline.service import load_shape

    if model is None or device is None:
        raise UserError("--bench needs --model (the served model's config.json or "
                        "builtin:NAME) and --device (the server's device sheet)")
    sheet = load_device(device)
    shape = load_shape(model)
    shape.check_tp(tp, "--tp")
    service = {"kind": "llm_roofline", "model": model, "device": device, "tp": tp}
    runs = [load_bench_run(d, service) for d in dirs]
    first = start or load_coefficients(start_ref, sheet.kind)
    got = fit_bench(runs, shape, sheet, tp, first, holdout=holdout, seed=seed,
                    max_evals=max_evals, name=name)
    result = got.meta["fit"]
    table = Table(title=f"bench fit: {result['evaluations']} evaluations, start "
                  f"{first.name}; error = (sim − measured) / measured")
    keys = [f"{m}.p{q}" for m, q in TARGETS]
    for col in ("run", "split", "set", *keys):
        table.add_column(col, justify="right")
    for label in ("start", "fitted"):
        for run, row in result["runs"][label].items():
            table.add_row(run, row["split"], label,
                          *(f"{row['errors'][k]:+.1%}" for k in keys))
    console.print(table)
    console.print("group multipliers of the start set: " + ", ".join(
        f"{g} ×{m:.3g}" for g, m in result["group_multipliers"].items()))
    console.print(f"request overhead outside the steps: {result['request_ms']['start']:.3g}"
                  f" → {result['request_ms']['fitted']:.3g} ms")
    for split in ("train", "held_out"):
        before, after = (mean_abs(result["runs"][s], split) for s in ("start", "fitted"))
        if before is not None and after is not None:
            console.print(f"{split}: mean |error| {before:.1%} → {after:.1%}")
    return got


def _devices(specs: list[str]) -> dict[str, float]:
    from sim.errors import UserError

    out = {}
    for spec in specs:
        name, _, price = spec.partition("=")
        try:
            out[name] = float(price)
        except ValueError:
            raise UserError(f"--device {spec!r}: give NAME=PRICE_PER_GPU_HOUR, e.g. "
                            "h100-sxm=3.0") from None
        if out[name] < 0:
            raise UserError(f"--device {spec!r}: the price must be >= 0")
    return out


def plan_cmd(
    model: Annotated[str, typer.Option(
        help="config.json (or its folder) or builtin:NAME (llama-3.1-8b, qwen2.5-7b, ...).")],
    device: Annotated[list[str], typer.Option(
        help="NAME=PRICE per GPU-hour, e.g. h100-sxm=3.0 (repeatable; a sheet name or "
             "PATH.yaml).")],
    slo: Annotated[list[str], typer.Option(
        help="METRIC_STAT_ms=LIMIT, e.g. ttft_p99_ms=1000 (repeatable; every one must "
             "hold).")],
    rate_rps: Annotated[float, typer.Option(help="Poisson arrival rate.")] = 2.0,
    prompt_tokens: Annotated[int, typer.Option(help="Mean prompt length (lognormal).")] = 1000,
    output_tokens: Annotated[int, typer.Option(help="Mean output length (lognormal).")] = 200,
    cv: Annotated[float, typer.Option(help="Token lengths' coefficient of variation.")] = 1.0,
    n_requests: Annotated[int, typer.Option(help="Requests per simulation.")] = 400,
    tp: Annotated[str, typer.Option(help="Tensor-parallel sizes to try.")] = "1,2,4,8",
    max_num_batched_tokens: Annotated[int, typer.Option(
        help="vLLM's per-step token budget.")] = 8192,
    coefficients: Annotated[str, typer.Option(
        help="builtin | builtin:NAME | PATH (servelab fit).")] = "builtin",
    seeds: Annotated[int, typer.Option(help="Seeds per candidate (all must hold).")] = 2,
    max_replicas: Annotated[int, typer.Option(help="Most replicas tried.")] = 16,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the plan as JSON and a Plotly HTML chart here.")] = None,
) -> None:
    """The cheapest device × tensor parallelism × replicas that hold the SLOs (simulated with
    the roofline step model; vLLM's scheduler, chunked prefill).
    """
    from servelab.cli import USER_ERRORS, console, fail
    from sim.errors import UserError
    from sim.experiments.plan import Slo, plan

    try:
        tps = [int(v) for v in tp.split(",")]
    except ValueError:
        fail(f"--tp {tp!r}: give sizes separated by commas, e.g. 1,2,4")
        return
    tokens = [{"dist": "lognormal", "mean": n, "cv": cv} for n in (prompt_tokens,
                                                                  output_tokens)]
    base = {"name": "plan", "warmup_s": 0,
            "service": {"kind": "llm_roofline", "model": model, "device": "cpu",
                        "coefficients": coefficients},
            "workload": {"kind": "poisson", "rate_rps": rate_rps, "n_requests": n_requests,
                         "prompt_tokens": tokens[0], "output_tokens": tokens[1]},
            "policy": {"kind": "vllm", "max_num_seqs": 256,
                       "max_num_batched_tokens": max_num_batched_tokens}}
    try:
        if min(tps) < 1:
            raise UserError(f"--tp {tp!r}: sizes must be >= 1")
        rows = plan(base, _devices(device), tps, [Slo.parse(s) for s in slo], seeds,
                    max_replicas)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    table = Table(title=f"{model} at {rate_rps:g} req/s (simulated; {seeds} seeds each)")
    keys = next((list(r.metrics) for r in rows if r.metrics), [])
    for col in ("device", "tp", "replicas", "$/hour", *(f"{k} (seeds)" for k in keys),
                "step fit held-out err", "note"):
        table.add_column(col)
    for r in rows:
        spread = [f"{min(r.metrics[k]):.0f}-{max(r.metrics[k]):.0f}" if k in r.metrics
                  else "" for k in keys]
        table.add_row(r.device, str(r.tp), str(r.replicas or "-"),
                      f"{r.cost_per_hour:.2f}" if r.cost_per_hour is not None else "-",
                      *spread, f"{r.fit_error:.0%}" if r.fit_error is not None else "n/a",
                      r.note)
    console.print(table)
    if out is not None:
        _write_plan(out, rows)
        console.print(f"plan: {out}")


def _write_plan(out: Path, rows: list[Candidate]) -> None:
    import json
    from dataclasses import asdict

    import plotly.graph_objects as go

    out.mkdir(parents=True, exist_ok=True)
    data = [{**asdict(r), "cost_per_hour": r.cost_per_hour} for r in rows]
    (out / "plan.json").write_text(json.dumps(data, indent=1) + "\n")
    held = [d for d in data if d["cost_per_hour"] is not None]
    fig = go.Figure(go.Bar(x=[f"{d['device']} tp{d['tp']} ×{d['replicas']}" for d in held],
                           y=[d["cost_per_hour"] for d in held]))
    fig.update_layout(title="Fleets that hold the SLOs", yaxis_title="$ per hour")
    fig.write_html(out / "plan.html", include_plotlyjs="cdn")


def register(app: typer.Typer) -> None:
    """Add ``fit`` and ``plan`` to the CLI."""
    app.command("fit")(fit_cmd)
    app.command("plan")(plan_cmd)
