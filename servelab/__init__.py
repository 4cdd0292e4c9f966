"""servelab's front door: the public API in one place (the CLI lives in servelab.cli)."""

from typing import TYPE_CHECKING, Any

from calibration.profile import LatencyProfile, load_profile
from sim import (
    Decision,
    Policy,
    QueueView,
    ReplicaView,
    Request,
    Result,
    Scenario,
    ScenarioError,
    arrival_schedule,
    load_scenario,
    run,
)

if TYPE_CHECKING:
    from sim.experiments import pareto, replicate, sweep
    from sim.experiments.capacity import capacity, replicas_needed

# The experiment helpers load on first use: the CLI's start-up (which every
# ``servelab simulate`` pays) does not need them.
_LAZY = {"pareto": "sim.experiments", "replicate": "sim.experiments",
         "sweep": "sim.experiments", "capacity": "sim.experiments.capacity",
         "replicas_needed": "sim.experiments.capacity"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'servelab' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "Decision",
    "LatencyProfile",
    "Policy",
    "QueueView",
    "ReplicaView",
    "Request",
    "Result",
    "Scenario",
    "ScenarioError",
    "__version__",
    "arrival_schedule",
    "capacity",
    "load_profile",
    "load_scenario",
    "pareto",
    "replicas_needed",
    "replicate",
    "run",
    "sweep",
]
