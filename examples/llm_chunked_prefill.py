"""Chunked prefill: the per-step token budget trades TTFT against TPOT (vLLM, Sarathi).

On the Azure conversation trace at twice its rate (builtin:llm-demo: prompts of ~1,150
tokens, outputs of ~210), a large budget prefills a whole prompt in one step, so the decodes sharing that step
stall behind it (TPOT's tail grows); a small budget spreads each prompt over several steps,
so decodes keep flowing but the first token comes later (TTFT grows).
Run: python -m examples.llm_chunked_prefill [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.experiments import sweep


def main(quick: bool = False) -> pd.DataFrame:
    budgets = [256, 1024, 8192] if quick else [256, 512, 1024, 2048, 4096, 8192]
    base = "builtin:llm-demo"
    grid = {"policy.max_num_batched_tokens": budgets,
            "workload.n_requests": [1500 if quick else 8000], "workload.rate_scale": [2.0],
            "warmup_s": [10]}
    frame = sweep(base, grid, seeds=1, workers=1)
    if (frame["error"] != "").any():
        raise RuntimeError(frame.loc[frame["error"] != "", "error"].iloc[0])
    table = frame[["policy.max_num_batched_tokens", "ttft_ms.p50", "ttft_ms.p99",
                   "tpot_ms.p50", "tpot_ms.p99", "itl_ms.p99", "throughput_rps"]]
    show(table.reset_index(drop=True), "chunked prefill on builtin:llm-demo (vLLM V1)")
    return table.reset_index(drop=True)


if __name__ == "__main__":
    main(quick_from_argv())
