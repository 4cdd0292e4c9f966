"""``calibrate --endpoint`` then ``compare --endpoint`` against the real vLLM (CPU build, tiny
model) on a loopback port, in bounded time. On the shared 2-core machine the server's speed
swings with other work, so this checks the loop end to end (knobs read, budget kept, every
request measured, predictions of the right size), not fidelity: that is
``benchmarks/fidelity_vllm.py``'s job on a quiet machine.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from calibration.step_profile import load_step_profile
from executor.endpoint.calibrate import calibrate_endpoint
from executor.endpoint.compare_endpoint import compare_endpoint
from tests.executor.endpoint.conftest import write_scenario

pytestmark = pytest.mark.slow
BUDGET_S = 120.0


def test_calibrate_then_compare_on_vllm(vllm_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "vllm.json"
    lines: list[str] = []
    meta = calibrate_endpoint(vllm_server.url, out, budget_s=BUDGET_S, reps=3,
                              say=lines.append)
    assert lines[0].startswith("plan (about")
    # the budget is a rule the command keeps: no probe step starts once it is spent (so the
    # wall time is the budget plus at most the last step and the fit); on a busy machine
    # work is shed to fit (meta.budget.shed)
    steps = meta["budget"]["steps"]
    assert steps and all(s["start_s"] < BUDGET_S for s in steps), steps
    assert meta["model"] == "tiny-llama"
    assert meta["server"]["block_size"] > 0 and meta["server"]["num_blocks"] > 0
    assert "enable_prefix_caching" in meta["server"]
    profile = load_step_profile(out)
    over = meta["overheads"]
    assert over["request_ms"] >= 0 and over["per_output_token_ms"] >= 0
    for d in profile.decode_seqs[1:]:
        assert profile.step_s(0, d, d * profile.context_tokens[0]) > 0
    # the server caches prefixes (vLLM's default): the cached-prefix probe ran, every cell's
    # prefix was found whole, and attending to it costs time; unless the budget gave up
    # every cell of it, before probing (the plan from the first look) or while probing (the
    # first work shed), which meta.budget says
    assert meta["server"]["enable_prefix_caching"]
    if "cached_prefill" not in meta:
        assert meta["budget"]["plan"]["cached_cells_dropped"] or "partial" in meta or any(
            e["shed"] == "cached_cells" for e in meta["budget"]["shed"]), meta["budget"]
    else:
        cached = meta["cached_prefill"]
        for cell in meta["cached_cells"]:
            n, k = cell
            assert cached["hits_tokens"][f"{n},{k}"] == meta["reps"] * k, cell
        assert cached["fit"]["ms_per_context_pair"] > 0 and cached["fit"]["r2"] > 0.9
        assert profile.fit["e_ms_per_prefill_context"] > 0
        n, k = meta["cached_cells"][-1]
        hit_s = profile.step_s(n, 0, 0, prefill_context=n * k)
        assert hit_s > profile.step_s(n, 0, 0)
    fragment = yaml.safe_load(out.with_suffix(".scenario.yaml").read_text())
    assert fragment["policy"]["block_size"] == meta["server"]["block_size"]

    scenario = write_scenario(tmp_path / "cmp.yaml", kind="poisson", rate_rps=2,
                              n_requests=10, prompt_tokens=100, output_tokens=16)
    data = compare_endpoint(scenario, vllm_server.url, tmp_path / "cmp", profile=out,
                            repeats=1)
    rows = {r["metric"]: r for r in data["rows"]}
    assert rows["throughput_rps"]["live_median"] > 0
    assert len(data["probes"]) == 1 and math.isfinite(data["probes"][0]["drift"])
    # the right size: within a factor of two on this busy machine
    for key in ("ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"):
        assert abs(rows[key]["rel_error"]) < 1.0, (key, rows[key])
