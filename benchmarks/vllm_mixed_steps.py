"""Mixed steps on the real vLLM against the profile's price: from a ``fidelity_vllm.py`` run's
bench directories (no server needed), every step in which one request's whole prompt
prefilled while others decoded, timed from the decoding streams' own chunks, over what the
stored step profile prices that step at (prefill tokens, decoding sequences, their KV
tokens), grouped by the prompt's length; and the steps with no prefill pending (no request between
its arrival and its first token), by the number of decoding sequences, priced the same way.

A step is found from the client's side: request ``N``'s first token arrives at ``t``; each
request decoding then has a chunk within 3 ms of ``t`` (the same step's output), and the gap
from its previous chunk is that step's time as the stream saw it. Only prompts that fit one
step (at most ``--max-num-batched-tokens``) count, and steps where two prefills end together
are left out.

Usage: python benchmarks/vllm_mixed_steps.py --out /tmp/servelab-fidelity-vllm [--tag T]
Writes benchmarks/results/vllm_mixed_steps.md (``-T`` with ``--tag``).
This reads every token of every run: it takes about a minute per point on a loaded machine.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.step_profile import StepProfile, load_step_profile  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SAME_STEP_S = 0.003
BUCKETS = (0, 128, 300, 700, 2048)
DECODE_BUCKETS = (0, 1, 2, 4, 8, 16, 64)


def run_steps(run: Path, profile: StepProfile, batched: int) -> list[dict[str, float]]:
    """The mixed and the decode-only steps of one bench run, timed and priced."""
    rq = pd.read_parquet(run / "requests.parquet")
    rq = rq[rq.status == "ok"]
    tk = pd.read_parquet(run / "tokens.parquet")
    times = {int(i): g.sort_values("index").time_s.to_numpy() for i, g in tk.groupby("id")}
    firsts = rq.first_token_s.to_numpy()
    rows = []
    for n in rq.itertuples():
        t_new = float(n.first_token_s)
        if n.prompt_tokens > batched or (np.abs(firsts - t_new) < SAME_STEP_S).sum() > 1:
            continue
        gaps, kv = [], 0
        for r in rq.itertuples():
            t = times.get(int(r.id))
            if r.id == n.id or t is None or not (r.first_token_s < t_new - 1e-4 < r.finish_s):
                continue
            k = int(np.argmin(np.abs(t - t_new)))
            if k == 0 or abs(t[k] - t_new) > SAME_STEP_S:
                break  # a stream that got no token in this step: not one step
            gaps.append(t[k] - t[k - 1])
            kv += int(r.prompt_tokens) + k
        else:
            if gaps:
                d = len(gaps)
                rows.append({"prompt": int(n.prompt_tokens), "decodes": d,
                             "measured_ms": float(np.median(gaps)) * 1e3,
                             "priced_ms": profile.step_s(n.prompt_tokens, d, kv) * 1e3})
    return rows


def decode_steps(run: Path, profile: StepProfile) -> list[dict[str, float]]:
    """Steps with no prefill pending, once each: the gap between two chunks of a stream
    when no request lay between its arrival and its first token, priced at the decodes then.
    """
    rq = pd.read_parquet(run / "requests.parquet")
    rq = rq[rq.status == "ok"]
    tk = pd.read_parquet(run / "tokens.parquet")
    times = {int(i): g.sort_values("index").time_s.to_numpy() for i, g in tk.groupby("id")}
    arrive, first = rq.arrival_s.to_numpy(), rq.first_token_s.to_numpy()
    finish, prompt, ids = rq.finish_s.to_numpy(), rq.prompt_tokens.to_numpy(), rq.id.to_numpy()
    seen: set[float] = set()
    rows = []
    for t in times.values():
        for k in range(1, len(t)):
            key = round(float(t[k]), 3)
            if key in seen or ((arrive < t[k]) & (first > t[k - 1] - 1e-4)).any():
                continue
            seen.add(key)
            decoding = np.flatnonzero((first < t[k - 1] + 1e-4) & (finish > t[k] - 1e-4))
            kv = sum(int(prompt[j]) + int(np.searchsorted(times[int(ids[j])], t[k]))
                     for j in decoding)
            rows.append({"decodes": len(decoding), "measured_ms": (t[k] - t[k - 1]) * 1e3,
                         "priced_ms": profile.step_s(0, len(decoding), kv) * 1e3})
    return rows


def collect(out: Path, decode: bool = False) -> pd.DataFrame:
    """Every point's mixed steps (``decode``: decode-only steps) under ``out``
    (``profile-B.json``, ``bB-rhoR/bench-i``).
    """
    rows = []
    for prof_path in sorted(out.glob("profile-*.json")):
        batched = int(re.findall(r"profile-(\d+)\.json", prof_path.name)[0])
        profile = load_step_profile(prof_path)
        for run in sorted(out.glob(f"b{batched}-rho*/bench-*")):
            rho = float(run.parent.name.split("rho")[1])
            got = decode_steps(run, profile) if decode else run_steps(run, profile, batched)
            rows += [{"batched": batched, "rho": rho, **r} for r in got]
    return pd.DataFrame(rows)


def report(frame: pd.DataFrame, decode: pd.DataFrame, out: Path, command: str) -> list[str]:
    """The markdown tables: per setting and prompt length (mixed steps), and per setting, ρ
    and decodes (decode-only steps), measured over priced.
    """
    lines = ["# Mixed steps on the real vLLM against the step profile's price", "",
             f"Command: `{command}` (reads the bench runs of `{out}`; no server).", "",
             __doc__.split("\n\n")[1].replace("\n", " ").replace("``", "`"), "",
             "| batched tokens | prompt tokens | steps | decodes (median) | measured ms "
             "(median) | priced ms (median) | measured / priced: median (IQR) |",
             "|---|---|---|---|---|---|---|"]
    if frame.empty:
        lines.append("| (none found) | | | | | | |")
    else:
        frame = frame.assign(bucket=pd.cut(frame.prompt, BUCKETS))
        for (batched, bucket), g in frame.groupby(["batched", "bucket"], observed=True):
            lines.append(f"| {batched} | {bucket.left + 1}–{bucket.right} | {len(g)} | "
                         f"{g.decodes.median():.0f} | {g.measured_ms.median():.1f} | "
                         f"{g.priced_ms.median():.1f} | {_ratio(g)} |")
    lines += ["", "Decode-only steps (no prefill pending), by decoding sequences:", "",
              "| batched tokens | ρ | decodes | steps | measured ms (median) | priced ms (median) "
              "| measured / priced: median (IQR) |", "|---|---|---|---|---|---|---|"]
    if not decode.empty:
        decode = decode.assign(bucket=pd.cut(decode.decodes, DECODE_BUCKETS))
        for (batched, rho, bucket), g in decode.groupby(["batched", "rho", "bucket"],
                                                        observed=True):
            size = f"{bucket.right}" if bucket.right == bucket.left + 1 else \
                f"{bucket.left + 1}–{bucket.right}"
            lines.append(f"| {batched} | {rho:g} | {size} | {len(g)} "
                         f"| {g.measured_ms.median():.2f} | {g.priced_ms.median():.2f} | "
                         f"{_ratio(g)} |")
    return lines


def _ratio(g: pd.DataFrame) -> str:
    """Median (IQR) of measured over priced."""
    q1, q2, q3 = np.percentile(g.measured_ms / g.priced_ms, [25, 50, 75])
    return f"{q2:.3f} ({q1:.3f}–{q3:.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="a fidelity_vllm.py --out folder")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if not args.out.is_dir():
        sys.exit(f"--out {args.out}: no such folder (a fidelity_vllm.py --out folder)")
    command = "python " + " ".join(["benchmarks/vllm_mixed_steps.py", *sys.argv[1:]])
    lines = report(collect(args.out), collect(args.out, decode=True), args.out, command)
    path = RESULTS / f"vllm_mixed_steps{'-' + args.tag if args.tag else ''}.md"
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    main()
