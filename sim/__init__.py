"""servelab's simulator: the serving core, scenarios, metrics, the simulated clocks, experiments.

``import sim`` never imports torch. Public API::

    result = sim.run("builtin:dyn-demo", overrides={"policy.max_batch_size": 16})
    result.summary["latency_ms"]["p99"]; result.requests; result.batches; result.queue

The hot path may run compiled (``servelab compile``, :mod:`sim.native`); the guard below
falls back to plain Python where that build does not match the sources.
"""

import importlib
from typing import TYPE_CHECKING, Any

from sim import native

native.guard()

# The public names load on first use (PEP 562): ``import sim.serving.policies`` or
# ``import sim.errors`` then loads neither simpy nor the scenario builders.
_LAZY = {
    "arrival_schedule": "sim.scenario.build",
    "InvariantError": "sim.errors",
    "PolicyError": "sim.errors",
    "ServingCore": "sim.serving.core",
    "Result": "sim.metrics.rundir",
    "run": "sim.drivers.simulate",
    "Scenario": "sim.scenario.schema",
    "ScenarioError": "sim.scenario.schema",
    "load_scenario": "sim.scenario.schema",
    "Decision": "sim.serving.types",
    "Policy": "sim.serving.types",
    "QueueView": "sim.serving.types",
    "ReplicaView": "sim.serving.types",
    "Request": "sim.serving.types",
    "ArrivalSchedule": "sim.scenario.workloads",
    "WorkloadError": "sim.scenario.workloads",
}

_SUBPACKAGES = frozenset({"llm", "experiments", "serving", "scenario", "metrics", "drivers"})

if TYPE_CHECKING:
    from sim.drivers.simulate import run
    from sim.errors import InvariantError, PolicyError
    from sim.metrics.rundir import Result
    from sim.scenario.build import arrival_schedule
    from sim.scenario.schema import Scenario, ScenarioError, load_scenario
    from sim.scenario.workloads import ArrivalSchedule, WorkloadError
    from sim.serving.core import ServingCore
    from sim.serving.types import Decision, Policy, QueueView, ReplicaView, Request


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use."""
    module = _LAZY.get(name)
    if module is None:
        if name in _SUBPACKAGES:  # ``import sim; sim.llm.run(...)`` as before the lazy names
            return importlib.import_module(f"sim.{name}")
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ArrivalSchedule",
    "Decision",
    "InvariantError",
    "Policy",
    "PolicyError",
    "QueueView",
    "ReplicaView",
    "Request",
    "Result",
    "Scenario",
    "ScenarioError",
    "ServingCore",
    "WorkloadError",
    "arrival_schedule",
    "load_scenario",
    "run",
]
