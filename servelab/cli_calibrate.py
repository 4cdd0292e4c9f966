"""``servelab calibrate``: a model's batched latency curve, an LLM decoder's step
profile, or (with ``--endpoint``) whatever serves an endpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from servelab.cli_app import USER_ERRORS, app, console, fail


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
        "this (seconds; default 600) unless --yes. With an LLM --endpoint: no probe step "
        "starts after this many seconds (default 180; the last step and the fit may run "
        "past it).")] = None,
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

