"""servelab's simulator: workloads, policies, routing, the SimPy engine and metrics.

``import sim`` never imports torch. Public API::

    result = sim.run("builtin:dyn-demo", overrides={"policy.max_batch_size": 16})
    result.summary["latency_ms"]["p99"]; result.requests; result.batches; result.queue
"""

from sim.build import arrival_schedule
from sim.core import InvariantError, PolicyError, ServingCore
from sim.runner import Result, run
from sim.scenario import Scenario, ScenarioError, load_scenario
from sim.types import Decision, Policy, QueueView, ReplicaView, Request
from sim.workloads import ArrivalSchedule, WorkloadError

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
