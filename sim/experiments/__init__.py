"""The experiment layer on top of ``sim.run``: sweeps and replications (:mod:`.sweep`),
capacity planning (:mod:`.capacity`) and the sweep's HTML report (:mod:`.report`).

The names users script with are re-exported here::

    from sim.experiments import sweep, replicate, pareto, capacity, replicas_needed
"""

from sim.experiments.capacity import CapacityResult, capacity, meets, parse_slo, replicas_needed
from sim.experiments.sweep import (
    ExperimentError,
    Progress,
    batch_means,
    confidence_table,
    flatten,
    pareto,
    parse_grid,
    parse_grid_value,
    replicate,
    sweep,
)

__all__ = [
    "CapacityResult",
    "ExperimentError",
    "Progress",
    "batch_means",
    "capacity",
    "confidence_table",
    "flatten",
    "meets",
    "pareto",
    "parse_grid",
    "parse_grid_value",
    "parse_slo",
    "replicas_needed",
    "replicate",
    "sweep",
]
