"""The probe plan of ``calibrate --endpoint`` (:mod:`executor.endpoint.calibrate`): the grid
of prompt lengths, decode batch sizes and contexts within the server's limits, the seeded
order the decode cells are probed in, how many runs each decode cell takes, and the time the
plan takes, so it can be sized to the budget.
"""

from __future__ import annotations

import math

import numpy as np

from executor.endpoint import prefix_probe, probes
from executor.endpoint.server_info import EndpointError

# 512 between 256 and 1,024: attention makes a prefill step's time curve up with its length,
# and the profile interpolates straight between grid points. Without it the tiny vLLM's
# ~400-token prefills (a 2,048-token budget runs each in one step) were priced 14% high,
# mixed with decodes or not (measured 57 ms against 65; benchmarks/results/fidelity_vllm.md)
PREFILL_TOKENS = (16, 64, 256, 512, 1024)
DECODE_SEQS = (1, 2, 4, 8, 16, 32)  # busy chunked servers run 20-30 decodes (linear model beyond)
# contexts 64, 544 and 1,120: a 1,024-token prompt's decodes lie inside the grid (beyond its
# longest context a step falls back to the linear model)
DECODE_PROMPTS = (32, 512, 1088)
OUTPUT_TOKENS = 64
CHUNKS = 4  # chunks of the chunked-prefill probe's prompt
MIN_REPS = 3
# One to four decoding sequences: three times the samples. Five per one-sequence cell left
# the tiny vLLM's cells 15-30% apart between two calibrations of the same server, and TPOT
# at ρ 0.3 is those cells' value
SMALL_BATCH_REPS = 3
DECODE_ORDER_STREAM = 2828  # the decode order's own random stream beside the prompts' (2929)

def plan_grid(max_model_len: int, max_num_seqs: int | None,
              max_num_batched_tokens: int | None) -> dict[str, list[int]]:
    """The probe grid within the server's limits (``chunked``: chunk tokens and count of
    the chunked-prefill probe, where the token budget splits long prompts; else empty).
    """
    cap = cap_len = max_model_len - 2
    if max_num_batched_tokens:
        cap = min(cap, max_num_batched_tokens)
    prefill = [p for p in PREFILL_TOKENS if p <= cap]
    seqs = [d for d in DECODE_SEQS if d <= (max_num_seqs or DECODE_SEQS[-1])]
    prompts = [p for p in DECODE_PROMPTS if p + OUTPUT_TOKENS <= max_model_len]
    if len(prefill) < 2 or len(seqs) < 2 or not prompts:
        raise EndpointError(f"the server's limits (max_model_len {max_model_len}, "
                            f"--max-num-seqs {max_num_seqs}, --max-num-batched-tokens "
                            f"{max_num_batched_tokens}) leave too few probe points: need "
                            "prompts of 64 tokens and 2 sequences at least")
    grid = {"prefill_tokens": prefill, "decode_seqs": seqs, "decode_prompts": prompts,
            "chunked": []}
    if max_num_batched_tokens and 2 * max_num_batched_tokens <= min(PREFILL_TOKENS[-1], cap_len):
        # a prompt of k full chunks: its later chunks attend to the cached earlier ones
        k = min(CHUNKS, cap_len // max_num_batched_tokens, PREFILL_TOKENS[-1]
                // max_num_batched_tokens)
        grid["chunked"] = [max_num_batched_tokens, k]
    return grid


def decode_order(grid: dict[str, list[int]], seed: int) -> list[tuple[int, int]]:
    """The decode cells ``(prompt tokens, sequences)`` of ``grid`` in the order they are
    probed: every cell once, shuffled by ``seed`` (the same seed, the same order).

    Probed context by context, a machine whose speed drifts during the probe (a job starting
    beside it, a CPU clocking down) would put the drift into the context term, where the
    fit's residuals cannot show it; shuffled, the drift is scatter about the fit, which its
    residuals and standard errors do show.

    The one-sequence cell at the shortest context comes first: beside it the server's own
    ITL is read, which sets the per-output-token overhead, so a probe stopped early still
    has it.
    """
    cells = [(p, d) for p in grid["decode_prompts"] for d in grid["decode_seqs"]]
    order = np.random.default_rng([seed, DECODE_ORDER_STREAM]).permutation(len(cells))
    shuffled = [cells[int(i)] for i in order]
    first = (grid["decode_prompts"][0], 1)
    return [first] + [c for c in shuffled if c != first] if first in shuffled else shuffled


def _runs(seqs: int, reps: int, small_reps: int = SMALL_BATCH_REPS) -> int:
    """Decode runs at ``seqs`` sequences: enough for ``reps`` per-stream samples, and
    ``small_reps`` times that for batches of up to ``probes.SMALL_BATCH`` (at low load
    most steps decode one to four sequences: their cells set TPOT).
    """
    want = reps * (small_reps if seqs <= probes.SMALL_BATCH else 1)
    return max(1, math.ceil(want / seqs))


def prefill_point_s(prompt_tokens: int, reps: int, ttft_s: float, itl_s: float,
                    long_tokens: int) -> float:
    """Seconds one prefill point takes: ``reps`` one-token requests at the long prompt's
    speed per token (``ttft_s`` over ``long_tokens``), each at least one decode step.
    """
    return reps * max(prompt_tokens * ttft_s / long_tokens, itl_s)


def decode_cell_s(seqs: int, prompt_tokens: int, reps: int, ttft_s: float, itl_s: float,
                  long_tokens: int, small_reps: int = SMALL_BATCH_REPS) -> float:
    """Seconds one decode cell takes (decode steps assumed to grow linearly with sequences,
    by a quarter step each; each batch prefills its ``seqs`` prompts at the long prefill's
    speed per token; a lone stream's run is one batch, a larger one's a short and a long
    batch).
    """
    per_token_s = ttft_s / long_tokens
    step = (1.25 if seqs > 1 else 1.0) * OUTPUT_TOKENS * itl_s * (1 + seqs / 4)
    prefills = (2 if seqs > 1 else 1) * max(ttft_s, seqs * prompt_tokens * per_token_s)
    return _runs(seqs, reps, small_reps) * (step + prefills)


def chunked_s(chunked: list[int], reps: int, ttft_s: float) -> float:
    """Seconds the chunked-prefill probe takes (none where ``chunked`` is empty)."""
    return reps * ttft_s * chunked[1] if chunked else 0.0


def mixed_s(itl_s: float) -> float:
    """Seconds the mixed step check takes: its decodes' twice-long outputs, twice over."""
    return OUTPUT_TOKENS * 2 * itl_s * 2


def estimate_s(grid: dict[str, list[int]], reps: int, ttft_s: float, itl_s: float,
               small_reps: int = SMALL_BATCH_REPS,
               cells: list[list[int]] | None = None) -> float:
    """Seconds the plan takes at ``reps``, from one long prefill's TTFT and one sequence's
    ITL: the sum of its steps' estimates (:func:`prefill_point_s`, :func:`decode_cell_s`,
    :func:`chunked_s`, the cached-prefix probe's ``cells``, :func:`mixed_s`), with
    ``small_reps`` times the samples for the small batches.
    """
    long_tokens = grid["prefill_tokens"][-1]
    # each prompt at the long one's speed per token, at least one decode step: an estimate,
    # not a bound (attention makes shorter prompts cheaper per token, their fixed request
    # cost dearer); not every size at the longest one's TTFT, which counted the 512-token
    # point as a whole 1,024-token prefill more
    prefill = sum(prefill_point_s(p, reps, ttft_s, itl_s, long_tokens)
                  for p in grid["prefill_tokens"])
    decode = sum(decode_cell_s(d, p, reps, ttft_s, itl_s, long_tokens, small_reps)
                 for d in grid["decode_seqs"] for p in grid["decode_prompts"])
    cached = prefix_probe.estimate_s(cells or [], reps, ttft_s / long_tokens)
    return prefill + decode + chunked_s(grid["chunked"], reps, ttft_s) + cached + \
        mixed_s(itl_s)


def mixed_point(grid: dict[str, list[int]], max_num_batched_tokens: int | None
                ) -> tuple[int, int]:
    """(prefill tokens, decodes) of the mixed-step check: the third grid sizes, with the
    prefill cut to what the token budget leaves beside the decodes. A server schedules its
    running decodes first, so a 256-token prompt among 4 decodes under a 256-token budget
    prefills as 252 + 4 tokens, and its first token comes after the 4-token step (the check
    then timed a 6 ms step against a 34 ms price).
    """
    d = grid["decode_seqs"][min(2, len(grid["decode_seqs"]) - 1)]
    p = grid["prefill_tokens"][min(2, len(grid["prefill_tokens"]) - 1)]
    if max_num_batched_tokens:
        p = min(p, max_num_batched_tokens - d)
    return p, d
