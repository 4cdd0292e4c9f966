"""A prefill on top of a cached prefix, measured on the real vLLM CPU server against the
simulator's step prices: for a grid of (new tokens n, cached tokens k) the engine's own
prefill time (``request_prefill_time_seconds``, one request at a time, the hits' window
alone: :func:`executor.endpoint.prefix_probe.cached_prefill_s`) beside the step time that
the given ``llm_linear`` services predict for the same step (one prefill chunk of ``n``
tokens starting at ``k``).

Usage: python benchmarks/prefix_prefill_grid.py [--reps 3] [--services FILE.json] [--tag T]
(``--services``: a JSON object name -> llm_linear service fields; default: the service of
``benchmarks/results/prefix_vllm-recal.json``, the model that gave +27% TTFT P50.)
Writes benchmarks/results/prefix_prefill_grid{T}.md and .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.endpoint.prefix_probe import cached_prefill_s, fit_cached_prefill  # noqa: E402
from executor.endpoint.probes import Target  # noqa: E402
from executor.endpoint.servers import VllmServer, ensure_vllm, free_port  # noqa: E402
from sim.scenario.step_time import LinearStepModel  # noqa: E402
from sim.serving.llm.step_model import Composition  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SERVER_ARGS = ("--max-num-seqs", "64", "--max-num-batched-tokens", "2048")
GRID = tuple((n, k) for k in (0, 512, 1024, 2048) for n in (32, 128, 512))


def step_ms(service: dict[str, Any], n: int, k: int) -> float:
    """The service's price of one step holding one prefill chunk of n tokens at start k."""
    fields = ("base_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms",
              "per_prefill_context_ms", "per_prefill_sq_ms")
    model = LinearStepModel(**{f: float(service[f]) for f in fields if f in service})
    comp = Composition(n, 0, 0, prefill_context=n * k, prefill_seqs=1, prefill_sq=n * n)
    return model.step_s(comp) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--services", type=Path, default=None)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.services:
        services = json.loads(args.services.read_text())
    else:
        recal = json.loads((RESULTS / "prefix_vllm-recal.json").read_text())
        services = {"recal (+27%)": recal["settings"][0]["service"]}
    t0 = time.perf_counter()
    server = VllmServer(ensure_vllm(), port=free_port(), args=SERVER_ARGS)
    server.start()
    try:
        target = Target(server.url + "/v1/completions", "tiny-llama",
                        np.random.default_rng([7, 3232]))
        got = cached_prefill_s(target, server.url, GRID, args.reps, request_s=0.005)
    finally:
        server.stop()
    fit = fit_cached_prefill(got["samples_s"])
    names = list(services)
    lines = ["# A prefill on top of a cached prefix: vLLM CPU 0.32.0 against the step model",
             "", f"Command: `fgrun python benchmarks/prefix_prefill_grid.py "
             f"{' '.join(sys.argv[1:])}` (under `fgrun`: CPU priority over the other jobs "
             f"on this shared 2-core VM; {platform.machine()}); server {' '.join(SERVER_ARGS)}"
             f", tiny model. {args.reps} hit requests per cell, one at a time; engine = the "
             "server's mean `request_prefill_time_seconds` over the cell's hits; TTFT = "
             "client median. Fit over the cells: "
             f"{fit['a_ms']:.2f} ms + {fit['ms_per_new_token']:.4f} ms × n + "
             f"{fit['ms_per_context_pair']:.3g} ms × n·k + {fit['ms_per_sq']:.3g} ms × n², "
             f"R² {fit['r2']:.4f}. "
             f"Wall {time.perf_counter() - t0:.0f} s.", "",
             "| new n | cached k | engine ms | TTFT ms (client) | fit ms | "
             + " | ".join(f"{s} ms (err)" for s in names) + " |",
             "|---|---|---|---|---|" + "---|" * len(names)]
    rows = []
    for n, k in GRID:
        key = f"{n},{k}"
        eng = float(np.median(got["samples_s"][key])) * 1e3
        ttft = float(np.median(got["ttft_s"][key])) * 1e3
        fitted = (fit["a_ms"] + fit["ms_per_new_token"] * n
                  + fit["ms_per_context_pair"] * n * k + fit["ms_per_sq"] * n * n)
        preds = {s: step_ms(services[s], n, k) for s in names}
        rows.append({"n": n, "k": k, "engine_ms": eng, "ttft_ms": ttft, "fit_ms": fitted,
                     "pred_ms": preds})
        lines.append(f"| {n} | {k} | {eng:.1f} | {ttft:.1f} | {fitted:.1f} | " + " | ".join(
            f"{p:.1f} ({100 * (p / eng - 1):+.0f}%)" for p in preds.values()) + " |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"prefix_prefill_grid{args.tag}.json").write_text(json.dumps(
        {"command": "fgrun python benchmarks/prefix_prefill_grid.py " + " ".join(sys.argv[1:]),
         "fit": fit, "services": services, "rows": rows, "raw": got}, indent=1))
    (RESULTS / f"prefix_prefill_grid{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
