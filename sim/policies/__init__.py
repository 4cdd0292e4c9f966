"""Batching and scheduling policies: plain objects that decide, never act.

``POLICIES`` maps a scenario's ``policy.kind`` to the class; that one mapping is the registry.
"""

from sim.policies.adaptive import AimdBatching
from sim.policies.dynamic import DynamicBatching
from sim.policies.simple import FixedBatch, Greedy, NoBatching
from sim.policies.slo import SloBatching

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
