"""A built-in runner's (and the live LLM decoder's) size params given as numbers that are
not Python ints.

``--param width=1e3`` and ``--set model.params.width=1e3`` read as the float 1000.0 since
:func:`sim.scenario.schema.cli_value` (YAML 1.1 read ``1e3`` as a string); NaN and inf come
from ``.nan``/``1e400``. The runner sizes must be integers >= 1; an integral float is that
integer.
"""

from __future__ import annotations

import math

import pytest

from calibration.model_runners import RunnerError, build_runner
from executor.live_budget import runner_bytes


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_an_integral_float_size_builds_the_integer_model(model: str) -> None:
    # catches: 16.0 passed the mlp's integer check and reached torch, which refused it deep
    # in the build ("bad --param (empty(): ... must be tuple of ints ...)"); cnn the same
    params = ({"width": 16.0, "depth": 1.0, "in_features": 8.0} if model == "mlp"
              else {"width": 2.0, "image_size": 32.0, "classes": 4.0})
    built = build_runner(model, device="cpu", params=params).describe()["model"]["params"]
    assert all(type(v) is int for v in built.values()), built
    assert built["width"] == int(params["width"])


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_size_that_is_not_an_integer_is_refused_naming_it(value: float) -> None:
    # catches: NaN raised ValueError ("cannot convert float NaN to integer") and inf
    # OverflowError out of the runner's own check: a traceback, not the param's one line
    with pytest.raises(RunnerError, match=r"^--param width=.*: must be an integer >= 1$"):
        build_runner("mlp", device="cpu", params={"width": value})


def test_the_live_budget_refuses_a_nan_size_naming_it() -> None:
    # catches: the live pre-flight priced width NaN as NaN bytes and refused the run naming
    # ``replicas`` ("about nan KiB of memory ... lower replicas")
    with pytest.raises(RunnerError, match=r"^--param width=nan: must be an integer >= 1$"):
        runner_bytes({"name": "mlp", "params": {"width": math.nan}})
    assert runner_bytes({"name": "mlp", "params": {"width": 16.0}}) == \
        runner_bytes({"name": "mlp", "params": {"width": 16}})


TINY = {"layers": 1, "hidden": 64, "heads": 2, "kv_heads": 1, "intermediate": 64,
        "vocab": 128}


@pytest.mark.parametrize("value", [math.nan, math.inf, 64.5])
def test_the_live_budget_refuses_a_decoder_size_that_is_not_an_integer(value: float) -> None:
    # catches: the live pre-flight priced hidden NaN/inf as NaN bytes and refused the run
    # naming ``replicas``; it priced hidden 64.5 as 64.5 while the engine built 64
    from executor.live_budget import decoder_shape

    with pytest.raises(ValueError, match=r"^--param hidden=.*: must be an integer >= 1$"):
        decoder_shape({"params": {**TINY, "hidden": value}})


def test_the_engine_refuses_a_fractional_decoder_size() -> None:
    # catches: decoder_for truncated hidden 64.5 to 64 (int()) and built that decoder
    # silently; and DecoderConfig.check raised OverflowError on inf, not its one line
    from calibration.llm_shapes import DecoderConfig
    from executor.llm_driver import decoder_for

    with pytest.raises(ValueError, match=r"^--param hidden=64.5: must be an integer >= 1$"):
        decoder_for({"params": {**TINY, "hidden": 64.5}}, 1, 8)
    with pytest.raises(ValueError, match=r"^--param hidden=inf: must be an integer >= 1$"):
        DecoderConfig(hidden=math.inf).check()  # type: ignore[arg-type]


def test_llm_calibration_builds_an_integral_float_shape() -> None:
    # catches: calibrate's build_decoder passed --param hidden=64.0 (cli_value reads 64e0 as
    # a float) to torch, which raised TypeError ("type must be tuple of ints") mid-build
    from calibration.step_measure import build_decoder

    decoder = build_decoder("small", {**TINY, "hidden": 64.0, "max_slots": 2.0,
                                      "max_len": 16.0}, "cpu", "fp32", None)
    assert decoder.cfg.hidden == 64 and type(decoder.cfg.hidden) is int
