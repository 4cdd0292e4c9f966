"""``servelab fit`` and ``servelab plan``: the roofline step model's commands.

``fit`` learns the coefficients of ``service.kind: llm_roofline`` from measured step profiles;
``plan`` asks the simulator which device × tensor parallelism × replica count is cheapest
for a model, a load and SLOs. :func:`register` adds them to the CLI's typer app (the CLI's
helpers are imported when a command runs: :mod:`servelab.cli` imports this module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table


def fit_cmd(
    profile: Annotated[list[str], typer.Option(
        "--profile", help="A step profile (calibrate --model llm), path or builtin:NAME "
        "(repeatable: fit one coefficient set over several models).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Coefficients JSON to write.")],
    device: Annotated[str | None, typer.Option(
        help="Device sheet of GPU profiles: h100-sxm | a100-80gb | l40s | h200 | PATH.yaml "
             "(CPU profiles use the cpu sheet).")] = None,
    holdout: Annotated[float, typer.Option(
        help="Share of the measured steps held out of the fit and reported.")] = 0.25,
    seed: Annotated[int, typer.Option(help="Seeds the held-out split.")] = 0,
    name: Annotated[str | None, typer.Option(help="Name stored in the file.")] = None,
) -> None:
    """Fit the roofline step model's coefficients to measured step profiles.

    Non-negative least squares on the relative error of every measured step; prints the
    coefficients and the error on the steps held out. Use the file as
    ``service.coefficients`` of an ``llm_roofline`` scenario.
    """
    from servelab.cli import USER_ERRORS, console, fail
    from sim.llm.roofline import UNITS
    from sim.llm.roofline_fit import fit, load_profile_data

    try:
        data = [load_profile_data(p, device) for p in profile]
        coeffs = fit(data, holdout=holdout, seed=seed, name=name or out.stem)
        path = coeffs.save(out)
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    table = Table(title=f"coefficients ({sum(len(d.rows) for d in data)} measured steps)")
    table.add_column("term")
    table.add_column("β", justify="right")
    table.add_column("unit")
    for term, value in coeffs.values.items():
        table.add_row(term, f"{value:.4g}", UNITS[term])
    console.print(table)
    result = coeffs.meta["fit"]
    for split in ("train", "held_out"):
        e = result[split]
        if e.get("n"):
            console.print(f"{split}: {e['n']} steps, |error| median {e['median_abs']:.1%}, "
                          f"p90 {e['p90_abs']:.1%}, mean signed {e['mean_signed']:+.1%}")
    if result["not_identified"]:
        console.print(f"not identified by these profiles (left at 0): "
                      f"{', '.join(result['not_identified'])}")
    console.print(f"coefficients: {path}")


def register(app: typer.Typer) -> None:
    """Add ``fit`` and ``plan`` to the CLI."""
    app.command("fit")(fit_cmd)
