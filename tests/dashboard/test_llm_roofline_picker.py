"""The LLM page's roofline pickers: model, device and TP switch the step model to
``llm_roofline``, and the numbers follow the hardware.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from dashboard.llm_roofline_picker import ROOFLINE, roofline_policy

PAGES = Path(__file__).resolve().parents[2] / "dashboard" / "app_pages"


def table_of(at: AppTest) -> dict[str, float]:
    """TTFT P99 (ms) by scheduler."""
    table = at.dataframe[0].value.set_index("scheduler")
    return {str(k): float(v) for k, v in table["TTFT P99 (ms)"].items()}


def roofline_page() -> AppTest:
    at = AppTest.from_file(str(PAGES / "llm.py"), default_timeout=120)
    at.session_state["llm-tab"] = "compare schedulers"  # the tab with the schedulers' table
    at.run()
    assert not at.exception, at.exception
    at.selectbox(key="llm-model").set_value(ROOFLINE).run()
    assert not at.exception, at.exception
    return at


def test_pickers_switch_the_step_model_to_the_roofline_and_follow_the_device() -> None:
    at = roofline_page()
    assert at.selectbox(key="llm-rl-model").value == "builtin:llama-3.1-8b"
    assert at.selectbox(key="llm-rl-device").value == "h100-sxm"
    assert at.selectbox(key="llm-rl-tp").options == ["1", "2", "4", "8"]
    assert any("KV cache" in c.value and "as vLLM sizes it" in c.value for c in at.caption)
    h100 = table_of(at)
    # an L40S has a quarter of the H100's memory bandwidth: every step is slower
    at.selectbox(key="llm-rl-device").set_value("l40s").run()
    assert not at.exception, at.exception
    l40s = table_of(at)
    for scheduler in h100:
        assert l40s[scheduler] > h100[scheduler], scheduler
    # 70B does not fit one H100 (140 GB of weights): a one-line error, not a traceback
    at.selectbox(key="llm-rl-device").set_value("h100-sxm").run()
    at.selectbox(key="llm-rl-model").set_value("builtin:llama-3.1-70b").run()
    assert not at.exception
    assert at.error and "does not fit 1 × h100-sxm" in at.error[0].value
    at.selectbox(key="llm-rl-tp").set_value(4).run()
    assert not at.exception and not at.error
    assert table_of(at)


def test_own_config_path_and_a_bad_one(tmp_path: Path) -> None:
    at = roofline_page()
    at.selectbox(key="llm-rl-model").set_value("a config.json path…").run()
    assert not at.exception and at.info  # asks for the path
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 512, "num_hidden_layers": 4,
                               "num_attention_heads": 8, "num_key_value_heads": 4,
                               "intermediate_size": 1536, "vocab_size": 8192}))
    at.text_input(key="llm-rl-path").set_value(str(cfg)).run()
    assert not at.exception and not at.error
    assert table_of(at)
    at.text_input(key="llm-rl-path").set_value(str(tmp_path / "missing.json")).run()
    assert not at.exception and "cannot read" in at.error[0].value


def test_roofline_policy_leaves_the_kv_size_to_the_device() -> None:
    roofline = {"kind": "llm_roofline", "model": "builtin:llama-3.1-8b", "device": "h100-sxm"}
    policy = {"kind": "vllm", "num_gpu_blocks": 8192, "max_num_seqs": 64}
    assert roofline_policy(roofline, policy) == {"kind": "vllm", "max_num_seqs": 64}
    assert roofline_policy({"kind": "llm_linear"}, policy) == policy
    assert roofline_policy(roofline, {"kind": "static"}) == {"kind": "static"}
