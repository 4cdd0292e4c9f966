"""``calibrate_endpoint``: identify the step model of whatever serves an OpenAI-compatible
endpoint from outside, within a stated time budget, and write it as a step profile
(:class:`calibration.step_profile.StepProfile`) with the per-request costs outside the steps
and a scenario fragment holding the server's knobs.

What is fitted (times as the client sees them):

* decode steps: the time per extra output token of ``D`` concurrent streams at context ``L``
  (prompt + half the output) fits ``a + c·D + d·D·L``
  (:func:`executor.endpoint.probes.decode_itl_s`);
* prefill steps: one-token requests' TTFT less the per-request overhead ``request_ms`` (API,
  tokenisation, the first token's return: BLIS's α, outside the engine's steps). Where the
  server reports its own prefill time (vLLM's ``request_prefill_time_seconds``: scheduled to
  first token, stamped in the engine core) the overhead is the client's TTFT less it;
  otherwise the intercept of a quadratic in ``P`` through the TTFTs less the decode steps'
  base ``a`` (a straight line through long prompts' TTFT, which attention curves up, put the
  intercept, and so the overhead, too low and every prefill step too long);
* ``per_output_token_ms``: the client's mean ITL over the server's own (vLLM's
  ``inter_token_latency_seconds`` on ``/metrics``) at one running sequence; 0 where the server
  exposes none (then such costs stay inside the decode step times);
* chunked prefill (where ``--max-num-batched-tokens`` splits the longest probe prompt): a
  prompt of several full chunks; its prefill time over the chunks' count, against the chunk
  alone, gives the cost of attending to the cached prefix (``e`` of
  :attr:`calibration.step_profile.StepProfile.prefill_context_s`);
* a prefill on top of a cached prefix (where the server caches prefixes): ``n`` new tokens
  after ``k`` cached ones on a small grid (:mod:`executor.endpoint.prefix_probe`), kept in
  the profile's ``prefill_context_s`` (``"n,k"``, beside ``"n,0"``: its ``e`` per new token ×
  cached token) and, with its own fit (per new token, per attention pair, the prefill
  step's constant), in ``meta.cached_prefill``;
* steps mixing a prefill with decodes: composed as prefill step + decode step − ``a``, and
  checked against the mixed probe (:func:`executor.endpoint.probes.mixed_step_s`; kept in
  ``meta.mixed_check``, not in the grid: a server streaming in bursts blurs it).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from calibration.step_profile import StepProfile
from executor.endpoint import prefix_probe, probes, server_info
from executor.endpoint.bench import preflight
from executor.endpoint.calibrate_budget import Keeper, Rest, Speeds, fittable, probing_end_s
from executor.endpoint.calibrate_plan import (
    MIN_REPS,
    OUTPUT_TOKENS,
    SMALL_BATCH_REPS,
    _runs,
    decode_order,
    estimate_s,
    mixed_point,
    plan_grid,
)
from executor.endpoint.client import APIS
from executor.endpoint.fragment import endpoint_overrides, write_fragment
from executor.endpoint.server_info import EndpointError

__all__ = ["calibrate_endpoint", "endpoint_overrides", "estimate_s", "plan_grid",
           "write_fragment"]

SERVER_ITL = ("inter_token_latency_seconds", "time_per_output_token_seconds")
# vLLM's engine-side time from scheduling a request to its first token (first_token_ts -
# scheduled_ts, both stamped in the engine core): one prefill step when nothing else runs
SERVER_PREFILL = ("request_prefill_time_seconds",)


def calibrate_endpoint(endpoint: str, out: str | Path, *, model: str | None = None,
                       budget_s: float = 180.0, reps: int = 5,
                       max_num_seqs: int | None = None,
                       max_num_batched_tokens: int | None = None, seed: int = 0,
                       say: Callable[[str], None] = print) -> dict[str, Any]:
    """Probe ``endpoint`` and write ``out`` (the step profile) and ``out``'s
    ``.scenario.yaml`` fragment; return the profile's ``meta``.

    Args:
        endpoint: The server's base URL (``http://HOST:PORT``).
        out: The step profile JSON to write.
        model: The served model's name (default: the first ``/v1/models`` lists).
        budget_s: The seconds probing may start steps in: the plan is sized to fit it, work
            is shed as the steps' measured times demand, and no probe step starts once it is
            spent, so the wall time (``meta.wall_s``) runs past ``budget_s`` by at most the
            last step and the fit (``meta.budget``; :mod:`.calibrate_budget`).
        reps: Samples per probe point (fewer where the budget needs it; at least 3).
        max_num_seqs: The server's limit where the user knows it (caps the decode grid).
        max_num_batched_tokens: Likewise (caps the prefill grid).
        seed: Seeds the prompts' random token ids and the order of the decode cells
            (recorded with that order in the profile's ``meta.decode_order``).
        say: Prints the plan and progress.

    Raises:
        EndpointError: unreachable, refusing, a failed probe, or a budget too small.
    """
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise EndpointError(f"--budget-s {budget_s:g}: must be > 0")
    if reps < MIN_REPS:
        raise EndpointError(f"--reps {reps}: must be >= {MIN_REPS}")
    t_start = time.perf_counter()
    base = server_info.base_url(endpoint)
    listed = server_info.models(base)
    entries = [m for m in (listed or {}).get("data", []) if isinstance(m, dict)]
    if model is None:
        if not entries:
            raise EndpointError(f"{base}/v1/models lists no model: pass --model NAME")
        model = str(entries[0].get("id"))
    max_len = next((int(m["max_model_len"]) for m in entries
                    if m.get("id") == model and isinstance(m.get("max_model_len"), int)), 2048)
    url = base + APIS["openai-completions"]
    preflight(url, "openai-completions", model)
    knobs = server_info.scheduling_config(server_info.metrics(base))
    grid = plan_grid(max_len, max_num_seqs, max_num_batched_tokens)
    stopper = probes.Stopper()
    # a fresh salt: a second calibration must not find the first one's prompts cached
    salt = secrets.randbits(31)
    target = probes.Target(url, model, np.random.default_rng([seed, 2929, salt]),
                           stopper=stopper, max_model_len=max_len)
    ttft: dict[int, list[float]] = {}
    itl: dict[tuple[int, int], list[float]] = {}
    contexts = [p + OUTPUT_TOKENS // 2 for p in grid["decode_prompts"]]
    info: dict[str, Any] = {"endpoint": base, "model": model, "server_models": listed,
                            "server": knobs, "reps": reps, "budget_s": budget_s,
                            "max_model_len": max_len, "prompt_salt": salt,
                            "decode_order_seed": seed,
                            "cached_cells": prefix_probe.plan_cells(
                                max_len, max_num_batched_tokens,
                                bool(knobs.get("enable_prefix_caching", False)))}
    with stopper.installed():
        try:
            return _probe(target, grid, contexts, ttft, itl, info, t_start, Path(out),
                          max_num_seqs, max_num_batched_tokens, say)
        except probes.ProbingStopped as stop:
            info["wall_s"] = time.perf_counter() - t_start
            if "budget" in info:  # the time after the last step measured
                info["budget"]["fit_s"] = info["wall_s"] - probing_end_s(info["budget"])
            return _write_partial(stop.signame, grid, contexts, ttft, itl, info, Path(out),
                                  max_num_seqs, max_num_batched_tokens, say)


def _probe(target: probes.Target, grid: dict[str, list[int]], contexts: list[int],
           ttft: dict[int, list[float]], itl: dict[tuple[int, int], list[float]],
           info: dict[str, Any], t_start: float, out: Path, max_num_seqs: int | None,
           max_num_batched_tokens: int | None, say: Callable[[str], None]) -> dict[str, Any]:
    """Size the plan to the budget, run it (filling ``ttft`` and ``itl`` as points complete),
    fit and write the profile; return its meta.
    """
    base, budget_s, reps = info["endpoint"], info["budget_s"], info["reps"]
    # a first look at the server's speed sizes the plan to the budget
    probes.prefill_ttft_s(target, grid["prefill_tokens"][0], 1)  # warm-up, untimed
    ttft_long = max(probes.prefill_ttft_s(target, grid["prefill_tokens"][-1], 2))
    itl_one = float(np.median(probes.decode_itl_s(target, 1, 16, 32) or [ttft_long]))
    left = budget_s - (time.perf_counter() - t_start)
    # a tight budget gives up the small batches' extra samples first, then repetitions,
    # then the costliest cached-prefix cells, then the largest batch sizes
    small, cells = SMALL_BATCH_REPS, info["cached_cells"]
    full = {"reps": reps, "cached_cells": list(cells), "decode_seqs": list(grid["decode_seqs"])}

    def need_s() -> float:
        return estimate_s(grid, reps, ttft_long, itl_one, small_reps=small, cells=cells)

    while small > 1 and need_s() > left:
        small -= 1
    while reps > MIN_REPS and need_s() > left:
        reps -= 1
    while cells and need_s() > left:
        cells = prefix_probe.trimmed(cells)
    info["cached_cells"] = cells
    while need_s() > left and len(grid["decode_seqs"]) > 2:
        grid["decode_seqs"].pop()
    need = need_s()
    if need > left:
        raise EndpointError(f"--budget-s {budget_s:g}: too small for this server; the "
                            f"smallest plan takes about {need + budget_s - left:.0f} s")
    info["reps"], info["small_batch_reps"] = reps, small
    # the decode cells in a seeded shuffled order: a drift of the machine's speed during the
    # probe becomes scatter about the fit instead of a bias of its context term
    order = decode_order(grid, info["decode_order_seed"])
    context_of = dict(zip(grid["decode_prompts"], contexts, strict=True))
    info["decode_order"] = [[d, context_of[p]] for p, d in order]
    say(f"plan (about {need:.0f} s of {left:.0f} s left): prefill {grid['prefill_tokens']} "
        f"tokens × {reps}; decode {grid['decode_seqs']} sequences at prompts "
        f"{grid['decode_prompts']} × {OUTPUT_TOKENS} output tokens ({small} × the samples "
        f"for 1-{probes.SMALL_BATCH} sequences); "
        + (f"prefills after a cached prefix {cells} ([new, cached]); " if cells else "")
        + "one mixed step probe "
        "(Ctrl-C or SIGTERM writes the points measured so far)")
    keeper = Keeper(budget_s, t_start, Speeds(ttft_long, itl_one, grid["prefill_tokens"][-1]),
                    say)
    info["budget"] = keeper.record
    # what the plan gave up before probing (the first look's estimate against the budget)
    keeper.record["plan"] = {
        "estimate_s": need, "left_s": left, "reps": [full["reps"], reps],
        "small_batch_reps": [SMALL_BATCH_REPS, small],
        "cached_cells_dropped": [c for c in full["cached_cells"] if c not in cells],
        "decode_seqs_dropped": [d for d in full["decode_seqs"]
                                if d not in grid["decode_seqs"]]}
    rest = Rest(list(grid["prefill_tokens"]), list(order), reps, small, list(grid["chunked"]),
                [list(c) for c in cells], True)
    engine = _prefill_points(target, base, rest, keeper, grid, ttft, say)
    delta_s = _decode_cells(target, base, rest, keeper, grid, context_of, itl, info, say)
    outside = {k: v for k, v in itl.items() if k[0] not in grid["decode_seqs"]}
    for key in outside:
        del itl[key]
    if outside:  # cells of a size shed after they were measured: kept in meta only
        keeper.record["decode_itl_s_shed"] = {f"{d},{c}": v for (d, c), v in outside.items()}
    profile, meta = _fit(grid, contexts, ttft, itl, delta_s, engine)
    request_s = meta["overheads"]["request_ms"] / 1e3
    context_s: dict[str, list[float]] = {}
    keeper.fit(rest, grid["decode_seqs"])
    if rest.chunked:
        with keeper.step("chunked prefill", "chunked", rest):
            context_s = _chunked(target, base, profile, rest.chunked, rest.reps, request_s)
        meta["chunked_probe"] = {"chunk_tokens": rest.chunked[0],
                                 "chunks": rest.chunked[1], "samples_s": context_s}
        say(f"chunked prefill ({rest.chunked[1]} × {rest.chunked[0]} tokens): "
            f"{np.median(list(context_s.values())[-1]) * 1e3:.2f} ms per chunk at "
            f"{list(context_s)[-1].split(',')[1]} tokens in, "
            f"{profile.step_s(rest.chunked[0], 0, 0) * 1e3:.2f} ms at none")
    info["cached_cells"] = _cached_cells(target, base, rest, keeper, grid, request_s,
                                         meta, context_s, say)
    keeper.fit(rest, grid["decode_seqs"])
    if rest.mixed:
        meta["mixed_check"] = _mixed(target, rest, keeper, grid, profile, contexts,
                                     max_num_batched_tokens, itl_one, say)
    info.pop("delta_s", None)
    # what the probing ended with once the budget shed any (meta.reps: the plan's)
    keeper.record["reps_final"], keeper.record["small_batch_reps_final"] = rest.reps, rest.small
    meta.update({"method": "endpoint", **info, "wall_s": time.perf_counter() - t_start})
    keeper.record["fit_s"] = meta["wall_s"] - probing_end_s(keeper.record)
    return _save(profile, meta, out, max_num_seqs, max_num_batched_tokens, say, context_s)


def _prefill_points(target: probes.Target, base: str, rest: Rest, keeper: Keeper,
                    grid: dict[str, list[int]], ttft: dict[int, list[float]],
                    say: Callable[[str], None]) -> dict[int, float]:
    """Probe the prefill points (filling ``ttft``); the server's own prefill time of each,
    where it reports one.
    """
    engine: dict[int, float] = {}
    while rest.prefill:
        keeper.fit(rest, grid["decode_seqs"])
        p = rest.prefill[0]
        with keeper.step(f"prefill {p}", "prefill", rest, p):
            before = server_info.metrics(base)
            ttft[p] = probes.prefill_ttft_s(target, p, rest.reps)
            inside = server_info.histogram_mean(before, server_info.metrics(base),
                                                SERVER_PREFILL)
        rest.prefill.pop(0)
        if inside is not None:
            engine[p] = inside
        say(f"prefill {p:5d} tokens: TTFT median {np.median(ttft[p]) * 1e3:.2f} ms"
            + (f" (server's prefill step {inside * 1e3:.2f} ms)" if inside else ""))
    return engine


def _decode_cells(target: probes.Target, base: str, rest: Rest, keeper: Keeper,
                  grid: dict[str, list[int]], context_of: dict[int, int],
                  itl: dict[tuple[int, int], list[float]], info: dict[str, Any],
                  say: Callable[[str], None]) -> float:
    """Probe the decode cells in their order (filling ``itl``); the per-output-token
    overhead (the client's ITL less the server's, at one stream; 0 where it reports none).
    """
    delta_s = 0.0
    while True:
        keeper.fit(rest, grid["decode_seqs"])
        if not rest.decode:
            return delta_s
        prompt, d = rest.decode[0]
        ctx = context_of[prompt]
        # one sequence at the shortest context: the server's own ITL beside the client's
        server_itl = d == 1 and prompt == grid["decode_prompts"][0]
        with keeper.step(f"decode {d} at {ctx}", "decode", rest, (prompt, d)):
            before = server_info.metrics(base) if server_itl else None
            samples = probes.decode_itl_s(target, d, prompt, OUTPUT_TOKENS,
                                          _runs(d, rest.reps, rest.small))
            after = server_info.metrics(base) if server_itl else None
        rest.decode.pop(0)
        if not samples:
            raise EndpointError(f"decode probe of {d} sequences: longer outputs did not "
                                "take longer (a server too noisy to probe, or one that "
                                "does not stream per token?)")
        itl[(d, ctx)] = samples
        if server_itl:
            server = server_info.histogram_mean(before, after, SERVER_ITL)
            if server is not None:
                delta_s = max(0.0, float(np.mean(itl[(d, ctx)])) - server)
                info["delta_s"] = delta_s
        say(f"decode {d:3d} seqs at context {ctx}: ITL median "
            f"{np.median(itl[(d, ctx)]) * 1e3:.2f} ms")


def _cached_cells(target: probes.Target, base: str, rest: Rest, keeper: Keeper,
                  grid: dict[str, list[int]], request_s: float, meta: dict[str, Any],
                  context_s: dict[str, list[float]], say: Callable[[str], None]
                  ) -> list[list[int]]:
    """Probe the cached-prefix cells still planned (into ``meta.cached_prefill`` and
    ``context_s``); the cells measured and fitted (none where the budget left too few).
    """
    got: dict[str, Any] = {}
    while True:
        keeper.fit(rest, grid["decode_seqs"])
        if not rest.cells:
            break
        n, k = rest.cells[0]
        with keeper.step(f"cached prefix {n},{k}", "cached", rest, [n, k]):
            if not got:
                prefix_probe.open_connection(target)
            prefix_probe.add_cell(got, prefix_probe.cached_cell_s(target, base, n, k,
                                                                  rest.reps, request_s))
        rest.cells_done.append(rest.cells.pop(0))
    done = rest.cells_done
    if not done:
        return []
    if not fittable(done):
        keeper.record["cached_samples_s"] = got["samples_s"]
        say(f"prefill after a cached prefix: {len(done)} cells measured, too few to fit "
            "(kept in meta.budget.cached_samples_s)")
        return []
    got = prefix_probe.cached_prefill_meta(got)
    meta["cached_prefill"] = got
    context_s.update(got["samples_s"])
    fit = got["fit"]
    say(f"prefill after a cached prefix ({len(done)} cells): "
        f"{fit['a_ms']:.2f} ms + {fit['ms_per_new_token']:.4f} ms per new token + "
        f"{fit['ms_per_context_pair']:.3g} ms per new × cached token + "
        f"{fit['ms_per_sq']:.3g} ms per new token² (R² {fit['r2']:.4f})")
    return done


def _mixed(target: probes.Target, rest: Rest, keeper: Keeper, grid: dict[str, list[int]],
           profile: StepProfile, contexts: list[int], max_num_batched_tokens: int | None,
           itl_one: float, say: Callable[[str], None]) -> dict[str, Any]:
    """The mixed step check: measured beside the profile's composed step."""
    mix_p, mix_d = mixed_point(grid, max_num_batched_tokens)
    with keeper.step("mixed step", "mixed", rest):
        mixed = probes.mixed_step_s(target, mix_d, grid["decode_prompts"][0],
                                    OUTPUT_TOKENS * 2, mix_p, rest.reps, itl_one)
    composed = profile.step_s(mix_p, mix_d, mix_d * contexts[0])
    if mixed:
        say(f"mixed step ({mix_p} prefill + {mix_d} decodes): {np.median(mixed) * 1e3:.2f} ms "
            f"measured, {composed * 1e3:.2f} ms composed")
    return {"prefill_tokens": mix_p, "decode_seqs": mix_d, "context": contexts[0],
            "samples_s": mixed, "composed_s": composed,
            "rel_error": float(composed / np.median(mixed) - 1) if mixed else None}


def _save(profile: StepProfile, meta: dict[str, Any], out: Path, max_num_seqs: int | None,
          max_num_batched_tokens: int | None, say: Callable[[str], None],
          context_s: dict[str, list[float]] | None = None) -> dict[str, Any]:
    final = StepProfile(profile.prefill_tokens, profile.decode_seqs, profile.context_tokens,
                        profile.samples_s, meta=meta, prefill_context_s=context_s or {})
    path = final.save(out)
    fragment = write_fragment(path, meta, meta["server"], max_num_seqs,
                              max_num_batched_tokens)
    say(f"step profile: {path}\nscenario fragment: {fragment}")
    return meta


def _write_partial(signame: str, grid: dict[str, list[int]], contexts: list[int],
                   ttft: dict[int, list[float]], itl: dict[tuple[int, int], list[float]],
                   info: dict[str, Any], out: Path, max_num_seqs: int | None,
                   max_num_batched_tokens: int | None, say: Callable[[str], None]
                   ) -> dict[str, Any]:
    """After a stop signal: the profile of the points measured so far (a rectangular grid:
    the prefill lengths done, and the largest block of decode cells measured, the decode
    sizes done at every context kept, :func:`_largest_block`), marked ``meta.partial``, which
    also keeps every decode cell's samples (those outside the block too); where too few
    points were measured for that (2 prefill lengths and 2 decode points), the raw samples in
    ``OUT.partial.json`` (not a usable profile).
    """
    done_ctx, seqs = _largest_block(grid["decode_seqs"], contexts, itl)
    kept = {(d, c): itl[(d, c)] for c in done_ctx for d in seqs}
    # (a budget may have shed decode sizes from the grid after some of their cells ran:
    # those count as measured, not as planned, and stay in decode_itl_s)
    in_plan = sum(1 for d, _ in itl if d in grid["decode_seqs"])
    partial = {"stopped_by": signame, "prefill_points": len(ttft), "decode_points": in_plan,
               "planned_prefill_points": len(grid["prefill_tokens"]),
               "planned_decode_points": len(grid["decode_seqs"]) * len(contexts),
               "decode_points_shed_sizes": len(itl) - in_plan,
               "decode_cells_done": [[d, c] for d, c in itl],
               "decode_itl_s": {f"{d},{c}": v for (d, c), v in itl.items()}}
    if len(ttft) < 2 or len(kept) < 2:
        path = out.with_suffix(".partial.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "partial": partial, **{k: v for k, v in info.items() if k != "delta_s"},
            "ttft_s": {str(p): v for p, v in ttft.items()},
            "decode_itl_s": {f"{d},{c}": v for (d, c), v in itl.items()}}, default=str))
        say(f"stopped by {signame}: too few points for a profile ({len(ttft)} prefill, "
            f"{len(itl)} decode); the samples are in {path} (not a usable profile)")
        return {"partial": partial, "partial_path": str(path), "wall_s": info["wall_s"],
                "budget_s": info["budget_s"], "budget": info.get("budget")}
    part_grid = {"prefill_tokens": list(ttft), "decode_seqs": seqs}
    profile, meta = _fit(part_grid, done_ctx, ttft, kept, info.get("delta_s", 0.0))
    meta.update({"method": "endpoint", **{k: v for k, v in info.items() if k != "delta_s"},
                 "partial": partial})
    say(f"stopped by {signame}: partial profile of {len(ttft)} prefill and {len(kept)} "
        "decode points (no mixed step check)")
    return _save(profile, meta, out, max_num_seqs, max_num_batched_tokens, say)


def _largest_block(seqs: list[int], contexts: list[int],
                   itl: dict[tuple[int, int], list[float]]) -> tuple[list[int], list[int]]:
    """The contexts and decode sizes of the largest rectangular block of measured decode cells
    (most cells; then the most contexts, then the earliest): the shuffled probe leaves its
    cells scattered over the grid when a signal stops it.
    """
    best: tuple[list[int], list[int]] = (contexts[:1], [])
    for mask in range(1, 2 ** len(contexts)):
        ctxs = [c for i, c in enumerate(contexts) if mask >> i & 1]
        done = [d for d in seqs if all((d, c) in itl for c in ctxs)]
        if len(done) >= 2 and (len(ctxs) * len(done), len(ctxs)) > (
                len(best[0]) * len(best[1]), len(best[0])):
            best = (ctxs, done)
    return best


def _chunked(target: probes.Target, base: str, profile: StepProfile, chunked: list[int],
             reps: int, request_s: float) -> dict[str, list[float]]:
    """Samples of one prefill chunk at its mean start (``"n,start"`` keys, as
    :attr:`StepProfile.prefill_context_s` holds them), from prompts of ``k`` full chunks of
    ``n`` tokens: the server's prefill time (else TTFT less the request overhead) over ``k``,
    beside the profile's chunk at start 0. Chunk ``j`` starts at ``j·n``, so the mean chunk
    starts at ``n·(k − 1)/2`` and the attention to the cached prefix is linear in it.
    """
    n, k = chunked
    before = server_info.metrics(base)
    ttft = probes.prefill_ttft_s(target, n * k, reps)
    inside = server_info.histogram_mean(before, server_info.metrics(base), SERVER_PREFILL)
    totals = [inside] if inside is not None else [max(v - request_s, 1e-6) for v in ttft]
    return {f"{n},0": [profile.step_s(n, 0, 0)],
            f"{n},{n * (k - 1) // 2}": [t / k for t in totals]}


def _request_s(ttft: dict[int, list[float]], engine: dict[int, float], base_s: float
               ) -> tuple[float, str]:
    """The per-request cost outside the steps, and how it was found: the client's TTFT less
    the server's own prefill time where it reports one for every size; else the intercept of
    TTFT over prompt length (a quadratic: attention makes long prompts' TTFT curve up, and a
    straight line through them puts the intercept too low) less one decode step's base.
    """
    if engine and set(engine) == set(ttft):
        gaps = [float(np.median(v)) - engine[p] for p, v in ttft.items()]
        return max(0.0, float(np.median(gaps))), "client TTFT - server prefill time"
    ps = np.asarray(list(ttft), float)
    ys = np.asarray([np.median(v) for v in ttft.values()])
    cols = [np.ones_like(ps), ps] + ([ps**2] if ps.size >= 4 else [])
    coef, *_ = np.linalg.lstsq(np.column_stack(cols), ys, rcond=None)
    return max(0.0, float(coef[0]) - base_s), "TTFT intercept - decode step base"


def _fit(grid: dict[str, list[int]], contexts: list[int], ttft: dict[int, list[float]],
         itl: dict[tuple[int, int], list[float]], delta_s: float,
         engine: dict[int, float] | None = None) -> tuple[StepProfile, dict[str, Any]]:
    """The profile's samples and the overheads from the probes' times (``engine``: the
    server's own prefill time per prompt length, where it reports one).
    """
    rows = [[1.0, d, d * ctx] for (d, ctx) in itl]
    ys = [float(np.median(v)) - delta_s for v in itl.values()]
    (a_s, c_s, d_s), *_ = np.linalg.lstsq(np.asarray(rows), np.asarray(ys), rcond=None)
    ps = np.asarray(list(ttft), float)
    (b_s, i_s), *_ = np.linalg.lstsq(np.column_stack([ps, np.ones_like(ps)]),
                                     np.asarray([np.median(v) for v in ttft.values()]),
                                     rcond=None)
    base_s = max(float(a_s), 0.0)
    request_s, how = _request_s(ttft, engine or {}, base_s)
    samples: dict[str, list[float]] = {}
    ctx0 = contexts[0]
    for p, values in ttft.items():
        samples[StepProfile.key(p, 0, ctx0)] = [max(v - request_s, 1e-6) for v in values]
    for (d, ctx), values in itl.items():
        samples[StepProfile.key(0, d, ctx)] = [max(v - delta_s, 1e-6) for v in values]
    composed = []
    for p in grid["prefill_tokens"]:
        pre = float(np.median(samples[StepProfile.key(p, 0, ctx0)]))
        for (d, ctx), values in itl.items():
            value = pre + float(np.median(values)) - delta_s - base_s
            samples[StepProfile.key(p, d, ctx)] = [max(value, pre)]
            composed.append([p, d, ctx])
    profile = StepProfile([0, *grid["prefill_tokens"]], [0, *grid["decode_seqs"]],
                          contexts, samples)
    meta = {"overheads": {"request_ms": request_s * 1e3,
                          "per_output_token_ms": delta_s * 1e3},
            "request_overhead_method": how,
            "server_prefill_ms": {str(p): v * 1e3 for p, v in (engine or {}).items()},
            "endpoint_fit": {"decode_base_ms": a_s * 1e3, "ms_per_decode_seq": c_s * 1e3,
                             "ms_per_kv_token": d_s * 1e3, "ttft_intercept_ms": i_s * 1e3,
                             "ms_per_prefill_token": b_s * 1e3},
            "composed_cells": composed,
            "note": "cells with both prefill and decodes are composed (prefill step + decode "
                    "step - decode base); meta.mixed_check compares one with a measurement"}
    return profile, meta
