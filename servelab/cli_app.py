"""The ``servelab`` Typer app and what every command shares: the one-line error, the
stability warning, help texts, scenario loading and progress printers.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from sim.errors import UserError
from sim.scenario.llm import LlmScenario
from sim.scenario.schema import Scenario

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


def _is_llm(scenario: str) -> bool:
    """Whether SCENARIO is an LLM scenario (a bad reference ends in one error line)."""
    from sim.llm import is_llm_source

    try:
        return is_llm_source(scenario)
    except USER_ERRORS as exc:
        fail(str(exc))
        return False


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


def sim_load(scenario: str, overrides: list[str] | None) -> Scenario | LlmScenario:
    """Load and validate a scenario (request-level or LLM) for the experiment commands."""
    from sim.llm import load_any

    return load_any(scenario, overrides or None)


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



def hold_server(server: Any) -> None:
    """Keep a started server (``servelab server run``) until Ctrl-C, SIGTERM or its own exit,
    then stop it (its whole process group: :meth:`stop`).
    """
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stop and server.proc is not None and server.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
