"""``servelab compare`` on an ``llm_roofline`` scenario: live on this machine's CPU (the
model config's decoder) and against an endpoint (the stub server), without a step profile.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from executor.compare_llm import compare_llm
from executor.lifecycle import LiveError
from executor.live_llm import llm_model_spec
from sim.scenario.llm import load_llm_scenario


def roofline_scenario(**service: Any) -> dict[str, Any]:
    """A short llm_roofline scenario on the cpu sheet (the servelab-small shape)."""
    return {"name": "roofline-compare", "seed": 5, "warmup_s": 0,
            "service": {"kind": "llm_roofline", "model": "builtin:servelab-small",
                        "device": "cpu", **service},
            "workload": {"kind": "poisson", "rate_rps": 2.0, "n_requests": 6,
                         "prompt_tokens": 48, "output_tokens": 6},
            "policy": {"kind": "vllm", "max_num_seqs": 8, "max_num_batched_tokens": 256,
                       "block_size": 16, "num_gpu_blocks": 256}}


def test_live_decoder_is_the_model_configs_shape_on_one_thread() -> None:
    spec = llm_model_spec(load_llm_scenario(roofline_scenario()))
    assert spec["params"] == {"hidden": 512, "layers": 4, "heads": 8, "kv_heads": 4,
                              "intermediate": 1536, "vocab": 8192}
    assert (spec["device"], spec["dtype"], spec["threads"]) == ("cpu", "fp32", 1)


def test_a_gpu_sheet_has_nothing_to_run_live() -> None:
    scn = load_llm_scenario(roofline_scenario(device="h100-sxm", model="builtin:llama-3.1-8b"))
    with pytest.raises(LiveError, match=r"service\.device: 'h100-sxm' is a GPU sheet"):
        llm_model_spec(scn)


@pytest.mark.slow
def test_compare_runs_live_with_llm_roofline(tmp_path: Path) -> None:
    data = compare_llm(roofline_scenario(), tmp_path / "cmp", repeats=1, force=True)
    assert data["service"] == "llm_roofline" and data["probe_mode"] == "off"
    assert not data["probed"] and data["probes"] == []
    rows = {r["metric"]: r for r in data["rows"]}
    for key in ("ttft_ms.p50", "e2e_ms.p50", "tpot_ms.p50"):
        assert math.isfinite(rows[key]["sim"]) and rows[key]["sim"] > 0
        assert math.isfinite(rows[key]["live_median"]) and rows[key]["live_median"] > 0
    assert rows["throughput_rps"]["live_median"] > 0
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["service"] == "llm_roofline"
    assert (tmp_path / "cmp" / "sim" / "summary.json").exists()
