"""What the live engine's KV reuse costs on the CPU decoder: copying cached prefix blocks
into a slot (and computed blocks into the block store) against the prefill it saves, and
against the alternative of slots that read shared blocks in place.

The decoder keeps each sequence's KV in one contiguous slot, which attention reads directly.
Reusing a cached prefix then means either

* **copy** (what :mod:`executor.llm_driver` does): ``load_blocks`` copies the prefix's blocks
  into the slot once, when the sequence is admitted, and ``save_blocks`` copies each newly
  computed full prompt block into the store once; or
* **share**: the slot holds only block ids and every step gathers the context's blocks into
  a contiguous tensor before attention (scaled_dot_product_attention needs one), i.e. a copy
  of the whole context at every step of the sequence, which this script times as the
  gather of one decode step.

Per token it times: load (copy in), save (copy out), a prefill of the same tokens (what a
hit saves), and the per-step gather. Usage:
``python benchmarks/prefix_kv_copy.py [--tokens 1024] [--reps 20]``; writes
benchmarks/results/prefix_kv_copy.md and .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from calibration.llm_decoder import SHAPES, LlamaDecoder, StepEntry  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
BLOCK = 16


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    """Seconds per call, ``reps`` calls after one warm-up call."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the live engine's setting on this machine
    n = args.tokens // BLOCK * BLOCK
    cfg = SHAPES["small"]
    dec = LlamaDecoder(cfg)
    dec.attach_block_store(4 * n // BLOCK, BLOCK)
    blocks = list(range(n // BLOCK, 2 * n // BLOCK))  # not the first: a used pool's ids
    pairs = list(enumerate(blocks))
    dec.step([StepEntry(0, 0, n)])  # slot 0's KV, then the store's blocks
    dec.save_blocks(0, pairs)
    hd = cfg.head_dim

    def gather() -> torch.Tensor:  # one decode step's gather of its context, every layer
        index = torch.tensor(blocks)
        out = None
        for li in range(cfg.layers):
            for store in (dec.k_blocks, dec.v_blocks):
                out = store[li, index].transpose(0, 1).reshape(cfg.kv_heads, n, hd)
        assert out is not None
        return out

    rows = {
        "load (copy in)": timed(lambda: dec.load_blocks(1, blocks), args.reps),
        "save (copy out)": timed(lambda: dec.save_blocks(0, pairs), args.reps),
        "prefill (saved by a hit)": timed(lambda: dec.step([StepEntry(2, 0, n)]),
                                          max(3, args.reps // 4)),
        "share: gather per decode step": timed(gather, args.reps),
        "decode step (context n)": timed(lambda: dec.step([StepEntry(0, n, 1)]), args.reps),
    }
    stats = {k: {"median_us_per_token": 1e6 * statistics.median(v) / n,
                 "min_us_per_token": 1e6 * min(v) / n, "max_us_per_token": 1e6 * max(v) / n,
                 "median_ms": 1e3 * statistics.median(v), "samples": len(v)}
             for k, v in rows.items()}
    command = "fgrun python benchmarks/prefix_kv_copy.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"prefix_kv_copy{args.tag}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"command": command, "tokens": n, "block_size": BLOCK, "shape": "small",
         "kv_bytes_per_token": cfg.kv_bytes_per_token(4), "threads": 1, "stats": stats},
        indent=1))
    load = stats["load (copy in)"]["median_us_per_token"]
    save = stats["save (copy out)"]["median_us_per_token"]
    pre = stats["prefill (saved by a hit)"]["median_us_per_token"]
    gat = stats["share: gather per decode step"]["median_ms"]
    dec_ms = stats["decode step (context n)"]["median_ms"]
    lines = ["# KV reuse on the CPU decoder: copy or share", "",
             f"Command: `{command}` (under `fgrun`: CPU priority on the shared 2-core VM; "
             f"{platform.machine()}, torch {torch.__version__}, 1 thread). Decoder: the "
             f"`small` shape (fp32, {cfg.kv_bytes_per_token(4)} KV bytes per token), "
             f"{n} tokens = {n // BLOCK} blocks of {BLOCK}; median of {args.reps} calls "
             "(min–max beside it).", "",
             "| operation | µs per token (median) | min–max | ms per call |",
             "|---|---|---|---|"]
    for k, v in stats.items():
        lines.append(f"| {k} | {v['median_us_per_token']:.3f} | "
                     f"{v['min_us_per_token']:.3f}–{v['max_us_per_token']:.3f} | "
                     f"{v['median_ms']:.3f} |")
    lines += ["", f"A hit of {n} tokens costs {load:.3f} µs/token to copy in (plus "
              f"{save:.3f} µs/token, once, when the block was first computed) against "
              f"{pre:.1f} µs/token of prefill saved: {100 * (load + save) / pre:.1f}% of "
              "it. Sharing the blocks in place would gather the context at every step: "
              f"{gat:.3f} ms per decode step at this context, "
              f"{100 * gat / dec_ms:.0f}% of the decode step itself ({dec_ms:.2f} ms), paid "
              "at every one of the sequence's steps. Copying is what the live engine does."]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
