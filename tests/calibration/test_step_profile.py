"""LLM step profiles: the decoder's KV cache, measurement, interpolation, the llm_profile
service and ``servelab calibrate --model llm``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.step_profile import StepProfile, StepProfileError, load_step_profile

TINY = {"hidden": 64, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 128,
        "vocab": 256, "max_slots": 40, "max_len": 2048}


def synthetic(fn) -> StepProfile:
    """A profile whose samples are fn(P, D, L) exactly, on a small grid."""
    ps, ds, ls = [0, 10, 100, 1000], [0, 1, 8, 32], [100, 1000]
    samples = {}
    for p in ps:
        for d in ds:
            if d == 0:
                if p:
                    samples[StepProfile.key(p, 0, ls[0])] = [fn(p, 0, ls[0])] * 3
                continue
            for ctx in ls:
                samples[StepProfile.key(p, d, ctx)] = [fn(p, d, ctx)] * 3
    return StepProfile(ps, ds, ls, samples)


def test_interpolation_reproduces_a_bilinear_cost_and_the_fit_recovers_it() -> None:
    def cost(p, d, ctx):  # seconds: base + prefill + decode + attention over the context
        return (2.0 + 0.01 * p + 0.3 * d + 0.0005 * d * ctx) / 1e3

    prof = synthetic(cost)
    for p, d, ctx in [(55, 0, 100), (10, 5, 400), (500, 20, 777), (0, 3, 150)]:
        assert prof.step_s(p, d, d * ctx) == pytest.approx(cost(p, d, ctx), rel=1e-9)
    fit = prof.fit
    assert fit["a_ms"] == pytest.approx(2.0) and fit["b_ms_per_prefill_token"] == \
        pytest.approx(0.01)
    assert fit["c_ms_per_decode_seq"] == pytest.approx(0.3)
    assert fit["d_ms_per_kv_token"] == pytest.approx(0.0005) and fit["r2"] == pytest.approx(1)
    # outside the grid: the linear model, flagged by inside()
    assert not prof.inside(2000, 4, 400)
    assert prof.step_s(2000, 4, 1600) == pytest.approx(cost(2000, 4, 400), rel=1e-9)


def test_profiles_round_trip_and_bad_files_name_the_field(tmp_path) -> None:
    prof = synthetic(lambda p, d, ctx: (1 + p + d) / 1e3)
    path = prof.save(tmp_path / "p.json")
    again = load_step_profile(path)
    assert again.step_s(50, 4, 400) == pytest.approx(prof.step_s(50, 4, 400))
    with pytest.raises(StepProfileError, match=r"service\.path: .* not found"):
        load_step_profile(tmp_path / "nope.json")
    (tmp_path / "req.json").write_text(json.dumps({"batch_sizes": [1]}))
    with pytest.raises(StepProfileError, match="not an LLM step profile"):
        load_step_profile(tmp_path / "req.json")
    with pytest.raises(StepProfileError, match="unknown builtin step profile"):
        load_step_profile("builtin:llm-nope")


def test_the_decoders_cache_gives_the_same_logits_chunked_or_whole(torch) -> None:
    from calibration.llm_decoder import DecoderConfig, LlamaDecoder, reference_check

    decoder = LlamaDecoder(DecoderConfig(**TINY))
    assert reference_check(decoder, prompt_len=12) < 1e-4


def test_a_step_runs_prefill_chunks_and_decodes_together(torch) -> None:
    from calibration.llm_decoder import DecoderConfig, LlamaDecoder, StepEntry

    decoder = LlamaDecoder(DecoderConfig(**TINY))
    decoder.step([StepEntry(0, 0, 10), StepEntry(1, 0, 5)])
    out = decoder.step([StepEntry(0, 10, 1), StepEntry(1, 5, 3), StepEntry(2, 0, 7)])
    assert tuple(out.shape) == (3,)
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        decoder.step([StepEntry(0, 2047, 5)])


def test_measured_profile_predicts_held_out_steps(torch) -> None:
    from calibration.step_measure import Grid, build_decoder, measure_steps

    decoder = build_decoder("small", TINY, "cpu", "fp32", 1)
    grid = Grid((0, 16, 256), (0, 1, 8), (64, 512))
    held = [(100, 0, 0), (0, 4, 4 * 300), (64, 3, 3 * 100)]
    prof = measure_steps(decoder, grid, reps=3, warmup=1, held_out=held)
    assert {len(v) for v in prof.samples_s.values()} == {3}
    assert len(prof.samples_s) == len(grid.points())
    rows = prof.meta["held_out"]["rows"]
    assert [r["prefill_tokens"] for r in rows] == [100, 0, 64]
    assert prof.meta["method"]["order"] == "shuffled" and prof.meta["threads"] == 1
    assert np.isfinite(prof.meta["held_out"]["interpolated"]["median"])


def test_cli_calibrate_llm_writes_a_profile_the_simulator_uses(tmp_path, torch) -> None:
    from typer.testing import CliRunner

    import sim.llm
    from servelab.cli import app

    out = tmp_path / "llm.json"
    args = ["calibrate", "--model", "llm", "--device", "cpu", "--threads", "1", "--reps", "1",
            "--warmup", "0", "--out", str(out)]
    for key, value in TINY.items():
        args += ["--param", f"{key}={value}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "held-out steps (30)" in result.output
    data = json.loads(out.read_text())
    assert data["kind"] == "llm_step_profile" and data["meta"]["model"]["name"] == "llm"
    run = sim.llm.run({"service": {"kind": "llm_profile", "path": str(out)},
                       "workload": {"kind": "poisson", "rate_rps": 5, "n_requests": 50,
                                    "prompt_tokens": 100, "output_tokens": 20},
                       "policy": {"kind": "vllm", "num_gpu_blocks": 500, "max_num_seqs": 16,
                                  "max_num_batched_tokens": 512}})
    assert run.summary["ok"] == 50 and run.summary["ttft_ms"]["p50"] > 0
    bad = CliRunner().invoke(app, ["calibrate", "--model", "llm", "--param", "shape=70b"])
    assert bad.exit_code != 0 and "allowed: small, 1b, 8b" in bad.output


def test_the_shipped_cpu_step_profile_meets_its_held_out_targets() -> None:
    prof = load_step_profile("builtin:llm-small-cpu")
    held = prof.meta["held_out"]["interpolated"]
    assert held["n"] == 30
    assert held["median"] <= 0.05 and held["p90"] <= 0.10


def test_the_batched_decode_path_used_on_cuda_computes_the_same_logits(torch) -> None:
    from calibration.llm_decoder import DecoderConfig, LlamaDecoder, StepEntry

    def run(batched: bool):
        decoder = LlamaDecoder(DecoderConfig(**TINY), seed=3)
        decoder.batched_decode = batched
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (9, 4, 13)]
        decoder.step([StepEntry(i, 0, p.numel()) for i, p in enumerate(prompts)],
                     token_ids=torch.cat(prompts))
        nxt = torch.randint(0, 256, (4,), generator=gen)
        entries = [StepEntry(0, 9, 1), StepEntry(1, 4, 1), StepEntry(2, 13, 1),
                   StepEntry(3, 0, 1)]
        return decoder.step(entries, token_ids=nxt, return_logits=True)

    assert torch.allclose(run(True), run(False), atol=1e-5)


def test_a_later_prefill_chunk_pays_for_its_prefix(tmp_path) -> None:
    prof = synthetic(lambda p, d, ctx: (1 + 0.01 * p) / 1e3)
    e_ms = 2e-5  # ms per chunk token x start position
    chunks = {f"{n},{start}": [(1 + 0.01 * n + e_ms * n * start) / 1e3] * 3
              for n in (64, 256) for start in (0, 512, 1024)}
    with_context = StepProfile(prof.prefill_tokens, prof.decode_seqs, prof.context_tokens,
                               prof.samples_s, prefill_context_s=chunks)
    assert with_context.fit["e_ms_per_prefill_context"] == pytest.approx(e_ms)
    base = with_context.step_s(256, 0, 0)
    assert with_context.step_s(256, 0, 0, 256 * 700) == pytest.approx(
        base + e_ms * 256 * 700 / 1e3)
    again = load_step_profile(with_context.save(tmp_path / "p.json"))
    assert again.fit["e_ms_per_prefill_context"] == pytest.approx(e_ms)


def test_beyond_the_grid_a_step_extends_the_grids_edge_and_never_drops_below_it() -> None:
    # curved prefill times (attention) pull the linear fit's intercept below 0: the fit alone
    # priced a one-sequence decode past the longest context at 0 ms
    def cost(p, d, ctx):
        return (3.0 + 0.08 * p + 0.0002 * p * p + 0.25 * d + 0.0007 * d * ctx) / 1e3

    prof = synthetic(cost)
    assert prof.fit["a_ms"] < 0 and prof.linear_s(0, 1, 3000) < cost(0, 1, 1000)
    edge = prof.step_s(0, 1, 1000)
    assert edge == pytest.approx(cost(0, 1, 1000))
    # continuous at the edge, then the fitted slope per KV token (exact here: linear in K)
    assert prof.step_s(0, 1, 1001) == pytest.approx(cost(0, 1, 1001), rel=1e-6)
    assert prof.step_s(0, 1, 3000) == pytest.approx(cost(0, 1, 3000), rel=1e-6)
    # more sequences than the grid: the edge plus the slopes, never below the edge
    beyond = [prof.step_s(0, d, d * 3000) for d in (32, 40, 64)]
    assert beyond == sorted(beyond) and beyond[0] == pytest.approx(cost(0, 32, 3000))
    # a longer prefill than the grid: at least the grid's longest
    assert prof.step_s(1500, 0, 0) > prof.step_s(1000, 0, 0) == pytest.approx(cost(1000, 0, 0))
