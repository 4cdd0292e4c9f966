"""``calibrate --endpoint`` then ``compare --endpoint`` against the real vLLM (CPU build, tiny
model) on a loopback port, in bounded time. On the shared 2-core machine the server's speed
swings with other work, so this checks the loop end to end (knobs read, budget kept, every
request measured, predictions of the right size), not fidelity: that is
``benchmarks/fidelity_vllm.py``'s job on a quiet machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from calibration.step_profile import load_step_profile
from executor.compare_loop import metric
from executor.endpoint.calibrate import calibrate_endpoint
from executor.endpoint.compare_endpoint import compare_endpoint
from tests.executor.endpoint.conftest import write_scenario

pytestmark = pytest.mark.slow
BUDGET_S = 120.0


def server_delta(meta: dict[str, Any], name: str) -> float:
    """A vLLM counter's change over a bench run (``meta.json``'s snapshots)."""
    before = meta["server_metrics_before"]["values"].get(name, 0.0)
    return float(meta["server_metrics_after"]["values"][name] - before)


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
    # not fidelity (how far the prediction misses on this busy machine has no bound from
    # this run: vLLM keeps no per-step times for a replay to split the miss into executor,
    # device and chance, as test_compare.py does): the wiring, in the right direction and
    # units, each side against what it was made from
    cmp_dir = tmp_path / "cmp"
    sim_summary = json.loads((cmp_dir / "sim-1" / "summary.json").read_text())
    live_summary = json.loads((cmp_dir / "bench-1" / "summary.json").read_text())
    for key in ("ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"):
        row = rows[key]
        # the probed run's prediction against the one live run, signed (> 0: predicted
        # slow), relative to the live value: a swapped pair or sign breaks it
        assert row["sim"] == metric(sim_summary, key)
        assert row["live_median"] == metric(live_summary, key)
        assert row["rel_error"] == pytest.approx(
            (row["sim"] - row["live_median"]) / row["live_median"], rel=1e-12), (key, row)
    # the live side in ms: vLLM's own TTFT and E2E over the run's requests (its arrival
    # stamp to its output processor's) lie inside ours (our send to our read), exactly; a
    # client reporting seconds, or from its read of the first token's stamp, falls short
    live = pd.read_parquet(cmp_dir / "bench-1" / "requests.parquet")
    bench_meta = json.loads((cmp_dir / "bench-1" / "meta.json").read_text())
    served = server_delta(bench_meta, "time_to_first_token_seconds_count")
    assert served == len(live) == 10
    for ours, name in (((live["first_token_s"] - live["arrival_s"]).mean(),
                        "time_to_first_token_seconds_sum"),
                       ((live["finish_s"] - live["arrival_s"]).mean(),
                        "e2e_request_latency_seconds_sum")):
        assert ours >= server_delta(bench_meta, name) / served, (name, ours)
    # and the summary's rows read in ms from those seconds: the p50s lie among the requests'
    # own values x 1000 (a row in seconds, or x 1e6, falls outside)
    for key, ours_s in (("ttft_ms.p50", live["first_token_s"] - live["arrival_s"]),
                        ("e2e_ms.p50", live["finish_s"] - live["arrival_s"])):
        assert ours_s.min() * 1e3 <= rows[key]["live_median"] <= ours_s.max() * 1e3, (
            key, rows[key], ours_s.describe())
    # the prediction from the probed profile and the calibrated overheads: the first request
    # of the seeded schedule finds the simulated engine empty, so its TTFT is the request
    # overhead plus its prefill step alone, exactly (up to rounding); a profile read in the
    # wrong units, the stored profile used in place of the probed one, or an overhead left
    # out or counted twice breaks it
    probed = load_step_profile(cmp_dir / "bench-1" / "probed-profile.json")
    sim_req = pd.read_parquet(cmp_dir / "sim-1" / "requests.parquet").sort_values("arrival_s")
    first = sim_req.iloc[0]
    lone_ms = data["overheads_ms"]["request_ms"] + probed.step_s(100, 0, 0) * 1e3
    assert (first["first_token_s"] - first["arrival_s"]) * 1e3 == pytest.approx(
        lone_ms, rel=1e-9), (first, lone_ms)
