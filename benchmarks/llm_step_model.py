"""The LLM step model's error on held-out steps drawn from the Azure trace.

Measures the decoder's step profile (as ``servelab calibrate --model llm`` does) with 30
held-out compositions timed in the same shuffled session, then tabulates, per held-out step,
the measured median, the interpolated prediction and the linear fit's, with the median and p90
|error| of each. ``--profile PATH|builtin:NAME`` tabulates a profile already measured (its
``meta.held_out``) instead of measuring again.

Usage: python benchmarks/llm_step_model.py [--device cpu] [--threads 1] [--reps 5]
       [--profile builtin:llm-small-cpu]
Writes benchmarks/results/llm_step_model-<device>.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.step_profile import StepProfile, load_step_profile  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def measured(device: str, threads: int, reps: int) -> StepProfile:
    """A fresh measurement of the default shape on ``device``."""
    from rich.console import Console

    from servelab.calibrate_llm import run_step_calibration

    out = RESULTS / f"llm_step_model-{device}.json"
    return run_step_calibration(device=device, dtype="fp32" if device == "cpu" else "bf16",
                                threads=threads, reps=reps, warmup=1, seed=0, params={},
                                out=out, console=Console())


def table(profile: StepProfile, source: str) -> str:
    """The held-out table as markdown."""
    held = profile.meta["held_out"]
    meta = profile.meta
    lines = [f"# LLM step model: held-out error ({source})", "",
             f"Decoder: {meta['model']['params']} ({meta['model'].get('parameters', 0):,} "
             f"parameters) on {meta['device'].get('name')} ({meta['device'].get('kind')}), "
             f"{meta['dtype']}, {meta['threads']} threads; grid {len(profile.samples_s)} "
             f"compositions × {meta['method']['reps']} reps, shuffled; measured "
             f"{meta['created_at']}.", "",
             "Held-out steps: 30 compositions drawn from the Azure conversation trace simulated "
             "under vLLM with the grid's limits, timed in the same shuffled session.", "",
             "| | median abs error | p90 | max |", "|---|---:|---:|---:|"]
    for name in ("interpolated", "linear"):
        e = held[name]
        lines.append(f"| {name} | {e['median']:.1%} | {e['p90']:.1%} | {e['max']:.1%} |")
    fit = profile.fit
    lines += ["", "Targets (CPU): median ≤ 5%, p90 ≤ 10% for the interpolated model.", "",
              f"Linear fit: {fit['a_ms']:.3f} ms + {fit['b_ms_per_prefill_token']:.5f} ms × "
              f"prefill tokens + {fit['c_ms_per_decode_seq']:.4f} ms × decodes + "
              f"{fit['d_ms_per_kv_token']:.7f} ms × KV tokens (R² {fit['r2']:.3f} on the "
              "grid).", "",
              "| prefill tokens | decodes | KV tokens | measured ms | interpolated ms | "
              "linear ms |", "|---:|---:|---:|---:|---:|---:|"]
    for r in held["rows"]:
        lines.append(f"| {r['prefill_tokens']} | {r['decode_seqs']} | {r['kv_tokens']} | "
                     f"{r['measured_ms']:.2f} | {r['predicted_ms']:.2f} | "
                     f"{r['linear_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", default=None)
    args = ap.parse_args()
    if args.profile:
        profile, source = load_step_profile(args.profile), args.profile
    else:
        profile, source = measured(args.device, args.threads, args.reps), "measured now"
    kind = profile.meta["device"].get("kind", args.device)
    text = table(profile, source)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"llm_step_model-{kind}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
