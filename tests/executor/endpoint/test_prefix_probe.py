"""The cached-prefix prefill probe's plan and fit, and the linear service built from a profile
that holds it, without a server (the probe against the real vLLM:
``test_calibrate_vllm.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from executor.endpoint.calibrate import write_fragment
from executor.endpoint.prefix_check import linear_service
from executor.endpoint.prefix_probe import (
    CELLS,
    cached_prefill_meta,
    fit_cached_prefill,
    linear_terms,
    plan_cells,
    trimmed,
)
from sim.scenario.step_time import LinearStepModel
from sim.serving.llm.step_model import Composition

# the shape measured on vLLM's CPU build (benchmarks/results/prefix_prefill_grid-diag.md)
A_MS, PER_NEW_MS, PER_PAIR_MS, PER_SQ_MS = 5.9, 0.083, 0.000183, 0.00011


def cost_s(n: int, k: int) -> float:
    return (A_MS + PER_NEW_MS * n + PER_PAIR_MS * n * k + PER_SQ_MS * n * n) / 1e3


def test_the_fit_recovers_the_cost_of_new_tokens_and_of_attention_to_the_cached_prefix(
        ) -> None:
    rng = np.random.default_rng(0)
    # 2% noise per sample; the fit takes each cell's median of 5, whose sd is 1.197 x the
    # sample's for normal noise (the median of 5's efficiency): the coefficients within 4 of
    # their least-squares standard errors, (X'X)^-1 X' S X (X'X)^-1 with S those variances
    samples = {f"{n},{k}": list(cost_s(n, k) * (1 + 0.02 * rng.standard_normal(5)))
               for n, k in CELLS}
    fit = fit_cached_prefill(samples)
    x = np.asarray([[1.0, n, n * k, n * n] for n, k in CELLS])
    sd_ms = np.asarray([cost_s(n, k) * 1e3 * 0.02 * 1.197 for n, k in CELLS])
    pinv = np.linalg.pinv(x)
    se = np.sqrt(np.diag(pinv @ np.diag(sd_ms ** 2) @ pinv.T))
    assert abs(fit["ms_per_context_pair"] - PER_PAIR_MS) <= 4 * se[2], (fit, se)
    assert abs(fit["ms_per_sq"] - PER_SQ_MS) <= 4 * se[3], (fit, se)
    assert fit["r2"] > 0.99
    exact = fit_cached_prefill({f"{n},{k}": [cost_s(n, k)] for n, k in CELLS})
    assert [exact[c] for c in ("a_ms", "ms_per_new_token", "ms_per_context_pair",
                               "ms_per_sq")] == pytest.approx(
        [A_MS, PER_NEW_MS, PER_PAIR_MS, PER_SQ_MS], rel=1e-6)


def test_with_two_fresh_lengths_one_pair_cost_serves_both_attentions() -> None:
    # n·k + n²/2 pairs at one cost: the square cannot be told from the per-token cost
    pair = 0.0002
    cells = [(64, 0), (256, 0), (64, 1024), (256, 1024)]
    fit = fit_cached_prefill({f"{n},{k}": [(3 + 0.1 * n + pair * (n * k + n * n / 2)) / 1e3]
                              for n, k in cells})
    assert fit["ms_per_context_pair"] == pytest.approx(pair, rel=1e-6)
    assert fit["ms_per_sq"] == pytest.approx(pair / 2, rel=1e-6)


def test_the_linear_terms_price_a_prefill_after_a_cached_prefix_as_measured() -> None:
    fit = fit_cached_prefill({f"{n},{k}": [cost_s(n, k)] for n, k in CELLS})
    decode_base_ms = 3.1
    model = LinearStepModel(decode_base_ms, **linear_terms(fit, decode_base_ms))
    for n, k in [(100, 1500), (32, 3000), (700, 0)]:
        comp = Composition(n, 0, 0, prefill_context=n * k, prefill_seqs=1, prefill_sq=n * n)
        assert model.step_s(comp) == pytest.approx(cost_s(n, k), rel=1e-6)
    # the fresh prompts' straight slope prices the same short chunk after 1,536 cached
    # tokens far too dear (it carries the fresh prompts' own attention)
    slope_ms = (cost_s(1024, 0) - cost_s(64, 0)) * 1e3 / 960
    old = LinearStepModel(decode_base_ms, slope_ms, per_prefill_context_ms=PER_PAIR_MS)
    short = Composition(128, 0, 0, prefill_context=128 * 1536, prefill_seqs=1,
                        prefill_sq=128 * 128)
    assert old.step_s(short) > 1.15 * cost_s(128, 1536)


def test_cells_keep_to_the_servers_context_and_token_budget_and_need_caching() -> None:
    assert plan_cells(4096, 2048, caching=True) == [list(c) for c in CELLS]
    assert plan_cells(4096, 2048, caching=False) == []
    small = plan_cells(1200, 256, caching=True)
    assert small == [[64, 0], [256, 0], [64, 1024]]
    assert plan_cells(1000, 2048, caching=True) == []  # no cached prefix fits


def test_linear_service_takes_the_prefill_terms_from_the_cached_prefix_probe(
        tmp_path: Path) -> None:
    fit_meta = {"decode_base_ms": 3.1, "ms_per_decode_seq": 0.25, "ms_per_kv_token": 0.0007,
                "ms_per_prefill_token": 0.23, "ttft_intercept_ms": 0.0}
    got = cached_prefill_meta({"samples_s": {f"{n},{k}": [cost_s(n, k)] for n, k in CELLS},
                               "ttft_s": {}, "server": {}, "hits_tokens": {}})
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"meta": {"endpoint_fit": fit_meta, "cached_prefill": got,
                                         "overheads": {"request_ms": 5.0}}}))
    service = linear_service(path)
    assert service["per_prefill_token_ms"] == pytest.approx(PER_NEW_MS, rel=1e-6)
    assert service["per_prefill_context_ms"] == pytest.approx(PER_PAIR_MS, rel=1e-6)
    assert service["per_prefill_sq_ms"] == pytest.approx(PER_SQ_MS, rel=1e-6)
    assert service["per_prefill_seq_ms"] == pytest.approx(A_MS - 3.1, rel=1e-6)
    assert service["per_decode_seq_ms"] == 0.25
    # without the probe: the fresh prompts' slope, no attention terms
    path.write_text(json.dumps({"meta": {"endpoint_fit": fit_meta}}))
    plain = linear_service(path)
    assert plain["per_prefill_token_ms"] == 0.23 and "per_prefill_sq_ms" not in plain


def test_a_tight_budget_drops_the_dearest_cells_and_keeps_a_fittable_set() -> None:
    cells = plan_cells(4096, 2048, caching=True)
    seen = []
    while cells:
        seen.append(cells)
        cells = trimmed(cells)
    assert [2048, 0] not in seen[1]  # the dearest first
    for kept in seen:  # every set still tells fresh lengths and a cached prefix apart
        assert len({n for n, k in kept if k == 0}) >= 2 and any(k for _, k in kept)
    assert seen[-1] == [[64, 0], [256, 0], [64, 1024]]


def test_the_fragment_carries_the_servers_prefix_caching_into_the_policy(
        tmp_path: Path) -> None:
    meta = {"overheads": {"request_ms": 5.0, "per_output_token_ms": 0.0},
            "endpoint": "http://127.0.0.1:1", "model": "m"}
    for caching in (True, False):
        knobs = {"block_size": 128, "num_blocks": 2048, "enable_prefix_caching": caching}
        path = write_fragment(tmp_path / "p.json", meta, knobs, 64, 2048)
        policy = yaml.safe_load(path.read_text())["policy"]
        assert policy["enable_prefix_caching"] is caching and policy["block_size"] == 128
    path = write_fragment(tmp_path / "p.json", meta, {"block_size": 16}, None, None)
    assert "enable_prefix_caching" not in yaml.safe_load(path.read_text())["policy"]
