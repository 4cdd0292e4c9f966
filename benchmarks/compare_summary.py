"""Summarise ``servelab compare`` directories (``compare.json``) side by side: per metric the
prediction's error against the live median, the live spread, and the probes' per-size
ratios; for recording before/after checks such as the dyn-demo probe re-run.

    python benchmarks/compare_summary.py NAME=DIR [NAME=DIR ...] --out results/x.md \
        [--title TITLE] [--command CMD]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEYS = ("latency_ms.mean", "latency_ms.p50", "latency_ms.p99", "queue_ms.mean",
        "mean_batch_size", "utilization", "throughput_rps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="NAME=DIR pairs")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="compare runs")
    ap.add_argument("--command", default="")
    args = ap.parse_args()
    lines = [f"# {args.title}", ""]
    if args.command:
        lines += [f"Command: `{args.command}`", ""]
    lines += ["error = (prediction - live median) / live median; spread = (live max - min) / "
              "median over the repeats.", "",
              "| run | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 1) + "|"]
    probes = []
    for pair in args.runs:
        name, _, folder = pair.partition("=")
        data = json.loads((Path(folder) / "compare.json").read_text())
        rows = {r["metric"]: r for r in data["rows"]}
        cells = [f"{rows[k]['rel_error']:+.1%} ({rows[k]['live_spread_rel']:.0%})"
                 for k in KEYS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for p in data.get("probes", []):
            sizes = {s["batch_size"]: s["ratio"] for side in ("before", "after")
                     for s in p[side]["sizes"]}
            probes.append(f"| {name} | {p['repeat']} | {p['scale']:.3f} | "
                          + ", ".join(f"{b}: {r:.2f}" for b, r in sorted(sizes.items()))
                          + f" | {p['drift']:+.1%} |")
    lines += ["", "Probes (pooled scale; the last ratio found per size, before or after the "
              "run; drift of the pooled scale):", "",
              "| run | repeat | pooled scale | ratio by batch size | drift |",
              "|---|---|---|---|---|", *probes]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
