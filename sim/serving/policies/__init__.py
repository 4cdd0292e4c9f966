"""Batching and scheduling policies: plain objects that decide, never act.

``POLICIES`` maps a scenario's ``policy.kind`` to the class; that one mapping is the registry.
"""

from sim.serving.policies.adaptive import AimdBatching
from sim.serving.policies.dynamic import DynamicBatching
from sim.serving.policies.simple import FixedBatch, Greedy, NoBatching
from sim.serving.policies.slo import SloBatching

POLICIES: dict[str, type] = {
    "none": NoBatching,
    "greedy": Greedy,
    "fixed": FixedBatch,
    "dynamic": DynamicBatching,
    "aimd": AimdBatching,
    "slo": SloBatching,
}

__all__ = [
    "POLICIES",
    "AimdBatching",
    "DynamicBatching",
    "FixedBatch",
    "Greedy",
    "NoBatching",
    "SloBatching",
]
