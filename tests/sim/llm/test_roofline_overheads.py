"""The per-request overheads of the roofline coefficient sets (BLIS's α terms): where the
simulator applies them, that a set without them changes nothing, the checks on a set's
``request_overheads``, and that ``fit --profile`` keeps the set's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import sim.llm
from sim.drivers.llm_overheads import overheads_s
from sim.scenario.roofline.hardware import HardwareError
from sim.scenario.roofline.model import Coefficients, load_coefficients

# BLIS's published trained-physics alphas (defaults.yaml at f90a1e3), µs
ALPHA0_US, ALPHA1_US, ALPHA2_US = 15563.199579, 777.3455, 45.907545


def _scenario(**service: object) -> dict[str, object]:
    # requests 2 s apart: each runs alone, so the overheads shift its steps and nothing else
    return {"name": "alphas", "seed": 5,
            "service": {"kind": "llm_roofline", "model": "builtin:llama-3.1-8b",
                        "device": "h100-sxm", **service},
            "workload": {"kind": "constant", "rate_rps": 0.5, "n_requests": 12,
                         "prompt_tokens": {"dist": "lognormal", "mean": 300, "cv": 0.5},
                         "output_tokens": {"dist": "lognormal", "mean": 40, "cv": 0.5}},
            "policy": {"kind": "vllm", "max_num_batched_tokens": 2048}}


def test_the_blis_set_applies_blis_alphas_where_blis_does() -> None:
    blis = load_coefficients("builtin:gpu-blis-iter29")
    assert blis.overheads == pytest.approx({"request_ms": (ALPHA0_US + ALPHA2_US) / 1e3,
                                            "per_output_token_ms": ALPHA2_US / 1e3,
                                            "post_decode_ms": ALPHA1_US / 1e3})
    with_alphas = sim.llm.run(_scenario())
    without = sim.llm.run(_scenario(overheads={"request_ms": 0}))  # the service's own wins
    a, b = with_alphas.requests, without.requests
    assert (a["arrival_s"] == b["arrival_s"]).all()  # the client's arrivals, not shifted
    out = a["output_tokens"].to_numpy(float)
    # BLIS: TTFT = arrival + α0 (queueing) ... + α2; E2E adds α2 per output token and α1
    np.testing.assert_allclose(a["first_token_s"] - b["first_token_s"],
                               (ALPHA0_US + ALPHA2_US) / 1e6, atol=1e-9)
    np.testing.assert_allclose(a["finish_s"] - b["finish_s"],
                               (ALPHA0_US + ALPHA2_US * out + ALPHA1_US) / 1e6, atol=1e-9)
    # the engine's steps are the same, later by the request's entry into the scheduler
    np.testing.assert_allclose(with_alphas.steps["duration_s"], without.steps["duration_s"])
    # every gap between two tokens of a request grows by α2
    gaps = [np.diff(r.tokens.sort_values(["id", "index"]).groupby("id")["time_s"]
                    .apply(np.asarray).iloc[0]) for r in (with_alphas, without)]
    np.testing.assert_allclose(gaps[0] - gaps[1], ALPHA2_US / 1e6, atol=1e-9)


def test_a_set_without_overheads_changes_nothing() -> None:
    cpu = {"model": "builtin:servelab-small", "device": "cpu"}
    scn = sim.llm.load_llm_scenario(_scenario(**cpu))
    assert not load_coefficients("builtin:cpu-decoder", "cpu").overheads
    assert overheads_s(scn) == (0.0, 0.0, 0.0)
    plain = sim.llm.run(scn)
    zero = sim.llm.run(_scenario(**cpu, overheads={"request_ms": 0}))
    assert plain.summary == zero.summary


def test_a_sets_overheads_are_checked_and_saved(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    Coefficients({"per_step": 100.0}, "mine", overheads={"request_ms": 12.5}).save(path)
    assert json.loads(path.read_text())["request_overheads"] == {"request_ms": 12.5}
    assert load_coefficients(str(path)).overheads == {"request_ms": 12.5}
    scn = sim.llm.load_llm_scenario(_scenario(coefficients=str(path)))
    assert overheads_s(scn).request_s == pytest.approx(0.0125)
    for bad, message in (({"request_ms": -1}, r"request_overheads\.request_ms must be a "
                          r"number >= 0 \(ms\), got -1"),
                         ({"queue_ms": 1}, "unknown request_overheads key 'queue_ms'; "
                          "allowed: request_ms, per_output_token_ms, post_decode_ms"),
                         ([1], "request_overheads must be a mapping")):
        path.write_text(json.dumps({"kind": "llm_roofline_coefficients",
                                    "coefficients": {}, "request_overheads": bad}))
        with pytest.raises(HardwareError, match=message):
            load_coefficients(str(path))


def test_a_profile_fit_keeps_the_sets_request_overheads(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    out = tmp_path / "c.json"
    done = CliRunner().invoke(app, ["fit", "--profile", "builtin:llm-small-cpu",
                                    "--coefficients", "builtin:gpu-blis-iter29", "--out",
                                    str(out)])
    assert done.exit_code == 0, done.output
    got = load_coefficients(str(out))
    assert got.overheads == load_coefficients("builtin:gpu-blis-iter29").overheads
    assert got.meta["request_overheads_from"] == "gpu-blis-iter29"
    assert "request_overheads.request_ms" in done.output
    plain = CliRunner().invoke(app, ["fit", "--profile", "builtin:llm-small-cpu", "--out",
                                     str(out)])
    assert plain.exit_code == 0, plain.output
    assert load_coefficients(str(out)).overheads == {}  # cpu-decoder has none
