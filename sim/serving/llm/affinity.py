"""Cache-aware routing across LLM replicas: send a request where its prefix is cached,
unless that would unbalance the fleet.

The rule is SGLang's cache-aware router (sgl-router, ``cache_aware`` policy): the fleet is
*imbalanced* when the most and least loaded candidates differ by more than
``balance_abs_threshold`` requests **and** the most loaded holds more than
``balance_rel_threshold`` × the least; then the request joins the shortest queue. Otherwise it
goes to the replica holding its longest cached prefix when that prefix covers at least
``cache_threshold`` of the prompt, else to the shortest queue (SGLang picks the replica with
the smallest cache tree there; the shortest queue is this simulator's choice). The match is
read from the engines' block pools themselves, as llm-d's *precise* prefix-cache scorer does
from vLLM's KV events (SGLang's router keeps an approximate tree of what it routed instead).
Ties go to the lower load, then the lower index. No clock, no simpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sim.serving.llm.kv import Seq


@dataclass(frozen=True)
class PrefixAffinity:
    """The cache-aware rule's knobs (see the module docstring)."""

    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5
    cache_threshold: float = 0.5

    def choose(self, seq: Seq, candidates: Iterable[int], loads: Sequence[int],
               schedulers: Sequence[Any]) -> int:
        """The replica for ``seq`` among ``candidates`` (``loads``: requests waiting or
        running per replica; ``schedulers``: each replica's, read for its cached prefix).
        """
        slots = list(candidates)
        shortest = min(slots, key=lambda r: (loads[r], r))
        lo, hi = loads[shortest], max(loads[r] for r in slots)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            return shortest
        best, best_tokens = shortest, -1
        for r in sorted(slots, key=lambda r: (loads[r], r)):
            kv = getattr(schedulers[r], "kv", None)
            tokens = kv.cached_prefix_tokens(seq) if kv is not None else 0
            if tokens > best_tokens:
                best, best_tokens = r, tokens
        if seq.prompt and best_tokens / seq.prompt >= self.cache_threshold:
            return best
        return shortest
