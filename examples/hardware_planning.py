"""Hardware you do not have: one model, three GPUs, one and two-way tensor parallelism.

The roofline step model (``service.kind: llm_roofline``) turns Llama-3.1-8B's config.json
and each GPU's datasheet into step times, with BLIS's coefficients fitted on real vLLM H100
runs. Decoding reads every weight once per step, so TPOT follows the memory bandwidth (H100
3.35 TB/s, A100 2.04, L40S 0.86), and two-way tensor parallelism nearly halves it; the KV
cache is sized per device as vLLM sizes it.
Run: python -m examples.hardware_planning [--quick]
"""

from __future__ import annotations

import pandas as pd

from examples._common import quick_from_argv, show
from sim.experiments import sweep

BASE = {
    "name": "hardware-planning", "warmup_s": 0,
    "service": {"kind": "llm_roofline", "model": "builtin:llama-3.1-8b", "device": "h100-sxm"},
    "workload": {"kind": "poisson", "rate_rps": 4.0, "n_requests": 400,
                 "prompt_tokens": {"dist": "lognormal", "mean": 1000, "cv": 1.0, "max": 8000},
                 "output_tokens": {"dist": "lognormal", "mean": 200, "cv": 1.0, "max": 2000}},
    "policy": {"kind": "vllm", "max_num_batched_tokens": 8192},
}


def main(quick: bool = False) -> pd.DataFrame:
    grid = {"service.device": ["h100-sxm", "a100-80gb", "l40s"], "service.tp": [1, 2],
            "workload.n_requests": [150 if quick else 400]}
    frame = sweep(BASE, grid, seeds=1, workers=1)
    if (frame["error"] != "").any():
        raise RuntimeError(frame.loc[frame["error"] != "", "error"].iloc[0])
    table = frame[["service.device", "service.tp", "ttft_ms.p50", "ttft_ms.p99",
                   "tpot_ms.p50", "tpot_ms.p99", "e2e_ms.p50"]].reset_index(drop=True)
    show(table, "Llama-3.1-8B at 4 req/s, vLLM V1 (roofline, BLIS coefficients)")
    return table


if __name__ == "__main__":
    main(quick_from_argv())
