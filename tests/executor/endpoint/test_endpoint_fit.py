"""The endpoint calibration's fit and the bench's prompts, without a server: fresh prompts
per salt, histogram buckets from ``/metrics``, the per-request overhead from the server's own
prefill time or a curved TTFT intercept, the chunked-prefill probe's plan and its fit, the
decode probe's estimators, and the seeded order of its cells.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration.step_profile import StepProfile
from executor.endpoint import probes
from executor.endpoint.bench import make_jobs
from executor.endpoint.calibrate import (
    SMALL_BATCH_REPS,
    _fit,
    _largest_block,
    _request_s,
    _runs,
    estimate_s,
    plan_grid,
)
from executor.endpoint.calibrate_plan import decode_order, mixed_point
from executor.endpoint.client import Job, Outcome
from executor.endpoint.compare_endpoint import _geomean
from executor.endpoint.probes import (
    MAX_EXTRA_TOKENS,
    SMALL_BATCH,
    Target,
    _after_prefills_s,
    _overlap_tokens,
)
from executor.endpoint.server_info import parse_metrics

PAGE = """# HELP vllm:iteration_tokens_total Number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="m"} 25.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 30.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 30.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 400.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="m"} 1.0
"""


def _jobs(salt: int) -> list[list[int]]:
    arrival = np.arange(20, dtype=float)
    prompt = np.full(20, 200)
    jobs = make_jobs(arrival, prompt, np.full(20, 4), "openai-completions", 3, (10, 250),
                     salt=salt)
    return [list(j.prompt) for j in jobs]  # type: ignore[arg-type]


def test_a_salt_gives_other_prompts_of_the_same_lengths_and_zero_keeps_the_seeds() -> None:
    plain, again, salted = _jobs(0), _jobs(0), _jobs(7)
    assert plain == again  # the seed alone decides the ids
    assert [len(p) for p in salted] == [len(p) for p in plain]
    # no salted prompt shares its first 128-token block (vLLM CPU's block) with a plain one
    heads = {tuple(p[:128]) for p in plain}
    assert not any(tuple(p[:128]) in heads for p in salted)
    assert _jobs(7) == salted  # a recorded salt reproduces the run's prompts


def test_histogram_buckets_are_kept_by_bound_and_summed_over_engines() -> None:
    page = parse_metrics(PAGE)
    assert page["buckets"]["iteration_tokens_total"] == {"1.0": 11.0, "8.0": 25.0,
                                                         "+Inf": 30.0}
    assert page["values"]["iteration_tokens_total_sum"] == 400.0
    assert "iteration_tokens_total_bucket" not in page["values"]


def test_request_overhead_is_ttft_less_the_servers_prefill_time() -> None:
    ttft = {16: [0.021, 0.020, 0.022], 64: [0.026, 0.025], 256: [0.052]}
    engine = {16: 0.013, 64: 0.018, 256: 0.044}
    request_s, how = _request_s(ttft, engine, base_s=0.004)
    assert request_s == pytest.approx(0.008)
    assert "server prefill" in how
    # a size the server did not report: the intercept instead
    _, how = _request_s(ttft, {16: 0.013}, base_s=0.004)
    assert "intercept" in how


def test_without_server_times_a_curved_ttft_gives_the_true_intercept() -> None:
    # TTFT = 10 ms + 0.1 ms/token + attention's 1e-4 ms/token²: a straight line through the
    # four points would put the intercept near 1 ms, the quadratic finds 10 ms
    sizes = (16, 64, 256, 1024)
    ttft = {p: [0.010 + 1e-4 * p + 1e-7 * p * p] for p in sizes}
    request_s, _ = _request_s(ttft, {}, base_s=0.003)
    assert request_s == pytest.approx(0.007, abs=1e-6)
    line = np.polyfit(np.asarray(sizes, float), [v[0] for v in ttft.values()], 1)
    assert line[1] < 0.005  # what the straight line (the old fit) gave


def test_the_fit_subtracts_the_overhead_from_each_prefill_sample() -> None:
    grid = {"prefill_tokens": [16, 64], "decode_seqs": [1, 2], "decode_prompts": [32],
            "chunked": []}
    ttft = {16: [0.020, 0.022], 64: [0.030]}
    itl = {(1, 64): [0.004], (2, 64): [0.005]}
    profile, meta = _fit(grid, [64], ttft, itl, 0.0, {16: 0.012, 64: 0.021})
    request_ms = meta["overheads"]["request_ms"]
    assert request_ms == pytest.approx(9.0)  # median of 21 − 12 and 30 − 21 ms
    assert profile.step_s(16, 0, 0) == pytest.approx(0.021 - 0.009)
    assert meta["server_prefill_ms"] == {"16": pytest.approx(12.0), "64": pytest.approx(21.0)}


def test_a_small_token_budget_plans_a_chunked_prefill_probe() -> None:
    assert plan_grid(4096, 64, 256)["chunked"] == [256, 4]
    assert plan_grid(4096, 64, 512)["chunked"] == [512, 2]
    assert plan_grid(4096, 64, 2048)["chunked"] == []  # 1,024-token prompts fit one step
    assert plan_grid(4096, 64, None)["chunked"] == []
    assert plan_grid(600, 64, 256)["chunked"] == [256, 2]  # the context allows two chunks


def test_chunk_samples_at_their_mean_start_give_the_prefix_attention_cost() -> None:
    # four chunks of 256: 40 ms each alone, 49.6 ms on average with the prefix cached
    samples = {"16,0,64": [0.01], "256,0,64": [0.04], "0,1,64": [0.004]}
    profile = StepProfile([0, 16, 256], [0, 1], [64], samples,
                          prefill_context_s={"256,0": [0.040], "256,384": [0.0496]})
    e_ms = profile.fit["e_ms_per_prefill_context"]
    assert e_ms == pytest.approx(9.6 / (256 * 384))
    # the whole prompt: Σ chunks = 4 × 40 ms + e × 256 × (0 + 256 + 512 + 768)
    total = sum(profile.step_s(256, 0, 0, 256 * start) for start in (0, 256, 512, 768))
    assert total == pytest.approx(4 * 0.0496)


def _stream(index: int, first_s: float, step_s: float, tokens: int) -> Outcome:
    times = [first_s + k * step_s for k in range(tokens)]
    return Outcome(index, 0.0, 0.0, 0.0, chunk_s=times, chunk_tokens=[1] * tokens,
                   status="ok")


def test_decodes_overlapping_prefills_are_timed_while_all_streams_decode() -> None:
    # four streams whose prefills end 1 s apart (long prompts, a small token budget); from
    # the last first token on, all four decode at 10 ms a token
    outs = [_stream(i, 1.0 * i, 0.010, 400) for i in range(4)]
    assert _after_prefills_s(outs, 24) == pytest.approx([0.010] * 4)
    # too few tokens while all decode: no answer (the E2E difference is used)
    short = [_stream(i, 1.0 * i, 0.010, 160) for i in range(4)]
    assert _after_prefills_s(short, 24) is None
    # first tokens spread by client jitter (a fifth of the span): not an overlap
    jitter = [_stream(i, 0.25 * i, 0.010, 400) for i in range(4)]
    assert _after_prefills_s(jitter, 24) is None
    # first tokens together: the E2E difference, which bursts do not fool, is kept
    together = [_stream(i, 0.001 * i, 0.010, 64) for i in range(4)]
    assert _after_prefills_s(together, 24) is None


def test_the_long_batch_asks_for_enough_tokens_to_outlast_the_prefills() -> None:
    spread = [_stream(i, 0.3 * i, 0.010, 16) for i in range(4)]  # 0.9 s of prefills
    extra = _overlap_tokens(spread, 16)
    assert extra == 180  # twice the 90 tokens a stream gets in 0.9 s
    assert _overlap_tokens([_stream(i, 0.0, 0.010, 16) for i in range(4)], 16) == 0
    wide = [_stream(i, 30.0 * i, 0.010, 16) for i in range(4)]
    assert _overlap_tokens(wide, 16) == MAX_EXTRA_TOKENS


def test_a_probe_scale_within_the_probes_own_noise_stays_one() -> None:
    before = {1: 0.85, 8: 1.30, 64: 1.02}
    after = {1: 0.95, 8: 1.34, 64: 1.20}
    scales = _geomean(before, after)
    assert scales[1] == 1.0  # mean 0.90, but before and after differ by 12%: noise
    assert scales[8] == pytest.approx(math.sqrt(1.30 * 1.34))  # slower on both sides: drift
    assert scales[64] == 1.0


def test_small_batches_are_timed_from_their_chunks_unless_they_came_in_bursts() -> None:
    lone = [_stream(0, 0.1, 0.003, 64)]
    assert _after_prefills_s(lone, 24, always=True) == pytest.approx([0.003])
    together = [_stream(i, 0.001 * i, 0.010, 64) for i in range(4)]
    assert _after_prefills_s(together, 24, always=True) == pytest.approx([0.010] * 4)
    # a busy API server sent four tokens per chunk: the chunks' times mislead
    burst = Outcome(0, 0.0, 0.0, 0.0, chunk_s=[0.1 + 0.012 * k for k in range(16)],
                    chunk_tokens=[4] * 16, status="ok")
    assert _after_prefills_s([burst], 24, always=True) is None


def _fake_server(monkeypatch: pytest.MonkeyPatch, step_s: float, tokens_per_chunk: int
                 ) -> list[int]:
    """``probes.send`` answered by a server whose TTFT scatters over 50-250 ms (seeded) and
    whose decode steps take ``step_s``; returns the output lengths of the batches sent.
    """
    rng = np.random.default_rng(7)
    sent: list[int] = []

    def send(target: Target, jobs: list[Job], one_at_a_time: bool = False) -> list[Outcome]:
        sent.append(jobs[0].output_tokens)
        first = float(rng.uniform(0.05, 0.25))
        outs = []
        for job in jobs:
            n = job.output_tokens
            ends = sorted({*range(tokens_per_chunk, n, tokens_per_chunk), n - 1})
            times = [first] + [first + step_s * k for k in ends]
            counts = [1] + [b - a for a, b in zip([0, *ends], ends, strict=False)]
            outs.append(Outcome(job.index, 0.0, 0.0, 0.0, chunk_s=times,
                                chunk_tokens=counts, status="ok"))
        return outs

    monkeypatch.setattr(probes, "send", send)
    return sent


def test_one_sequence_decode_is_its_stream_not_two_requests_ttfts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    target = Target("http://x/v1/completions", "m", np.random.default_rng(1))
    sent = _fake_server(monkeypatch, 0.003, 1)
    samples = probes.decode_itl_s(target, 1, 512, 64, runs=15)
    assert samples == pytest.approx([0.003] * 15)  # the TTFTs' scatter stays out
    assert sent == [64] * 15  # one long request per run: no short batch needed
    # a stream that came in bursts: by difference, with a short batch per run
    sent = _fake_server(monkeypatch, 0.003, 8)
    by_difference = probes.decode_itl_s(target, 1, 512, 64, runs=3)
    assert sent == [64, 16] * 3 and len(by_difference) == 3
    assert any(abs(v - 0.003) > 1e-4 for v in by_difference)  # the TTFTs' scatter shows


def test_small_decode_batches_get_three_times_the_samples() -> None:
    assert [_runs(d, 5) for d in (1, 2, 4, 8, 16)] == [15, 8, 4, 1, 1]
    assert SMALL_BATCH == 4 and SMALL_BATCH_REPS == 3


def test_a_tight_budget_gives_up_the_small_batches_extra_samples_first() -> None:
    grid = plan_grid(4096, 64, 2048)
    full = estimate_s(grid, 5, 0.2, 0.003)
    plain = estimate_s(grid, 5, 0.2, 0.003, small_reps=1)
    assert plain < full
    assert _runs(1, 3, 1) == 3 and _runs(2, 3, 1) == 2  # the smallest plan: as before


def test_the_decode_cells_are_probed_in_an_order_the_seed_shuffles() -> None:
    grid = plan_grid(2048, None, None)
    order = decode_order(grid, 0)
    cells = [(p, d) for p in grid["decode_prompts"] for d in grid["decode_seqs"]]
    # every cell once
    assert sorted(order) == sorted(cells) and len(order) == len(cells) == 18
    # the cell beside which the server's own ITL is read first (a stopped probe keeps it)
    assert order[0] == (grid["decode_prompts"][0], 1)
    assert order[1:] != [c for c in cells if c != order[0]]  # the rest shuffled
    # the same seed, the same order; another seed, another
    assert decode_order(plan_grid(2048, None, None), 0) == order
    assert decode_order(grid, 1) != order
    # not context by context: every context is visited before the first is done
    first_done = max(i for i, (p, _) in enumerate(order) if p == cells[0][0])
    assert {p for p, _ in order[:first_done]} == set(grid["decode_prompts"])
    # a trimmed grid (a tight budget drops the largest batches): its own cells, once each
    small = {**grid, "decode_seqs": grid["decode_seqs"][:3]}
    assert sorted(decode_order(small, 0)) == sorted(
        (p, d) for p in grid["decode_prompts"] for d in small["decode_seqs"])


def test_a_stopped_shuffled_probe_keeps_the_largest_block_of_measured_cells() -> None:
    seqs, contexts = [1, 2, 4, 8], [64, 544, 1120]
    cells = {(1, 64), (4, 64), (1, 544), (2, 544), (4, 544), (8, 1120)}
    itl = {c: [0.01] for c in cells}
    # two contexts x two sizes (4 cells) beats one context x three sizes (3 cells)
    assert _largest_block(seqs, contexts, itl) == ([64, 544], [1, 4])
    # no two sizes at any one context: no block (the samples alone are written)
    assert _largest_block(seqs, contexts, {(1, 64): [0.01], (2, 544): [0.01]})[1] == []


def test_the_prefill_grid_prices_a_curved_prefill_mixed_with_decodes_within_5pct() -> None:
    # the tiny vLLM's prefill step (2,048 batched tokens, fitted to its 16/64/256/1,024-token
    # cells): 4.19 ms + 0.101 ms/token + 8.13e-5 ms/token² (attention); its decode steps
    # 3.2 ms + 0.19 ms/sequence + 0.0007 ms/KV token. The profile interpolates straight
    # between prefill grid points: with 256 next to 1,024 a ~400-token prefill, alone or
    # among decodes, came out 14% high (57 ms measured on the server, 65 priced)
    def prefill_s(p: float) -> float:
        return (4.19 + 0.101 * p + 8.13e-5 * p * p) / 1e3

    def decode_s(d: float, kv: float) -> float:
        return (3.2 + 0.19 * d + 0.0007 * kv) / 1e3

    grid = plan_grid(4096, 64, 2048)
    contexts = [p + 32 for p in grid["decode_prompts"]]
    request_s = 0.005
    ttft = {p: [prefill_s(p) + request_s] for p in grid["prefill_tokens"]}
    itl = {(d, c): [decode_s(d, d * c)] for d in grid["decode_seqs"] for c in contexts}
    engine = {p: prefill_s(p) for p in grid["prefill_tokens"]}
    profile, _ = _fit(grid, contexts, ttft, itl, 0.0, engine)
    worst = 0.0
    for p in range(16, 1025, 8):
        for d, ctx in ((0, 64), (1, 1100), (4, 1100), (8, 600)):
            truth = prefill_s(p) + (decode_s(d, d * ctx) - 0.0032 if d else 0.0)
            worst = max(worst, abs(profile.step_s(p, d, d * ctx) / truth - 1))
    assert worst < 0.05
    # the old grid's error at 400 tokens, on the same curve
    old = np.interp(400, [256, 1024], [prefill_s(256), prefill_s(1024)])
    assert old / prefill_s(400) - 1 > 0.1


def test_the_mixed_check_prefills_what_the_token_budget_leaves_beside_its_decodes() -> None:
    # vLLM schedules the running decodes first: under a 256-token budget a 256-token prompt
    # among 4 decodes would prefill as 252 + 4 and return its first token after the small step
    assert mixed_point(plan_grid(4096, 64, 256), 256) == (252, 4)
    assert mixed_point(plan_grid(4096, 64, 2048), 2048) == (256, 4)
    assert mixed_point(plan_grid(4096, 64, None), None) == (256, 4)
