"""``calibrate --model llm --config``: the decoder shape from a Hugging Face config, an up-front
time estimate against a budget, an honest label, and Ctrl-C keeping what was measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from calibration.llm_config import decoder_sizes
from sim.errors import UserError

QWEN2_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
             "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24,
             "num_key_value_heads": 2, "vocab_size": 151936}
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
              "num_key_value_heads": 2, "vocab_size": 256}


def write(tmp_path: Path, config: dict[str, object], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_sizes_and_label_come_from_the_config(tmp_path: Path) -> None:
    sizes, label = decoder_sizes(write(tmp_path, QWEN2_05B))
    assert sizes == {"layers": 24, "hidden": 896, "heads": 14, "kv_heads": 2,
                     "intermediate": 4864, "vocab": 151936}
    assert label == "qwen2 config (24 layers, hidden 896, 14/2 heads)"
    assert decoder_sizes(tmp_path)[0] == sizes  # a model directory holding config.json
    mha = {k: v for k, v in QWEN2_05B.items() if k != "num_key_value_heads"}
    assert decoder_sizes(write(tmp_path, mha, "mha.json"))[0]["kv_heads"] == 14


@pytest.mark.parametrize(("change", "message"), [
    ({"num_hidden_layers": None}, "layers needs a positive integer"),
    ({"intermediate_size": "big"}, "intermediate needs a positive integer"),
    ({"head_dim": 128}, "head_dim 128 × heads 14 != hidden_size 896"),
])
def test_a_config_servelab_cannot_build_is_one_line_naming_the_field(
        tmp_path: Path, change: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        decoder_sizes(write(tmp_path, {**QWEN2_05B, **change}))
    with pytest.raises(UserError, match="no such file"):
        decoder_sizes(tmp_path / "missing.json")


def test_calibration_estimates_refuses_over_budget_and_labels_the_shape(
        tmp_path: Path, torch: object) -> None:
    from servelab.calibrate_llm import run_step_calibration

    config = write(tmp_path, TINY_LLAMA)
    console = Console(record=True, width=200)
    common = {"device": "cpu", "dtype": "fp32", "threads": 1, "reps": 1, "warmup": 0,
              "seed": 0, "params": {}, "console": console, "config": config}
    out = tmp_path / "llm.json"
    with pytest.raises(UserError, match=r"over the budget of .*--yes"):
        run_step_calibration(out=out, budget_s=1e-3, **common)  # type: ignore[arg-type]
    assert not out.exists()
    assert "estimated time: about" in console.export_text()
    profile = run_step_calibration(out=out, budget_s=1e-3, yes=True,
                                   **common)  # type: ignore[arg-type]
    assert profile is not None
    data = json.loads(out.read_text())
    assert data["meta"]["shape"] == "llama config (1 layers, hidden 64, 4/2 heads)"
    assert data["meta"]["model"]["params"]["hidden"] == 64
    assert data["meta"]["model"]["params"]["kv_heads"] == 2


def test_ctrl_c_keeps_complete_rounds_or_the_raw_samples(torch: object) -> None:
    from calibration.step_measure import Grid, StepsInterrupted, build_decoder, measure_steps

    tiny = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64,
            "vocab": 128}
    decoder = build_decoder("small", tiny, "cpu", "fp32", 1)
    grid = Grid((0, 16), (0, 1, 2), (32, 64))
    steps = len(grid.points()) + 9  # + the prefix chunks of 64/256/512 at 0/256/1024

    def stop_after(n: int):  # a progress callback that presses Ctrl-C after n steps
        def progress(done: int, total: int) -> None:
            if done == n:
                raise KeyboardInterrupt
        return progress

    profile = measure_steps(decoder, grid, reps=4, warmup=0, progress=stop_after(steps + 2))
    stopped = profile.meta["interrupted"]
    assert stopped["reps_complete"] == 1 and stopped["of"] == 4 * steps
    assert min(len(v) for v in profile.samples_s.values()) == 1
    with pytest.raises(StepsInterrupted) as early:
        measure_steps(decoder, grid, reps=4, warmup=0, progress=stop_after(3))
    saved = early.value.to_dict()
    assert saved["timed_steps"] == 3
    assert sum(len(s["samples_s"]) for s in saved["steps"]) == 3
