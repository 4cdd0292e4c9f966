"""``servelab dashboard``, ``trace stats`` and ``profile show/compare``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from servelab.cli_app import USER_ERRORS, app, console, fail


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

