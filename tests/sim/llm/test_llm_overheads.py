"""``service.overheads``: a request joins the scheduler ``request_ms`` after it arrives and
each output token after the first reaches the client ``per_output_token_ms`` later; the
default (none) leaves a run unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sim.llm

SCENARIO: dict[str, Any] = {
    "name": "overheads", "seed": 5,
    "service": {"kind": "llm_linear", "base_ms": 4, "per_prefill_token_ms": 0.02,
                "per_decode_seq_ms": 0.3},
    "workload": {"kind": "poisson", "rate_rps": 30, "n_requests": 200,
                 "prompt_tokens": 100, "output_tokens": 20},
    "policy": {"kind": "vllm", "max_num_seqs": 32, "max_num_batched_tokens": 512,
               "block_size": 16, "num_gpu_blocks": 1024}}


def _with(**overheads: float) -> dict[str, Any]:
    return {**SCENARIO, "service": {**SCENARIO["service"], "overheads": overheads}}


def test_zero_overheads_leave_the_run_unchanged() -> None:
    plain = sim.llm.run(SCENARIO)
    zero = sim.llm.run(_with(request_ms=0.0, per_output_token_ms=0.0))
    assert zero.summary == plain.summary
    assert "overheads:" not in plain.scenario.to_yaml()  # golden scenario files unchanged


def test_request_overhead_shifts_every_request_by_its_time() -> None:
    plain = sim.llm.run(SCENARIO)
    late = sim.llm.run(_with(request_ms=12.5))
    # every arrival moves by the same 12.5 ms, so the engine does the same steps 12.5 ms
    # later: TTFT and E2E grow by exactly that, TPOT not at all
    a, b = plain.requests, late.requests
    assert np.array_equal(a["arrival_s"], b["arrival_s"])
    np.testing.assert_allclose(b["first_token_s"] - a["first_token_s"], 0.0125, atol=1e-9)
    assert late.summary["ttft_ms"]["p50"] == pytest.approx(plain.summary["ttft_ms"]["p50"]
                                                           + 12.5)
    assert late.summary["tpot_ms"]["p50"] == pytest.approx(plain.summary["tpot_ms"]["p50"])


def test_per_token_overhead_adds_to_every_gap() -> None:
    plain = sim.llm.run(SCENARIO)
    slow = sim.llm.run(_with(per_output_token_ms=0.75))
    assert slow.summary["ttft_ms"]["p50"] == pytest.approx(plain.summary["ttft_ms"]["p50"])
    assert slow.summary["tpot_ms"]["mean"] == pytest.approx(plain.summary["tpot_ms"]["mean"]
                                                            + 0.75)
    gaps = np.diff(slow.tokens[slow.tokens["id"] == 3]["time_s"].to_numpy())
    base = np.diff(plain.tokens[plain.tokens["id"] == 3]["time_s"].to_numpy())
    np.testing.assert_allclose(gaps - base, 0.00075, atol=1e-12)


def test_negative_overhead_is_one_clear_error() -> None:
    from sim.errors import UserError

    with pytest.raises(UserError, match="request_ms"):
        sim.llm.run(_with(request_ms=-1.0))
