"""LLM serving in the simulator: token workloads, iteration-level schedulers with a paged KV
cache, a step-time model, and TTFT/TPOT/ITL metrics.

``import sim.llm`` never imports torch. Public API::

    result = sim.llm.run("builtin:llm-demo", overrides={"policy.max_num_batched_tokens": 512})
    result.summary["ttft_ms"]["p99"]; result.requests; result.steps; result.tokens

:func:`load_any` and :func:`run_any` take either kind of scenario (the CLI and the experiment
layer use them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.drivers.llm_simulate import LlmResult, run
from sim.metrics.rundir import Result
from sim.scenario.llm import LlmScenario, is_llm_data, load_llm_scenario
from sim.scenario.schema import Scenario, load_scenario, read_scenario_dict
from sim.serving.llm.steps import StepInvariantError


def is_llm_source(source: Any) -> bool:
    """Whether a scenario (model, dict, path or ``builtin:NAME``) is an LLM scenario."""
    if isinstance(source, LlmScenario):
        return True
    if isinstance(source, Scenario):
        return False
    if isinstance(source, dict):
        return is_llm_data(source)
    return is_llm_data(read_scenario_dict(source))


def load_any(source: Scenario | LlmScenario | dict[str, Any] | str | Path,
             overrides: list[str] | dict[str, Any] | None = None) -> Scenario | LlmScenario:
    """Load a request-level or an LLM scenario, whichever the source is."""
    if is_llm_source(source):
        return load_llm_scenario(source, overrides)  # type: ignore[arg-type]
    return load_scenario(source, overrides)  # type: ignore[arg-type]


def run_any(source: Scenario | LlmScenario | dict[str, Any] | str | Path,
            overrides: list[str] | dict[str, Any] | None = None, *,
            records: str | None = None) -> Result | LlmResult:
    """Simulate a request-level or an LLM scenario (``records``: see :func:`sim.run`; an
    LLM run keeps full records).
    """
    if is_llm_source(source):
        return run(source, overrides)  # type: ignore[arg-type]
    from sim.drivers.simulate import run as run_requests

    return run_requests(source, overrides, records=records)  # type: ignore[arg-type]


__all__ = ["LlmResult", "LlmScenario", "StepInvariantError", "is_llm_source", "load_any",
           "load_llm_scenario", "run", "run_any"]
