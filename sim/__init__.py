"""servelab's simulator: workloads, policies, routing, the SimPy engine and metrics.

``import sim`` never imports torch. Public API::

    result = sim.run("builtin:dyn-demo", overrides={"policy.max_batch_size": 16})
    result.summary["latency_ms"]["p99"]; result.requests; result.batches; result.queue

The hot path may run compiled (``servelab compile``, :mod:`sim.native`); the guard below
falls back to plain Python where that build does not match the sources.
"""

from sim import native

native.guard()

from sim.build import arrival_schedule  # noqa: E402 - after the compiled build's guard
from sim.core import InvariantError, PolicyError, ServingCore  # noqa: E402
from sim.runner import Result, run  # noqa: E402
from sim.scenario import Scenario, ScenarioError, load_scenario  # noqa: E402
from sim.types import Decision, Policy, QueueView, ReplicaView, Request  # noqa: E402
from sim.workloads import ArrivalSchedule, WorkloadError  # noqa: E402

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
