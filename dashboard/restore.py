"""Restoring a scenario file on the Explore page: one error surface.

A restored file becomes the defaults of the page's controls. Whatever is wrong with it — not
YAML, not a scenario, an invalid field, an LLM scenario, or a valid scenario that the page's
controls cannot show (a trace workload, a batch size above the slider's range) — comes back
as one line naming the file and the field, and the page keeps its own defaults: never a
traceback from a widget that was handed a value it cannot hold.
"""

from __future__ import annotations

from typing import Any

from dashboard.state import parse_upload
from dashboard.widgets import POLICY_KINDS, WORKLOAD_KINDS
from sim.errors import UserError

ROUTINGS = ["shared", "round_robin", "random", "jsq", "p2c", "least_work"]
DISCIPLINES = ["fifo", "priority", "edf"]
AUTOSCALERS = ["target", "concurrency"]

# dotted key -> the range of the Explore control that shows it (the widgets' own bounds)
RANGES: dict[str, tuple[float, float]] = {
    "policy.max_batch_size": (1, 64), "policy.batch_size": (1, 64),
    "policy.max_wait_ms": (0.0, 100.0), "policy.timeout_ms": (0.0, 10_000.0),
    "policy.slo_ms": (1.0, 10_000.0),
    "workload.duration_s": (5, 600), "workload.rate_rps": (0.1, 100_000.0),
    "workload.cv": (0.25, 8.0), "workload.amplitude": (0.0, 1.0),
    "workload.period_s": (1.0, 86_400.0), "workload.clients": (1, 256),
    "workload.think_ms": (0.0, 60_000.0),
    "queue.max_len": (0, 100_000), "queue.timeout_ms": (0.0, 600_000.0),
    "replicas": (1, 32), "slo_ms": (1.0, 600_000.0), "seed": (0, 1_000_000),
}
CHOICES: dict[str, list[str]] = {
    "workload.kind": WORKLOAD_KINDS, "policy.kind": POLICY_KINDS, "routing": ROUTINGS,
    "queue.discipline": DISCIPLINES, "autoscaling.kind": AUTOSCALERS,
}


class RestoreError(UserError):
    """The file cannot be restored on this page; the message is one line."""


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def restorable(raw: bytes, name: str) -> dict[str, Any]:
    """The scenario in an uploaded file, checked to fit the Explore page's controls.

    Raises:
        RestoreError: one line naming the file, the field and what is allowed.
    """
    from sim.scenario.llm import is_llm_data
    from sim.scenario.schema import load_scenario

    try:
        data = parse_upload(raw, name)
    except ValueError as exc:
        raise RestoreError(str(exc)) from None
    if not isinstance(data, dict):
        raise RestoreError(f"{name}: the file must hold a mapping of scenario keys "
                           f"(name, service, workload, policy, ...), not a {type(data).__name__}")
    try:
        llm = is_llm_data(data)
    except (ValueError, TypeError, AttributeError):
        llm = False
    if llm:
        raise RestoreError(f"{name}: an LLM scenario: open it on the LLM page, or run it with "
                           "`servelab simulate`")
    try:
        load_scenario(data)
    except (UserError, TypeError, OSError) as exc:
        raise RestoreError(f"{name}: {' '.join(str(exc).split())}") from None
    for key, allowed in CHOICES.items():
        value = _get(data, key)
        if value is not None and value not in allowed:
            raise RestoreError(f"{name}: {key} {value!r}: this page's controls cover "
                               f"{', '.join(allowed)}; run the file with `servelab simulate`")
    for key, (low, high) in RANGES.items():
        value = _get(data, key)
        if isinstance(value, int | float) and not isinstance(value, bool) and not (
                low <= value <= high):
            raise RestoreError(f"{name}: {key} {value:g}: this page's control allows "
                               f"{low:g} to {high:g}; run the file with `servelab simulate`")
    return data
