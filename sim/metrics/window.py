"""The measurement window, in one place: where it starts and ends and what a summary needs
to know about the run besides its tables.

* :func:`horizon_s`: the window's end, ``workload.duration_s``, else the last arrival;
* :func:`planned_horizon_s`: the same, known before the run (drivers use it for the drain
  deadline);
* :func:`window_for`: the :class:`Window` of a finished run (a stopped live run ends at its
  stop), which :func:`sim.metrics.summary.summarize` reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.metrics.stability import capacity_rps
from sim.scenario.build import max_batch_size, policy_batch_sizes, sheds_load, slo_s
from sim.serving.sources import ScheduleSource

if TYPE_CHECKING:
    import pandas as pd

    from sim.scenario.llm import LlmScenario
    from sim.scenario.schema import Scenario
    from sim.scenario.service import ServiceModel
    from sim.serving.core import ServingCore


def scenario_capacity_rps(scenario: Scenario, service: ServiceModel,
                          mean_size: float = 1.0, requests: int | None = None) -> float:
    """Requests per second the scenario's fleet can finish at best (see
    :func:`sim.metrics.stability.capacity_rps`); ``requests``: the run's arrivals, which bound
    the batch sizes tried.
    """
    return capacity_rps(service.mean_s, policy_batch_sizes(scenario, requests),
                        scenario.most_replicas, scenario.policy.max_concurrent_batches,
                        mean_size)


@dataclass(frozen=True)
class Window:
    """What the summary needs to know besides the tables.

    Attributes:
        warmup_s: Start of the measurement window.
        horizon_s: End of the measurement window.
        replicas: Number of replicas.
        max_batch_size: Largest batch the policy may form.
        slo_s: Latency objective for goodput (None: no goodput).
        price_per_replica_hour: For cost per million requests (0: not reported).
        end_s: When the run stopped (inf: every request was drained).
        capacity_rps: The fleet's capacity (see :func:`sim.metrics.stability.capacity_rps`).
        closed_loop: Arrivals come from closed-loop clients.
        bounded: A queue bound, a request timeout or a dropping policy sheds excess load.
        has_deadlines: Requests carry their own deadlines (request classes with an SLO):
            goodput counts completions by their deadline.
    """

    warmup_s: float
    horizon_s: float
    replicas: int
    max_batch_size: int
    slo_s: float | None = None
    price_per_replica_hour: float = 0.0
    end_s: float = math.inf
    capacity_rps: float = math.nan
    closed_loop: bool = False
    bounded: bool = False
    has_deadlines: bool = False

    @property
    def length_s(self) -> float:
        """Window length in seconds."""
        return max(self.horizon_s - self.warmup_s, 0.0)

    @property
    def per_s(self) -> float:
        """Factor turning a count in the window into a rate per second (NaN for an empty
        window): throughput, offered load and goodput are counts times this.
        """
        span = self.length_s
        return (1.0 / span) if span > 0 else math.nan


def horizon_s(scenario: Scenario | LlmScenario, last_arrival_s: float) -> float:
    """End of the measurement window: duration_s, else the last arrival (request-level and
    LLM scenarios alike).
    """
    duration = getattr(scenario.workload, "duration_s", None)
    if duration is not None and math.isfinite(duration):
        return float(duration)
    return float(last_arrival_s)


def has_deadlines(scenario: Scenario) -> bool:
    """Requests carry their own deadlines (request classes with an SLO)."""
    return bool(scenario.classes and any(c.slo_ms is not None for c in scenario.classes))


def default_drain_s(scenario: Scenario | LlmScenario) -> float:
    """The default drain timeout of live runs and of the predictions compared with them: the
    window's length (``duration_s`` − ``warmup_s``, at least 1 s). A workload bounded by a
    request count has no such length before it runs: a request-level run then drains
    everything (inf), an LLM run stops 60 s after the horizon.
    """
    from sim.scenario.llm import LlmScenario

    duration = getattr(scenario.workload, "duration_s", None)
    if duration is not None:
        return max(float(duration) - scenario.warmup_s, 1.0)
    return 60.0 if isinstance(scenario, LlmScenario) else math.inf


def planned_horizon_s(scenario: Scenario, core: ServingCore) -> float:
    """The window's end as known before the run: ``duration_s``, else the last scheduled
    arrival (inf for a closed loop bounded only by ``n_requests``).
    """
    if isinstance(core.source, ScheduleSource):
        n = core.table.n
        return horizon_s(scenario, float(core.table.arrival_s[n - 1]) if n else 0.0)
    duration = getattr(scenario.workload, "duration_s", None)
    return math.inf if duration is None else float(duration)


def window_for(scenario: Scenario, requests: pd.DataFrame, service: ServiceModel, *,
               end_s: float = math.inf, stopped_s: float | None = None) -> Window:
    """The measurement window of a finished run (the one place that defines it).

    Args:
        scenario: The resolved scenario.
        requests: The run's request table (``arrival_s``, and ``size`` unless every
            request is one item).
        service: The service model (for the capacity in the stability verdict).
        end_s: When the run stopped (inf: it drained every request).
        stopped_s: A stopped live run: when it stopped admitting (ends the window early).
    """
    last = float(requests["arrival_s"].max()) if len(requests) else 0.0
    horizon = horizon_s(scenario, last)
    if stopped_s is not None:
        horizon = min(horizon, stopped_s)
    mean_size = float(requests["size"].mean()) if len(requests) and "size" in requests \
        else 1.0
    return Window(
        warmup_s=scenario.warmup_s,
        horizon_s=horizon,
        replicas=scenario.fleet_size,
        max_batch_size=max_batch_size(scenario),
        slo_s=slo_s(scenario),
        price_per_replica_hour=scenario.price_per_replica_hour,
        end_s=end_s,
        capacity_rps=scenario_capacity_rps(scenario, service, mean_size, len(requests)),
        closed_loop=scenario.workload.kind == "closed",
        bounded=sheds_load(scenario),
        has_deadlines=has_deadlines(scenario),
    )
