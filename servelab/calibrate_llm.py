"""``servelab calibrate --model llm``: measure a decoder's step profile and its held-out error.

Held-out compositions come from the workload the profile is for: the Azure conversation trace
(``builtin:llm-demo``) simulated under vLLM with the grid's limits, 30 of its steps drawn at
random (outside the measured grid points, clipped to the grid's range).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from calibration.step_profile import StepProfile
from sim.errors import UserError

HELD_OUT = 30


def trace_compositions(prefill_max: int, decodes_max: int, context_max: int, n: int,
                       seed: int) -> list[tuple[int, int, int, int]]:
    """``n`` step compositions (P, D, KV tokens, prefill context) of the Azure trace
    simulated under vLLM with these limits, drawn at random.
    """
    import sim.llm

    result = sim.llm.run("builtin:llm-demo", overrides={
        "workload.n_requests": 600, "warmup_s": 0, "policy.max_num_seqs": decodes_max,
        "policy.max_num_batched_tokens": prefill_max + decodes_max,
        "service.per_kv_token_ms": 0.0})
    steps = result.steps
    steps = steps[(steps["prefill_tokens"] <= prefill_max) & (steps["decode_seqs"]
                                                               <= decodes_max)]
    ctx = np.where(steps["decode_seqs"] > 0,
                   steps["kv_tokens"] / steps["decode_seqs"].clip(lower=1), 0)
    steps = steps[ctx <= context_max]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(steps), size=min(n, len(steps)), replace=False)
    rows = steps.iloc[np.sort(pick)]
    return [(int(p), int(d), int(k), int(c)) for p, d, k, c in zip(
        rows["prefill_tokens"], rows["decode_seqs"], rows["kv_tokens"],
        rows["prefill_context"], strict=True)]


def run_step_calibration(*, device: str, dtype: str, threads: int | None, reps: int,
                         warmup: int, seed: int, params: dict[str, Any], out: Path,
                         console: Console, config: Path | None = None,
                         budget_s: float = 600.0, yes: bool = False) -> StepProfile | None:
    """Build the decoder, estimate the time, measure the grid and the held-out steps, write
    the profile (on Ctrl-C: what was measured so far).

    Args:
        device: auto | cpu | cuda | cuda:N.
        dtype: fp32 | fp16 | bf16.
        threads: CPU threads for torch (None: torch's choice).
        reps: Timed runs per step.
        warmup: Untimed runs per step first.
        seed: Seeds the shuffled order and the held-out steps.
        params: ``shape`` (small | 1b | 8b) and decoder sizes (they win over ``config``).
        out: The profile JSON to write.
        console: Where progress goes.
        config: A Hugging Face ``config.json`` (or a directory holding one): the decoder's
            layers, widths, heads and vocabulary come from it.
        budget_s: Refuse a calibration estimated to take longer, unless ``yes``.
        yes: Run whatever the estimate.

    Raises:
        UserError: a bad shape, config or setting, or an estimate over the budget.
    """
    from calibration.model_runners import resolve_device
    from calibration.step_measure import (
        CPU_GRID,
        CUDA_GRID,
        StepsInterrupted,
        _timer,
        build_decoder,
        measure_steps,
    )
    from calibration.step_plan import duration, plan

    device = resolve_device(device)
    params = dict(params)
    named = "shape" in params
    shape = str(params.pop("shape", "small" if device == "cpu" else "1b"))
    if dtype == "fp16" and device == "cpu":
        raise UserError("--dtype fp16: needs a CUDA device; on cpu use fp32 or bf16")
    try:
        overrides = {k: int(v) for k, v in params.items()}
    except (TypeError, ValueError):
        raise UserError(f"--param: decoder sizes must be integers, got {params}") from None
    label = shape
    if config is not None:
        from calibration.llm_config import decoder_sizes

        sizes, label = decoder_sizes(config)
        overrides = {**sizes, **overrides}  # --param still wins over the config
        if named:
            label += f", KV cache of shape {shape}"
    elif overrides:
        label = f"{shape} with " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    console.print(f"[dim]building the decoder ({label}, random weights)[/]", soft_wrap=True)
    try:
        decoder = build_decoder(shape, overrides, device, dtype, threads)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    grid = CUDA_GRID if device.startswith("cuda") else CPU_GRID
    held = trace_compositions(grid.prefill_tokens[-1], grid.decode_seqs[-1],
                              grid.context_tokens[-1], HELD_OUT, seed)
    parameters = decoder.describe()["parameters"]
    console.print(f"calibrating the [bold]llm[/] decoder ({label}; {parameters:,} "
                  f"parameters, random weights) on {device}, {dtype}: {len(grid.points())} "
                  f"grid steps + {len(held)} held-out steps, {reps} reps each",
                  soft_wrap=True)
    console.print("[dim]estimating the time: timing 3 pilot steps[/]")
    estimate = plan(decoder.step, grid, max_len=decoder.cfg.max_len, held_out=len(held),
                    reps=reps, warmup=warmup, timer=_timer(device))
    console.print(f"estimated time: about {duration(estimate.estimate_s)} for "
                  f"{estimate.steps:,} steps (budget {duration(budget_s)})", soft_wrap=True)
    if estimate.estimate_s > budget_s and not yes:
        raise UserError(f"calibrate: estimated {duration(estimate.estimate_s)}, over the "
                        f"budget of {duration(budget_s)}; pass --yes to run it anyway, raise "
                        "--budget-s, or lower --reps (Ctrl-C during the run writes what was "
                        "measured after each complete round)")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("steps", total=(len(grid.points()) + len(held)) * reps)
        try:
            profile = measure_steps(decoder, grid, reps=reps, warmup=warmup, seed=seed,
                                    held_out=held,
                                    progress=lambda done, total: bar.update(
                                        task, completed=done, total=total))
        except StepsInterrupted as stop:
            partial = out.with_suffix(".partial.json")
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({**stop.to_dict(), "shape": label}))
            console.print(f"[yellow]interrupted before every grid step had a sample[/] "
                          f"({stop.done} of {stop.total} timed): the samples are in {partial} "
                          "(not a usable profile)")
            return None
        except ValueError as exc:
            raise UserError(str(exc)) from None
    profile.meta["shape"] = label
    if config is not None:
        profile.meta["config"] = str(config)
    path = profile.save(out)
    stopped = profile.meta.get("interrupted")
    if stopped:
        console.print(f"[yellow]interrupted — partial profile[/]: {stopped['timed_steps']} of "
                      f"{stopped['of']} timed steps ({stopped['reps_complete']} complete "
                      "rounds)")
    fit = profile.fit
    console.print(f"fit: {fit['a_ms']:.3f} ms + {fit['b_ms_per_prefill_token']:.5f} ms/prefill "
                  f"token + {fit['c_ms_per_decode_seq']:.4f} ms/decode + "
                  f"{fit['d_ms_per_kv_token']:.7f} ms/KV token (R² {fit['r2']:.3f})")
    held_err = profile.meta.get("held_out", {})
    if held_err:
        i, lin = held_err["interpolated"], held_err["linear"]
        console.print(f"held-out steps ({i['n']}): interpolated |error| median "
                      f"{i['median']:.1%}, p90 {i['p90']:.1%}; linear fit median "
                      f"{lin['median']:.1%}, p90 {lin['p90']:.1%}")
    console.print(f"profile: {path}")
    return profile
