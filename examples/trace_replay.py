"""Replay the Azure LLM conversation trace scaled to a target utilisation.

The trace (builtin:azure_llm_2023_conv.csv, shipped in servelab/data/, CC-BY 4.0 — see
servelab/data/README.md)
holds one hour of real arrivals. ``time_scale`` compresses or stretches it so that the mean
rate gives the target utilisation on builtin:minilm-cpu with no batching; its bursts stay.
Run from the repository root: python -m examples.trace_replay [--quick]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from calibration.profile import load_profile
from examples._common import quick_from_argv, show
from sim.drivers.simulate import run

TRACE = Path(__file__).resolve().parents[1] / "servelab" / "data" / "azure_llm_2023_conv.csv"


def main(quick: bool = False) -> pd.DataFrame:
    frame = pd.read_csv(TRACE, usecols=["TIMESTAMP"])
    stamps = pd.to_datetime(frame["TIMESTAMP"], format="mixed")
    trace_rate = len(frame) / (stamps.max() - stamps.min()).total_seconds()
    capacity = 1.0 / load_profile("builtin:minilm-cpu").median_s(1)
    rows = []
    for rho in ([0.5, 0.8] if quick else [0.3, 0.5, 0.7, 0.8, 0.9]):
        time_scale = trace_rate / (rho * capacity)
        s = run({"seed": 8, "service": {"kind": "profile", "path": "builtin:minilm-cpu"},
                 "workload": {"kind": "trace", "path": str(TRACE), "time_scale": time_scale,
                              "n_requests": 2_000 if quick else 19_000},
                 "policy": {"kind": "none"}}).summary
        rows.append({"target_rho": rho, "time_scale": time_scale,
                     "utilization": s["utilization"], "p50_ms": s["latency_ms"]["p50"],
                     "p99_ms": s["latency_ms"]["p99"], "queue_len_max": s["queue_len"]["max"]})
    table = pd.DataFrame(rows)
    show(table, "Azure conversation trace on builtin:minilm-cpu, no batching", digits=3)
    return table


if __name__ == "__main__":
    main(quick_from_argv())
