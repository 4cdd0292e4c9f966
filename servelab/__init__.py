"""servelab's front door: the public API in one place (the CLI lives in servelab.cli)."""

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
from sim.experiments import pareto, replicate, sweep
from sim.experiments.capacity import capacity, replicas_needed

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
