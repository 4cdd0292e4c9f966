"""The roofline step model: hand-computed terms, monotonicity, tensor parallelism, the BLIS
coefficient set against BLIS's own formula, the KV cache size, and bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sim.llm
from sim.scenario.roofline.hardware import (
    GIB,
    DeviceSheet,
    HardwareError,
    ModelShape,
    builtin_devices,
    kv_cache_blocks,
    load_device,
    load_model_config,
)
from sim.scenario.roofline.model import (
    TERMS,
    Coefficients,
    RooflineStepModel,
    load_coefficients,
    terms_us,
)
from sim.scenario.roofline.service import load_shape
from sim.scenario.schema import ScenarioError
from sim.serving.llm.step_model import Composition

# 2 layers, d = 8, 2 query heads and 1 KV head of width 4, MLP 16, vocab 32, bf16
TINY = ModelShape("tiny", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4,
                  intermediate=16, vocab=32)
# 1 FLOP/µs, 1 byte/µs everywhere: every roofline term is its FLOPs or bytes
UNIT = DeviceSheet("unit", "gpu", bf16_flops=1e6, fp8_flops=0, memory_bw_bps=1e6,
                   interconnect_bps=1e6, memory_gib=1)
# one chunk of 3 prompt tokens from position 5, and 2 decodes attending to 10 tokens in all
MIXED = Composition(prefill_tokens=3, decode_seqs=2, kv_tokens=10, prefill_context=15,
                    prefill_seqs=1, prefill_sq=9)


def test_terms_by_hand() -> None:
    # per layer: attention weights 8·(8 + 2·4) + 8·8 = 192, MLP 3·8·16 = 384
    # linear FLOPs per token and layer: 2 · (192 + 384) = 1152
    # the chunk's query-key pairs: (5+1) + (5+2) + (5+3) = 21 = 15 + (9 + 3)/2
    x = terms_us(TINY, UNIT, 1, MIXED)
    assert x["prefill_compute"] == 2 * 3 * 1152
    assert x["prefill_attention"] == 2 * (4 * 2 * 4) * 21
    assert x["decode_compute"] == 2 * (2 * 1152 + 32 * 10)
    assert x["decode_kv"] == 2 * 2 * 4 * 2 * (10 + 2)  # K and V, 4 wide, 2 bytes, read + write
    assert x["weights"] == 2 * (192 + 384) * 2
    assert x["lm_head"] == 32 * 8 * 2 + 2 * 3 * 32 * 8  # bytes + FLOPs for 3 sampled rows
    assert x["tp_allreduce"] == 0
    assert (x["per_layer"], x["per_request"], x["per_step"]) == (2, 3, 1)


def test_tensor_parallel_halves_weights_and_adds_all_reduce() -> None:
    one, two = terms_us(TINY, UNIT, 1, MIXED), terms_us(TINY, UNIT, 2, MIXED)
    assert two["weights"] == one["weights"] / 2
    assert two["prefill_compute"] == one["prefill_compute"] / 2
    # the one KV head is replicated on both GPUs (as vLLM does), so KV bytes stay
    assert two["decode_kv"] == one["decode_kv"]
    # 2 all-reduces per layer of 5 tokens × 8 × 2 bytes, ring factor 2·(2−1)/2 = 1
    assert two["tp_allreduce"] == 2 * 2 * 5 * 8 * 2 * 1
    assert one["tp_allreduce_latency"] == 0 == two["tp_allreduce_latency"]  # UNIT: none


def test_all_reduce_latency_counts_two_per_layer_and_grows_with_the_ring() -> None:
    sheet = DeviceSheet("lat", "gpu", bf16_flops=1e6, fp8_flops=0, memory_bw_bps=1e6,
                        interconnect_bps=1e6, memory_gib=1, allreduce_base_us=3.0,
                        allreduce_hop_us=0.5)
    for tp, per_all_reduce in ((1, 0.0), (2, 3.0 + 2 * 0.5), (8, 3.0 + 14 * 0.5)):
        assert terms_us(TINY, sheet, tp, MIXED)["tp_allreduce_latency"] == pytest.approx(
            2 * TINY.layers * per_all_reduce)
    # a decode-sized step is latency-bound: the latency outweighs the bytes on NVLink
    h100 = load_device("h100-sxm")
    assert (h100.allreduce_base_us, h100.allreduce_hop_us) == (3.6, 0.47)
    assert any("nccl" in src for src in h100.sources)
    llama = load_shape("builtin:llama-3.1-8b")
    x = terms_us(llama, h100, 8, Composition(0, 1, 500))
    assert x["tp_allreduce_latency"] == pytest.approx(2 * 32 * (3.6 + 14 * 0.47))
    assert x["tp_allreduce_latency"] > 10 * x["tp_allreduce"]
    # no shipped set fits it: β = 1, so the latency adds to a tp-8 step as it is
    model = RooflineStepModel(llama, h100, 8, load_coefficients("builtin", "gpu"))
    assert model.coefficients.values["tp_allreduce_latency"] == 1.0
    assert model.contributions_us(Composition(0, 1, 500))["tp_allreduce_latency"] == \
        pytest.approx(x["tp_allreduce_latency"])


def test_device_sheet_rejects_a_negative_all_reduce_latency(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("bf16_tflops: 100\nmemory_bw_gbps: 1000\nmemory_gib: 40\n"
                   "allreduce_hop_us: -1\n")
    with pytest.raises(HardwareError, match="allreduce_hop_us must be a number >= 0"):
        load_device(str(bad))


def test_moe_weights_grow_with_the_experts_touched() -> None:
    moe = ModelShape("moe", layers=1, hidden=8, heads=2, kv_heads=2, head_dim=4,
                     intermediate=16, vocab=32, experts=4, active_experts=2)
    one = terms_us(moe, UNIT, 1, Composition(0, 1, 4))  # 1 token touches 2 experts
    many = terms_us(moe, UNIT, 1, Composition(0, 64, 256))  # 64 tokens touch all 4
    attn = moe.attention_params() * 2
    assert one["weights"] == pytest.approx(attn + 2 * 3 * 8 * 16 * 2)
    assert many["weights"] == pytest.approx(attn + 4 * 3 * 8 * 16 * 2)
    assert moe.params() == 1 * (moe.attention_params() + 4 * 3 * 8 * 16) + 2 * 32 * 8


def test_step_time_grows_with_every_axis() -> None:
    shape = load_shape("builtin:llama-3.1-8b")
    model = RooflineStepModel(shape, load_device("h100-sxm"), 1,
                              load_coefficients("builtin", "gpu"))
    base = Composition(prefill_tokens=256, decode_seqs=8, kv_tokens=8 * 512,
                       prefill_context=256 * 128, prefill_seqs=1, prefill_sq=256 ** 2)
    t0 = model.step_s(base)
    for more in (Composition(512, 8, 8 * 512, 512 * 128, 1, 512 ** 2),
                 Composition(256, 16, 16 * 512, 256 * 128, 1, 256 ** 2),
                 Composition(256, 8, 8 * 2048, 256 * 128, 1, 256 ** 2),
                 Composition(256, 8, 8 * 512, 256 * 1024, 1, 256 ** 2)):
        assert model.step_s(more) > t0
    faster = RooflineStepModel(shape, load_device("h200"), 1, model.coefficients)
    assert faster.step_s(base) < t0  # same compute, more memory bandwidth


def test_blis_set_reproduces_blis_formula_on_dense_bf16() -> None:
    """BLIS's trained-physics step time (sim/latency/trained_physics_model.go, 10 betas),
    written out here for Llama-3.1-8B on H100, tp 1, against servelab's with the shipped set.
    """
    beta = [0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825]
    b2b = 1.94710771
    layers, d, d_kv, d_h, heads, d_ff = 32, 4096, 1024, 128, 32, 14336
    flops_us, bw_us = 989.5e12 / 1e6, 3350e9 / 1e6
    shape = load_shape("builtin:llama-3.1-8b")
    model = RooflineStepModel(shape, load_device("h100-sxm"), 1,
                              load_coefficients("builtin", "gpu"))
    weights = (layers * d * (2 * d + 2 * d_kv) + layers * 3 * d * d_ff) * 2 / bw_us
    # decode-only: 16 sequences, 1000 tokens of context each
    n, ctx = 16, 16 * 1000
    blis = (b2b * layers * 2 * d_kv * 2 * (ctx + n) / bw_us + beta[2] * weights
            + beta[4] * layers + beta[5] * n + beta[6])
    ours = model.step_s(Composition(0, n, ctx)) * 1e6
    assert ours == pytest.approx(blis, rel=1e-9)
    # a whole 2000-token prompt in one chunk: BLIS counts t·(t + t/2) attention pairs
    t = 2000
    compute = (layers * 2 * t * d * (2 * d + 2 * d_kv) + layers * 4 * heads * t * 1.5 * t * d_h
               + layers * t * 6 * d * d_ff) / flops_us
    blis = beta[0] * compute + beta[2] * weights + beta[4] * layers + beta[5] + beta[6]
    ours = model.step_s(Composition(t, 0, 0, 0, 1, t * t)) * 1e6
    assert ours == pytest.approx(blis, rel=1e-3)  # ours adds the diagonal (t/2 pairs)


def test_kv_cache_as_vllm_sizes_it() -> None:
    shape = load_shape("builtin:llama-3.1-8b")
    h100 = load_device("h100-sxm")
    blocks = kv_cache_blocks(shape, h100, 1, 16, 0.9)
    free = 80 * GIB * 0.9 - shape.weight_bytes() - (5.5 + 0.15) * GIB
    assert blocks == int(free // (16 * 2 * 32 * 8 * 128 * 2))
    assert 400_000 < blocks * 16 < 450_000  # vLLM logs about 420k tokens for this pair
    assert kv_cache_blocks(shape, h100, 2, 16, 0.9) > 2 * blocks  # weights split over 2
    with pytest.raises(HardwareError, match=r"service\.tp"):
        kv_cache_blocks(load_shape("builtin:llama-3.1-70b"), h100, 1, 16, 0.9)


def _scenario(**service: object) -> dict[str, object]:
    return {"service": {"kind": "llm_roofline", "model": "builtin:llama-3.1-8b",
                        "device": "h100-sxm", **service},
            "workload": {"kind": "poisson", "rate_rps": 5, "n_requests": 40,
                         "prompt_tokens": 300, "output_tokens": 50},
            "policy": {"kind": "vllm", "max_num_batched_tokens": 2048}}


def test_scenario_sizes_kv_and_runs() -> None:
    result = sim.llm.run(_scenario())
    assert result.scenario.policy.num_gpu_blocks == kv_cache_blocks(  # type: ignore[union-attr]
        load_shape("builtin:llama-3.1-8b"), load_device("h100-sxm"), 1, 16, 0.9)
    assert result.summary["ok"] == 40
    # an 8B model decodes a token in a few ms on an H100 (BLIS's set: about 7 ms)
    assert 3 < result.summary["tpot_ms"]["p50"] < 15
    tp2 = sim.llm.run(_scenario(tp=2))
    assert tp2.summary["tpot_ms"]["p50"] < result.summary["tpot_ms"]["p50"]


@pytest.mark.parametrize(("service", "message"), [
    ({"device": "h900"}, "service.device: 'h900' is not a shipped device; allowed: a100-80gb"),
    ({"model": "nowhere/config.json"}, "service.model: cannot read"),
    ({"model": "builtin:gpt-9"}, "service.model: 'builtin:gpt-9' is not shipped; allowed"),
    ({"tp": 3}, "service.tp: 3 does not divide the model's 32 attention heads"),
    ({"coefficients": "builtin:nope"}, "service.coefficients: 'builtin:nope' is not shipped"),
    ({"gpu_memory_utilization": 1.5}, "service.gpu_memory_utilization"),
    ({"device": None}, "^service.device: required field is missing$"),
    ({"dtype": "int4"}, "^service.dtype: Input should be 'fp32', 'bf16', 'fp16' or 'fp8'"),
])
def test_bad_service_names_the_field(service: dict[str, object], message: str) -> None:
    data = _scenario(**service)
    data["service"] = {k: v for k, v in data["service"].items() if v is not None}
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(".", r"\.")):
        sim.llm.load_llm_scenario(data)


def test_bad_files(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(HardwareError, match="missing num_hidden_layers"):
        load_model_config(cfg)
    cfg.write_text("{not json")
    with pytest.raises(HardwareError, match="is not JSON"):
        load_model_config(tmp_path)
    sheet = tmp_path / "dev.yaml"
    sheet.write_text("bf16_tflops: 100\nmemory_bw_gbps: -1\nmemory_gib: 8\n")
    with pytest.raises(HardwareError, match="memory_bw_gbps must be a number >= 0"):
        load_device(str(sheet))
    coeffs = tmp_path / "c.json"
    Coefficients(dict.fromkeys(TERMS, 1.0)).save(coeffs)
    assert load_coefficients(str(coeffs)).values["per_step"] == 1.0
    coeffs.write_text(json.dumps({"kind": "llm_roofline_coefficients",
                                  "coefficients": {"weights": -1}}))
    with pytest.raises(HardwareError, match="weights must be a number >= 0"):
        load_coefficients(str(coeffs))


def test_hf_configs_parse() -> None:
    mixtral = load_shape("builtin:mixtral-8x7b")
    assert (mixtral.experts, mixtral.active_experts, mixtral.is_moe) == (8, 2, True)
    assert 46e9 < mixtral.params() < 47.5e9  # Mixtral-8x7B: 46.7B parameters
    assert 7.9e9 < load_shape("builtin:llama-3.1-8b").params() < 8.1e9  # 8.03B
    assert 7.5e9 < load_shape("builtin:qwen2.5-7b").params() < 7.7e9  # 7.62B
    qwen3 = {"hidden_size": 2048, "num_attention_heads": 32, "head_dim": 128,
             "num_hidden_layers": 2, "num_key_value_heads": 4, "vocab_size": 100,
             "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
             "intermediate_size": 6144, "torch_dtype": "bfloat16"}
    from sim.scenario.roofline.hardware import model_shape_from_config

    shape = model_shape_from_config(qwen3)
    assert (shape.head_dim, shape.intermediate, shape.experts) == (128, 768, 128)
    assert set(builtin_devices()) >= {"h100-sxm", "a100-80gb", "l40s", "h200", "cpu"}
    for name in builtin_devices():
        assert load_device(name).sources  # every sheet says where its numbers come from


def test_fit_recovers_known_coefficients_and_holds_out() -> None:
    """Steps generated by known coefficients (with ±2% seeded noise) give them back."""
    import numpy as np

    from calibration.step_profile import load_step_profile
    from sim.scenario.roofline.fit import ProfileData, StepRow, fit, profile_rows

    truth = Coefficients({"prefill_compute": 0.8, "prefill_attention": 2.0,
                          "decode_compute": 0.0, "decode_kv": 3.0, "weights": 1.2,
                          "lm_head": 5.0, "tp_allreduce": 0.0, "per_layer": 150.0,
                          "per_request": 40.0, "per_step": 300.0})
    rng = np.random.default_rng(1)
    cpu = load_device("cpu")
    data = []
    for name, (d, layers) in {"a": (256, 4), "b": (512, 4), "c": (768, 6)}.items():
        shape = ModelShape(name, layers=layers, hidden=d, heads=d // 64, kv_heads=d // 128,
                           head_dim=64, intermediate=3 * d, vocab=8192, dtype="fp32")
        model = RooflineStepModel(shape, cpu, 1, truth)
        rows = [StepRow(r.comp, model.step_s(r.comp) * (1 + rng.normal(0, 0.02)), name)
                for r in profile_rows(load_step_profile("builtin:llm-small-cpu"), name)]
        data.append(ProfileData(name, shape, cpu, 1, rows))
    got = fit(data, holdout=0.25, seed=0)
    for term in ("prefill_compute", "prefill_attention", "decode_kv", "weights", "lm_head",
                 "per_request"):
        assert got.values[term] == pytest.approx(truth.values[term], rel=0.05), term
    # per layer and per step overheads are nearly collinear (layers: 4, 4, 6): only their
    # sum is identified well
    fixed = got.values["per_layer"] * 4 + got.values["per_step"]
    assert fixed == pytest.approx(truth.values["per_layer"] * 4 + truth.values["per_step"],
                                  rel=0.1)
    held = got.meta["fit"]["held_out"]
    assert held["n"] == round(0.25 * sum(len(d.rows) for d in data))
    assert held["median_abs"] < 0.03  # the noise is 2%: a median |error| near 1.35%
    assert got.meta["fit"]["not_identified"] == ["tp_allreduce", "tp_allreduce_latency"]
    assert got.values["tp_allreduce_latency"] == 1.0  # unseen at tp 1: the sheet's as is


def test_fit_cli(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    out = tmp_path / "c.json"
    result = CliRunner().invoke(app, ["fit", "--profile", "builtin:llm-small-cpu", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert "held_out" in result.output
    assert load_coefficients(str(out)).meta["fit"]["held_out"]["median_abs"] < 0.2
    bad = CliRunner().invoke(app, ["fit", "--profile", "builtin:llm-small-cpu", "--out",
                                   str(out), "--holdout", "1.5"])
    assert bad.exit_code == 2 and "--holdout" in bad.output


def test_builtin_sets_follow_the_device_kind() -> None:
    cpu, gpu = load_coefficients("builtin", "cpu"), load_coefficients("builtin", "gpu")
    assert (cpu.name, gpu.name) == ("cpu-decoder", "gpu-blis-iter29")
    assert gpu.meta["source"]["commit"] == "f90a1e3a6787da17c2cd463dab6fb2660b1b1760"
    assert cpu.meta["fit"]["held_out"]["median_abs"] < 0.1  # its own shape's held-out steps
    result = sim.llm.run({**_scenario(model="builtin:servelab-small", device="cpu"),
                          "policy": {"kind": "vllm", "max_num_batched_tokens": 512,
                                     "max_num_seqs": 16, "num_gpu_blocks": 2048}})
    assert result.summary["ok"] == 40


def test_derived_kv_blocks_follow_a_changed_service() -> None:
    """A sweep re-validates the resolved scenario with a point applied: blocks derived for
    one tp or device are derived again for the next, while blocks the user set are kept.
    """
    first = sim.llm.load_llm_scenario(_scenario())
    again = sim.llm.load_llm_scenario(first, {"service.tp": 2})
    h100, shape = load_device("h100-sxm"), load_shape("builtin:llama-3.1-8b")
    assert again.policy.num_gpu_blocks == kv_cache_blocks(  # type: ignore[union-attr]
        shape, h100, 2, 16, 0.9)
    other = sim.llm.load_llm_scenario(first, {"service.device": "a100-80gb"})
    assert other.policy.num_gpu_blocks == kv_cache_blocks(  # type: ignore[union-attr]
        shape, load_device("a100-80gb"), 1, 16, 0.9)
    mine = sim.llm.load_llm_scenario(first, {"policy.num_gpu_blocks": 1000,
                                              "service.tp": 2})
    assert mine.policy.num_gpu_blocks == 1000  # type: ignore[union-attr]
