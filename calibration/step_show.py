"""``servelab profile show`` for an LLM step profile: its decoder, fit, held-out error, grid."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from calibration.step_profile import StepProfile, builtin_step_profiles, load_step_profile
from sim.builtin import BUILTIN_PREFIX


def is_step_profile(ref: str) -> bool:
    """Whether ``ref`` names an LLM step profile (a shipped one, or a JSON file of kind
    ``llm_step_profile``); anything else is left to the request-level loader and its errors.
    """
    if ref.startswith(BUILTIN_PREFIX):
        return ref[len(BUILTIN_PREFIX):] in builtin_step_profiles()
    path = Path(ref)
    if not path.is_file():
        return False
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == "llm_step_profile"


def _median_ms(profile: StepProfile, p: int, d: int, ctx: int) -> str:
    samples = profile.samples_s.get(profile.key(p, d, ctx if d else profile.context_tokens[0]))
    return "–" if not samples else f"{float(np.median(samples)) * 1e3:.2f}"


def show_step_profile(ref: str, console: Console) -> StepProfile:
    """Print a step profile: what was measured, the linear fit, its held-out error, and the
    median step time (ms) over the grid: prefill alone, and decodes by context length.
    """
    profile = load_step_profile(ref)
    meta = profile.meta
    model = meta.get("model") or {}
    params = model.get("params") or {}
    shape = meta.get("shape", "?")
    console.print(f"[bold]{ref}[/]: LLM step profile of a decoder "
                  f"(shape {shape}: {', '.join(f'{k} {v}' for k, v in params.items())}; "
                  f"{model.get('parameters', 0):,} parameters) on "
                  f"{(meta.get('device') or {}).get('name', '?')}, {meta.get('dtype')}, "
                  f"{meta.get('threads')} threads, torch {meta.get('torch_version')}",
                  soft_wrap=True)
    fit = profile.fit
    if fit:
        console.print(f"fit: {fit['a_ms']:.3f} ms + {fit['b_ms_per_prefill_token']:.5f} "
                      f"ms/prefill token + {fit['c_ms_per_decode_seq']:.4f} ms/decode + "
                      f"{fit['d_ms_per_kv_token']:.7f} ms/KV token (R² {fit['r2']:.3f})",
                      soft_wrap=True)
    held = meta.get("held_out") or {}
    if held.get("interpolated"):
        i, lin = held["interpolated"], held["linear"]
        console.print(f"held-out steps ({i['n']}): interpolated |error| median "
                      f"{i['median']:.1%}, p90 {i['p90']:.1%}; linear fit median "
                      f"{lin['median']:.1%}, p90 {lin['p90']:.1%}", soft_wrap=True)
    prefill = Table(title="prefill alone (no decodes): median step ms")
    prefill.add_column("prefill tokens", justify="right")
    prefill.add_column("median ms", justify="right")
    for p in profile.prefill_tokens[1:]:
        prefill.add_row(str(p), _median_ms(profile, p, 0, 0))
    console.print(prefill)
    decode = Table(title="decodes alone (no prefill): median step ms by context tokens")
    decode.add_column("decodes", justify="right")
    for ctx in profile.context_tokens:
        decode.add_column(f"ctx {ctx}", justify="right")
    for d in profile.decode_seqs[1:]:
        decode.add_row(str(d), *[_median_ms(profile, 0, d, ctx)
                                 for ctx in profile.context_tokens])
    console.print(decode)
    return profile
