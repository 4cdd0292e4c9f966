"""Measure an LLM decoder's step-time profile: ``servelab calibrate --model llm``.

Every grid composition (P prefill tokens as one chunk, D decodes at context L) is run
``warmup`` times untimed, then ``reps`` times timed in ``reps`` rounds, each round every
point once in its own shuffled order (so drift spreads over all points rather than biasing
some, and Ctrl-C after a round leaves a complete grid), with device synchronisation around
each timed step on CUDA. All samples are kept. ``held_out`` then measures compositions drawn
from a simulated workload's own steps and reports the profile's prediction error on them.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from calibration.llm_decoder import SHAPES, DecoderConfig, LlamaDecoder, StepEntry, dtype_of
from calibration.llm_shapes import config_for
from calibration.step_profile import StepProfile, relative_errors


@dataclass(frozen=True)
class Grid:
    """The compositions to measure."""

    prefill_tokens: tuple[int, ...]
    decode_seqs: tuple[int, ...]
    context_tokens: tuple[int, ...]

    def points(self) -> list[tuple[int, int, int]]:
        """Every (P, D, L) to measure; D = 0 points once (L does not matter)."""
        out = []
        for p in self.prefill_tokens:
            for d in self.decode_seqs:
                if d == 0:
                    if p:
                        out.append((p, 0, self.context_tokens[0]))
                    continue
                out.extend((p, d, ctx) for ctx in self.context_tokens)
        return out


# prefill chunks of n tokens at these starts (a later chunk attends to its cached prefix)
CONTEXT_CHUNKS = (64, 256, 512)
CONTEXT_STARTS = (0, 256, 1024)

CPU_GRID = Grid((0, 16, 64, 256, 512, 1024), (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
                (128, 512, 1024, 1536))
CUDA_GRID = Grid((0, 64, 256, 1024, 2048, 4096), (0, 1, 4, 16, 32, 63), (256, 1024, 3072))


class StepsInterrupted(KeyboardInterrupt):
    """Ctrl-C before every grid step had a sample: no usable profile, but what was timed.

    Attributes:
        done: Timed steps so far.
        total: Timed steps planned.
        steps: Every (P, D, L, start) planned.
        timings: Samples (s) per planned step.
    """

    def __init__(self, done: int, total: int, steps: list[tuple[int, int, int, int]],
                 timings: list[list[float]]) -> None:
        super().__init__(f"interrupted after {done} of {total} timed steps")
        self.done, self.total, self.steps, self.timings = done, total, steps, timings

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: each step's composition and samples."""
        return {"kind": "llm_step_samples_partial", "timed_steps": self.done,
                "of": self.total,
                "steps": [{"prefill_tokens": p, "decode_seqs": d, "context_tokens": ctx,
                           "prefill_start": start, "samples_s": t}
                          for (p, d, ctx, start), t in zip(self.steps, self.timings,
                                                           strict=True)]}


def entries_for(p: int, d: int, ctx: int, start: int = 0) -> list[StepEntry]:
    """A step of ``p`` prefill tokens (slot 0, from position ``start``) and ``d`` decodes at
    context ``ctx`` (slots 1..d).
    """
    out = [StepEntry(0, start, p)] if p else []
    out += [StepEntry(1 + i, ctx, 1) for i in range(d)]
    return out


def _timer(device: str) -> Callable[[Callable[[], Any]], float]:
    cuda = device.startswith("cuda")

    def timed(fn: Callable[[], Any]) -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    return timed


def build_decoder(shape: str, overrides: dict[str, Any], device: str, dtype: str,
                  threads: int | None) -> LlamaDecoder:
    """The decoder of a named shape (``small``, ``1b``, ``8b``) with parameter overrides."""
    if shape not in SHAPES:
        raise ValueError(f"--param shape={shape}: allowed: {', '.join(SHAPES)}")
    fields = set(DecoderConfig.__dataclass_fields__)
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"--param {sorted(unknown)[0]}: allowed: shape, "
                         f"{', '.join(sorted(fields))}")
    # config_for: --param hidden=1e3 reads as 1000.0, which torch refused with a TypeError
    cfg = config_for({"shape": shape, **overrides})
    if threads is not None:
        torch.set_num_threads(threads)
    return LlamaDecoder(cfg, device=device, dtype=dtype_of(dtype))


def measure_steps(decoder: LlamaDecoder, grid: Grid, *, reps: int = 5, warmup: int = 1,
                  seed: int = 0, progress: Callable[[int, int], None] | None = None,
                  held_out: Sequence[tuple[int, ...]] = ()) -> StepProfile:
    """Measure every grid point ``reps`` times (shuffled), after ``warmup`` runs each.

    Prefill chunks of :data:`CONTEXT_CHUNKS` tokens at the :data:`CONTEXT_STARTS` are timed
    too (the prefix-attention term). ``held_out`` compositions (P, D, total KV tokens[,
    prefill context]) are timed in the same shuffled session,
    so the device's drift touches them and the grid alike, but kept out of the grid: the
    profile's ``meta.held_out`` records each one's measured median, the interpolated and the
    linear prediction, and the relative errors.
    """
    cfg = decoder.cfg
    if grid.decode_seqs[-1] + 1 > cfg.max_slots or grid.context_tokens[-1] + 1 > cfg.max_len \
            or grid.prefill_tokens[-1] > cfg.max_len:
        raise ValueError(f"the grid (up to {grid.decode_seqs[-1]} decodes at context "
                         f"{grid.context_tokens[-1]}, prefill {grid.prefill_tokens[-1]}) does "
                         f"not fit the KV cache ({cfg.max_slots} slots × {cfg.max_len})")
    timed = _timer(str(decoder.k_cache.device))
    grid_points = [(p, d, ctx, 0) for p, d, ctx in grid.points()]
    chunks = [(n, 0, grid.context_tokens[0], start) for n in CONTEXT_CHUNKS
              for start in CONTEXT_STARTS if start + n <= cfg.max_len]
    extra = []
    for comp in held_out:
        p, d, kv = comp[:3]
        context = comp[3] if len(comp) > 3 else 0
        extra.append((p, d, max(1, kv // d) if d else grid.context_tokens[0],
                      min(context // p, cfg.max_len - p) if p else 0))
    everything = grid_points + chunks + extra
    timings: list[list[float]] = [[] for _ in everything]
    # rounds: each round times every step once, in its own shuffled order, so drift spreads
    # over all steps and a run stopped after round r holds r samples of every step
    rng = np.random.default_rng(seed)
    order: list[int] = []
    for _ in range(reps):
        round_ = np.arange(len(everything))
        rng.shuffle(round_)
        order += round_.tolist()
    done = 0
    try:
        for p, d, ctx, start in everything:
            for _ in range(warmup):
                decoder.step(entries_for(p, d, ctx, start))
        for k in order:
            p, d, ctx, start = everything[k]
            timings[k].append(timed(partial(decoder.step, entries_for(p, d, ctx, start))))
            done += 1
            if progress:
                progress(done, len(order))
    except KeyboardInterrupt:
        if not all(timings[k] for k in range(len(grid_points))):
            raise StepsInterrupted(done, len(order), everything, timings) from None
    points = grid.points()
    samples = {StepProfile.key(*pt): timings[k] for k, pt in enumerate(points)}
    context_samples = {f"{pt[0]},{pt[3]}": timings[len(grid_points) + k]
                       for k, pt in enumerate(chunks) if timings[len(grid_points) + k]}
    described = decoder.describe()
    meta = {"model": described, "device": device_info(str(decoder.k_cache.device)),
            "dtype": str(decoder.k_cache.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "torch_version": torch.__version__,
            "method": {"reps": reps, "warmup": warmup, "order": "shuffled", "seed": seed,
                       "sync": str(decoder.k_cache.device).startswith("cuda")},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if done < len(order):
        meta["interrupted"] = {"timed_steps": done, "of": len(order),
                               "reps_complete": done // len(everything)}
    profile = StepProfile(list(grid.prefill_tokens), list(grid.decode_seqs),
                          list(grid.context_tokens), samples, meta=meta,
                          prefill_context_s=context_samples)
    first = len(grid_points) + len(chunks)
    if any(timings[k] for k in range(first, len(everything))):
        rows = []
        for k, (p, d, ctx, start) in enumerate(extra, start=first):
            if not timings[k]:
                continue
            kv = d * ctx
            rows.append({"prefill_tokens": p, "decode_seqs": d, "kv_tokens": kv,
                         "prefill_context": p * start,
                         "measured_ms": float(np.median(timings[k])) * 1e3,
                         "predicted_ms": profile.step_s(p, d, kv, p * start) * 1e3,
                         "linear_ms": profile.linear_s(p, d, kv) * 1e3,
                         "inside_grid": bool(profile.inside(p, d, ctx))})
        measured = np.array([r["measured_ms"] for r in rows])
        profile.meta["held_out"] = {
            "rows": rows,
            "interpolated": relative_errors(np.array([r["predicted_ms"] for r in rows]),
                                            measured),
            "linear": relative_errors(np.array([r["linear_ms"] for r in rows]), measured)}
    return profile


def device_info(device: str) -> dict[str, Any]:
    """Kind and name of the device."""
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        return {"kind": "cuda", "index": index, "name": torch.cuda.get_device_name(index)}
    return {"kind": "cpu", "name": platform.processor() or platform.machine()}
