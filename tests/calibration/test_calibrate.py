"""Calibration: sweep mechanics with fake runners, a real tiny MLP, the CLI, runner errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import sim
from calibration.fit import fit_curve
from calibration.measure import CalibrationError, calibrate, parse_batch_sizes
from calibration.model_runners import RunnerError, build_runner
from calibration.profile import load_profile
from servelab.cli import app


def test_shuffled_order_warmup_and_rep_counts(fake_runner) -> None:
    runner = fake_runner()
    result = calibrate(runner, [1, 2, 4], reps=5, warmup=2, seed=1)
    assert result.profile is not None
    assert {b: len(s) for b, s in result.profile.samples_s.items()} == {1: 5, 2: 5, 4: 5}
    warm, timed = runner.calls[:6], runner.calls[6:]
    assert warm == [1, 1, 2, 2, 4, 4]  # probe ascending
    assert sorted(timed) == [1] * 5 + [2] * 5 + [4] * 5
    assert timed != sorted(timed)  # interleaved, not size by size
    assert result.profile.meta["method"]["order"] == "shuffled"


def test_out_of_memory_marks_the_size_and_larger_infeasible_and_continues(fake_runner) -> None:
    result = calibrate(fake_runner(oom_at=4), [1, 2, 4, 8], reps=3, warmup=1)
    assert result.profile is not None and result.profile.batch_sizes == [1, 2]
    assert set(result.infeasible) == {4, 8}
    assert "out of memory" in result.infeasible[4]
    assert result.profile.meta["infeasible_batch_sizes"]["8"] == "larger than 4"


def test_ctrl_c_keeps_what_was_measured(fake_runner) -> None:
    result = calibrate(fake_runner(interrupt_after=3 + 7), [1, 2, 4], reps=10, warmup=1)
    assert result.interrupted and result.profile is not None
    assert sum(len(s) for s in result.profile.samples_s.values()) == 7
    assert result.profile.meta["interrupted"] is True


@pytest.mark.parametrize(("spec", "sizes"), [
    ("1-4", [1, 2, 3, 4]),
    ("1-64", [*range(1, 17), 32, 64]),
    ("1-20", [*range(1, 17), 20]),
    ("8-32:8", [8, 16, 24, 32]),
    ("1,2,4,8", [1, 2, 4, 8]),
    ("1-3,16", [1, 2, 3, 16]),
])
def test_batch_size_specs(spec: str, sizes: list[int]) -> None:
    assert parse_batch_sizes(spec) == sizes


@pytest.mark.parametrize("spec", ["", "a-b", "0-4", "8-4", "1-4:0"])
def test_bad_batch_size_specs(spec: str) -> None:
    with pytest.raises(CalibrationError, match="batch-sizes"):
        parse_batch_sizes(spec)


def test_fit_linear_and_bent() -> None:
    lin = fit_curve([1, 2, 4, 8], [0.003, 0.004, 0.006, 0.010])
    assert lin["kind"] == "linear" and lin["r2"] == pytest.approx(1.0)
    assert lin["a_ms"] == pytest.approx(2.0) and lin["b_ms_per_item"] == pytest.approx(1.0)
    bent = fit_curve(list(range(1, 11)), [0.001] * 5 + [0.002, 0.003, 0.004, 0.005, 0.006])
    assert bent["kind"] == "piecewise" and bent["breakpoint"] == 5.0


def test_real_mlp_calibration_round_trips_and_drives_the_simulator(tmp_path, torch) -> None:
    runner = build_runner("mlp", device="cpu", threads=1,
                          params={"width": 64, "depth": 2, "in_features": 32})
    result = calibrate(runner, [1, 2, 4, 8], reps=4, warmup=1)
    assert result.profile is not None and not result.infeasible
    path = result.profile.save(tmp_path / "mlp.json")
    again = load_profile(path)
    assert again.batch_sizes == [1, 2, 4, 8]
    assert again.meta["threads"] == 1 and again.model["name"] == "mlp"
    assert again.meta["torch_version"] == torch.__version__
    assert all(s.size == 4 for s in again.samples_s.values())
    res = sim.run({"service": {"kind": "profile", "path": str(path)},
                   "workload": {"kind": "poisson", "rate_rps": 100, "n_requests": 500},
                   "policy": {"kind": "greedy", "max_batch_size": 8}})
    assert res.summary["ok"] == 500
    # every simulated batch time is one of the measured samples (bootstrap at measured sizes)
    measured = {round(float(x), 12) for s in again.samples_s.values() for x in s}
    service = (res.batches["finish_s"] - res.batches["start_s"]).to_numpy()
    exact = [round(float(v), 12) in measured for v, n in zip(service, res.batches["items"],
                                                             strict=True) if n in (1, 2, 4, 8)]
    assert exact and np.mean(exact) > 0.99


def test_runner_outputs_are_real_model_outputs(torch) -> None:
    rng = np.random.default_rng(0)
    mlp = build_runner("mlp", device="cpu", params={"width": 16, "depth": 1, "in_features": 8,
                                                    "out_features": 3})
    assert tuple(mlp.run_batch(mlp.payloads(5, rng)).shape) == (5, 3)
    cnn = build_runner("cnn", device="cpu", params={"width": 4, "image_size": 32, "classes": 7})
    assert tuple(cnn.run_batch(cnn.payloads(2, rng)).shape) == (2, 7)


def test_minilm_embeds_real_sentences_offline(torch) -> None:
    runner = build_runner("minilm", device="cpu")
    emb = runner.run_batch(["A cat sits on the mat.", "A kitten rests on a rug.",
                            "Quarterly revenue rose by four percent."])
    assert tuple(emb.shape) == (3, 384)
    assert torch.allclose(emb.norm(dim=1), torch.ones(3), atol=1e-5)
    sim_close, sim_far = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    assert sim_close > sim_far + 0.3  # real weights: paraphrases are close


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"model": "gpt9"}, "allowed: minilm, mlp, cnn"),
    ({"model": "mlp", "dtype": "fp16", "device": "cpu"}, "fp16"),
    ({"model": "mlp", "dtype": "int3", "device": "cpu"}, "allowed: fp32"),
    ({"model": "mlp", "device": "tpu"}, "allowed: auto, cpu"),
    ({"model": "mlp", "device": "cpu", "params": {"width": 0}}, "width"),
    ({"model": "mlp", "device": "cpu", "params": {"colour": 1}}, "bad --param"),
    ({"model": "no_such_module:make"}, "cannot import"),
    ({"model": "json:dumps"}, "lacks"),
])
def test_runner_errors_name_the_option(kwargs, text, torch) -> None:
    model = kwargs.pop("model")
    if model == "json:dumps":
        with pytest.raises((RunnerError, TypeError)):
            build_runner(model, **kwargs)
        return
    with pytest.raises(RunnerError, match=text):
        build_runner(model, **kwargs)


def test_cuda_device_is_refused_without_a_gpu(torch) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RunnerError, match="no CUDA device"):
        build_runner("mlp", device="cuda")


def test_bring_your_own_runner_example(torch) -> None:
    runner = build_runner("examples.custom_runner:make_runner", device="cpu",
                          params={"hidden": 16, "max_len": 8})
    result = calibrate(runner, [1, 2], reps=2, warmup=1)
    assert result.profile is not None and result.profile.model["name"] == "tiny-gru"


def test_cli_calibrate_show_and_compare(tmp_path, torch) -> None:
    out = tmp_path / "p" / "mlp.json"
    args = ["calibrate", "--model", "mlp", "--device", "cpu", "--threads", "1",
            "--batch-sizes", "1,2,4", "--reps", "3", "--warmup", "1",
            "--param", "width=32", "--param", "depth=1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["batch_sizes"] == [1, 2, 4] and data["model"]["params"]["width"] == 32
    html = out.with_suffix(".html").read_text()
    assert "plotly" in html.lower() and "batch latency" in html
    shown = CliRunner().invoke(app, ["profile", "show", str(out)])
    assert shown.exit_code == 0 and "median" in shown.output and "0.0" in shown.output
    cmp_html = tmp_path / "cmp.html"
    compared = CliRunner().invoke(app, ["profile", "compare", str(out),
                                        "builtin:synthetic-demo", "--out", str(cmp_html)])
    assert compared.exit_code == 0 and "B / A" in compared.output and cmp_html.exists()


def test_cli_calibrate_bad_options_are_one_line(torch) -> None:
    for args, text in [(["--model", "gpt9"], "--model"), (["--batch-sizes", "x"], "batch-sizes"),
                       (["--model", "mlp", "--device", "cpu", "--reps", "0"], "--reps"),
                       (["--model", "mlp", "--param", "width"], "KEY=VALUE")]:
        result = CliRunner().invoke(app, ["calibrate", *args])
        assert result.exit_code == 2 and text in result.output, (args, result.output)


@pytest.mark.gpu
def test_cuda_timing_path_synchronises(torch) -> None:
    runner = build_runner("mlp", device="cuda", dtype="fp16", params={"width": 256})
    result = calibrate(runner, [1, 64], reps=5, warmup=2)
    assert result.profile is not None
    assert result.profile.meta["method"]["sync"] is True
    assert set(result.peak_memory_bytes) == {1, 64}
    assert result.peak_memory_bytes[64] >= result.peak_memory_bytes[1]
