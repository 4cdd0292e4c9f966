"""The commands that measure third-party servers: ``servelab bench`` and ``servelab server``
(:func:`register` adds them to the main app).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

server_app = typer.Typer(no_args_is_help=True, help="Install and run a real LLM server "
                         "(vLLM's CPU build with a tiny model) for tests and trials.")

SERVERS = ("vllm", "ray", "kserve")  # ray, kserve: servelab.request_endpoint_cli


def _cli() -> Any:
    """servelab.cli, imported when a command runs (it imports this module to register)."""
    from servelab import cli

    return cli


def _token_ids(text: str) -> tuple[int, int]:
    fail = _cli().fail
    try:
        lo, hi = (int(v) for v in text.split(":"))
    except ValueError:
        fail(f"--token-ids {text!r}: expected LO:HI, e.g. 10:250")
    return lo, hi


def bench_cmd(
    scenario: Annotated[str, typer.Argument(help="LLM scenario YAML path or builtin:NAME.")],
    endpoint: Annotated[str, typer.Option(help="The server's base URL, e.g. "
                                          "http://127.0.0.1:8000.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory to write.")]
    = None,
    api: Annotated[str, typer.Option(help="openai-completions (token-id prompts of exact "
                                     "length) | openai-chat; request-level scenarios: "
                                     "kserve-v2 | http-json")] = "openai-completions",
    model: Annotated[str | None, typer.Option(help="Model name to send (default: the first "
                                              "the server lists).")] = None,
    max_concurrency: Annotated[int | None, typer.Option(
        help="At most this many requests in flight (default: open loop, no limit).")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a scenario field, KEY=VALUE (repeatable).")] = None,
    drain_timeout_s: Annotated[float | None, typer.Option(
        help="Stop this long after the last arrival's window; unfinished requests are kept "
        "as in flight (default: the window's length, else 60 s).")] = None,
    request_timeout_s: Annotated[float | None, typer.Option(
        help="Fail a request with no complete answer after this long (cause: timeout).")]
    = None,
    token_ids: Annotated[str, typer.Option(help="Prompt token ids are drawn from LO:HI.")]
    = "10:250",
    content_seed: Annotated[int | None, typer.Option(
        help="Hash-block traces: seed of the token ids each block id stands for (default: "
        "the scenario's seed); a new value makes every block new to the server's prefix "
        "cache.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, no table.")]
    = False,
) -> None:
    """Measure a server behind an OpenAI-compatible endpoint on an LLM scenario's arrival
    schedule (the one simulate and live use); write the run directory live writes.
    Ctrl-C or SIGTERM stops the run and keeps what was measured.
    """
    from executor.endpoint.bench import bench
    from sim.llm import is_llm_source

    cli = _cli()
    fail, USER_ERRORS = cli.fail, cli.USER_ERRORS  # noqa: N806
    if api in ("kserve-v2", "http-json"):  # request-level servers (servelab.request_endpoint_cli)
        from servelab.request_endpoint_cli import bench_requests_cmd

        bench_requests_cmd(scenario, endpoint, out, api, model, max_concurrency, set_,
                           drain_timeout_s, request_timeout_s, quiet)
        return
    try:
        if not is_llm_source(scenario):
            fail(f"{scenario}: bench measures LLM scenarios (service.kind llm_linear or "
                 "llm_profile) with this --api; request-level scenarios take --api "
                 "kserve-v2 or http-json")
    except USER_ERRORS as exc:
        fail(str(exc))
    ids = _token_ids(token_ids)
    result = bench_with_progress(
        lambda on_done, on_client: bench(
            scenario, endpoint, api=api, model=model, overrides=set_ or None,
            max_concurrency=max_concurrency, drain_timeout_s=drain_timeout_s,
            request_timeout_s=request_timeout_s, token_ids=ids, content_seed=content_seed,
            handle_signals=True, on_done=on_done, on_client=on_client),
        lambda client: f"bench: {len(client.jobs)} requests to {client.url} "
                       f"(model {client.model})", quiet)
    if out is not None:
        result.write(out)
    _report(result, out, quiet)


def bench_with_progress(call: Callable[[Callable[[Any], None], Callable[[Any], None]], Any],
                        describe: Callable[[Any], str], quiet: bool) -> Any:
    """Run a bench, ``call(on_done, on_client)``, behind a progress bar of requests done and
    failed (the LLM and the request-level bench); return its result. A user error ends the
    command with its one line.
    """
    cli = _cli()
    progress = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                        console=cli.err_console, transient=True, disable=quiet)
    task = progress.add_task("bench", total=None, failed=0)
    failed = 0

    def on_done(outcome: Any) -> None:
        nonlocal failed
        failed += outcome.status == "failed"
        progress.update(task, advance=1, failed=failed)

    def on_client(client: Any) -> None:
        cli.err_console.print(describe(client), highlight=False, soft_wrap=True)
        progress.update(task, total=len(client.jobs))
        progress.start()

    try:
        return call(on_done, on_client)
    except cli.USER_ERRORS as exc:
        cli.fail(str(exc))
    finally:
        progress.stop()


def _report(result: Any, out: Path | None, quiet: bool, *, tail: str | None = None,
            drain_note: bool = False) -> None:
    """The summary table and the client's health lines (shared by the LLM and the
    request-level bench). ``tail`` ends the client line (default: the tokens received);
    ``drain_note`` adds a line when the drain deadline cut the run.
    """
    from servelab.report import summary_table

    console, err_console = _cli().console, _cli().err_console
    summary, meta = result.summary, result.meta
    client = summary["client"]
    if meta["stopped_early"]:
        err_console.print(f"[bold yellow]stopped[/] at {meta['stopped_s']:.1f} s: "
                          f"{meta['requests_sent']} of {meta['requests_planned']} requests "
                          "sent; what was measured is kept")
    if drain_note and meta["drain_timed_out"]:
        err_console.print(f"[bold yellow]drain deadline:[/] {summary['in_flight']} requests "
                          f"unanswered {meta['drain_timeout_s']:g} s after the window; kept "
                          "as in flight (censored)")
    for cause, count in client["errors_by_cause"].items():
        first = result.requests[result.requests["reason"] == cause]["error"].iloc[0]
        err_console.print(f"[bold yellow]failed ({cause}):[/] {count} requests, e.g. {first}",
                          highlight=False, soft_wrap=True)
    if client.get("prompt_token_mismatches"):
        err_console.print(f"[bold yellow]warning:[/] {client['prompt_token_mismatches']} "
                          "requests' usage.prompt_tokens differ from the scenario's prompt "
                          "length (requests.parquet: server_prompt_tokens)")
    if client["send_lag_flagged"]:
        err_console.print(f"[bold yellow]warning:[/] send lag p99 "
                          f"{client['send_lag_ms']['p99']:.1f} ms > "
                          f"{client['send_lag_limit_ms']:g} ms: the client could not keep the "
                          "schedule (a busy machine?); latencies still start at each send")
    if not quiet:
        early = ", stopped early" if meta["stopped_early"] else ""
        console.print(summary_table(summary, title=f"{result.scenario.name} (bench{early})"))
        lag = client["send_lag_ms"]
        end = tail if tail is not None else f"{client['tokens_received']} tokens received"
        console.print(f"client: send lag p50/p99 {lag['p50']:.2f}/{lag['p99']:.2f} ms, "
                      f"CPU share {client['cpu_share']:.0%} of a core, {end}")
    if out is not None:
        console.print(f"run directory: {out}")


def calibrate_endpoint_cmd(endpoint: str, model: str | None, out: Path, budget_s: float,
                           reps: int, max_num_seqs: int | None,
                           max_num_batched_tokens: int | None, seed: int) -> None:
    """``servelab calibrate --endpoint``: probe the server, print the plan and each step,
    write the step profile and its scenario fragment.
    """
    from executor.endpoint.calibrate import calibrate_endpoint

    cli = _cli()
    fail, USER_ERRORS, console = cli.fail, cli.USER_ERRORS, cli.console  # noqa: N806
    try:
        meta = calibrate_endpoint(endpoint, out, model=model, budget_s=budget_s, reps=reps,
                                  max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens, seed=seed,
                                  say=lambda m: console.print(m, highlight=False,
                                                              soft_wrap=True))
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    partial = meta.get("partial")
    if partial:
        why = ("budget spent" if partial["stopped_by"] == "budget" else "interrupted")
        console.print(f"[yellow]{why} — partial profile[/] ({partial['stopped_by']}): "
                      f"{partial['prefill_points']} of {partial['planned_prefill_points']} "
                      f"prefill and {partial['decode_points']} of "
                      f"{partial['planned_decode_points']} decode points measured")
        if "overheads" not in meta:
            return
    over = meta["overheads"]
    console.print(f"overheads: {over['request_ms']:.2f} ms per request, "
                  f"{over['per_output_token_ms']:.3f} ms per output token; probing took "
                  f"{meta['wall_s']:.0f} s (budget {meta['budget_s']:g} s)")


def compare_endpoint_cmd(scenario: str, endpoint: str, profile: Path | None, out: Path,
                         repeats: int, set_: list[str] | None, probe: str,
                         drain_timeout_s: float | None, rhos: list[float],
                         table: Any) -> None:
    """``servelab compare SCENARIO --endpoint URL [--sweep R1,R2,...]``: predict, bench,
    compare (at each target load with ``--sweep``).
    """
    from executor.endpoint.compare_endpoint import compare_endpoint, sweep_endpoint

    cli = _cli()
    fail, USER_ERRORS, console = cli.fail, cli.USER_ERRORS, cli.console  # noqa: N806
    if rhos:
        from servelab.cli_live import LLM_FIDELITY_KEYS, _fidelity_table

        try:
            frame = sweep_endpoint(scenario, endpoint, out, rhos, profile=profile,
                                   repeats=repeats, overrides=set_ or None, probe_mode=probe,
                                   drain_timeout_s=drain_timeout_s,
                                   progress=lambda m: console.print(f"[dim]{m}[/]"))
        except USER_ERRORS as exc:
            fail(str(exc))
            return
        console.print(_fidelity_table(frame, LLM_FIDELITY_KEYS))
        console.print(f"capacity {frame['capacity_rps'].iloc[0]:.3g} req/s on the calibrated "
                      "profile; rho = offered rate / capacity; one compare.json per point in "
                      f"{out}/rho-R/")
        console.print(f"fidelity curve: {out / 'fidelity.csv'}")
        return
    try:
        data = compare_endpoint(scenario, endpoint, out, profile=profile, repeats=repeats,
                                overrides=set_ or None, probe_mode=probe,
                                drain_timeout_s=drain_timeout_s,
                                progress=lambda m: console.print(f"[dim]{m}[/]"))
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(table(data))
    for p in data["probes"]:
        console.print(f"probe: prefill ×{p['prefill_scale']:.3f}, decode "
                      f"×{p['decode_scale']:.3f} against the profile (drift {p['drift']:.1%})")
    console.print(f"comparison: {out / 'compare.json'}")


def server_install(name: Annotated[str, typer.Argument(help="vllm | ray | kserve")] = "vllm"
                   ) -> None:
    """Create the server's own virtual environment and write the tiny model (once)."""
    from executor.endpoint.servers import ensure_vllm

    if name in ("ray", "kserve"):
        from servelab.request_endpoint_cli import request_server_install

        request_server_install(name)
        return

    fail, USER_ERRORS, console = _cli().fail, _cli().USER_ERRORS, _cli().console  # noqa: N806
    if name not in SERVERS:
        fail(f"server {name!r}: allowed: {', '.join(SERVERS)}")
    try:
        env = ensure_vllm()
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(f"vLLM environment: {env.root}\nmodel: {env.model_dir}")


def server_run(
    name: Annotated[str, typer.Argument(help="vllm | ray | kserve")] = "vllm",
    port: Annotated[int, typer.Option(help="Loopback port (0: a free one).")] = 8000,
    kv_cache_gib: Annotated[int, typer.Option(help="KV-cache space, whole GiB "
                                                "(VLLM_CPU_KVCACHE_SPACE).")] = 1,
    arg: Annotated[list[str] | None, typer.Option(
        "--arg", help="Extra api_server flag, e.g. --arg=--max-num-batched-tokens=256 "
        "(repeatable).")] = None,
) -> None:
    """Start vLLM's CPU build serving the tiny model on 127.0.0.1:PORT until Ctrl-C
    (installing it first if needed).
    """
    from executor.endpoint.servers import VllmServer, ensure_vllm

    cli = _cli()
    fail, USER_ERRORS, console, err_console = (  # noqa: N806
        cli.fail, cli.USER_ERRORS, cli.console, cli.err_console)
    if name in ("ray", "kserve"):
        from servelab.request_endpoint_cli import request_server_run

        request_server_run(name, port, arg or [])
        return
    if name not in SERVERS:
        fail(f"server {name!r}: allowed: {', '.join(SERVERS)}")
    try:
        server = VllmServer(ensure_vllm(), port=port, args=tuple(arg or ()),
                            kv_cache_gib=kv_cache_gib)
        err_console.print("starting vLLM (about a minute or two: warm-up compilation) …")
        server.start()
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(f"serving tiny-llama at {server.url} (started in {server.started_s:.0f} s; "
                  f"log {server.log_path}); Ctrl-C stops it")
    from servelab.cli_app import hold_server

    hold_server(server)
    console.print("server stopped")


def register(app: typer.Typer) -> None:
    """Add ``bench`` and ``server install|run`` to the main app."""
    app.command("bench")(bench_cmd)
    server_app.command("install")(server_install)
    server_app.command("run")(server_run)
    app.add_typer(server_app, name="server")
