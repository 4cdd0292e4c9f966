"""Restoring a scenario file on the Explore page: one error surface.

A restored file becomes the defaults of the page's controls. Whatever is wrong with it — not
YAML, not a scenario, an invalid field, an LLM scenario, or a valid scenario that the page's
controls cannot show (a trace workload, a batch size above the slider's range) — comes back
as one line naming the file and the field, and the page keeps its own defaults: never a
traceback from a widget that was handed a value it cannot hold.
"""

from __future__ import annotations

import math
from typing import Any

from dashboard.state import parse_upload
from dashboard.widgets import POLICY_KINDS, WORKLOAD_KINDS
from sim.errors import UserError
from sim.serving.autoscaling import AGGREGATIONS

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
    "workload.rates_rps.0": (0.1, 100_000.0), "workload.rates_rps.1": (0.0, 100_000.0),
    "autoscaling.min_replicas": (0, 16), "autoscaling.max_replicas": (1, 16),
    "autoscaling.cold_start_s": (0.0, 600.0),
    "autoscaling.target_ongoing_requests": (0.1, 1000.0),
    "autoscaling.upscale_delay_s": (0.0, 120.0), "autoscaling.downscale_delay_s": (0.0, 600.0),
    "autoscaling.look_back_period_s": (0.5, 60.0),
    "autoscaling.target_concurrency": (0.1, 1000.0),
    "autoscaling.stable_window_s": (1.0, 300.0), "autoscaling.panic_window_s": (0.5, 60.0),
    "autoscaling.scale_to_zero_grace_s": (0.0, 300.0),
    "price_per_replica_hour": (0.0, 1000.0), "workload.mean_dwell_s": (0.1, 30.0),
}
CHOICES: dict[str, list[str]] = {
    "workload.kind": WORKLOAD_KINDS, "policy.kind": POLICY_KINDS, "routing": ROUTINGS,
    "queue.discipline": DISCIPLINES, "autoscaling.kind": AUTOSCALERS,
    "autoscaling.aggregation_function": list(AGGREGATIONS),
    "policy.timer": ["request", "first"],
}


class RestoreError(UserError):
    """The file cannot be restored on this page; the message is one line."""


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def forget_widgets_once(raw: bytes, marker: str, prefixes: tuple[str, ...],
                        keep: tuple[str, ...] = ()) -> None:
    """Drop the page's widget states the first time a file is restored, so that the
    widgets are drawn anew with the file's values as their defaults (a keyed widget keeps
    its state and ignores a new default); the same file on later reruns leaves the user's
    changes alone. ``marker``: the session-state key that remembers the file.
    """
    import hashlib

    import streamlit as st

    digest = hashlib.sha256(raw).hexdigest()
    if st.session_state.get(marker) == digest:
        return
    st.session_state[marker] = digest
    for key in [k for k in st.session_state if isinstance(k, str)
                and k.startswith(prefixes) and k not in (marker, *keep)
                and not k.endswith("-upload")]:  # an uploaded profile stays uploaded
        del st.session_state[key]


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
        model = load_scenario(data)
    except (UserError, TypeError, OSError) as exc:
        raise RestoreError(f"{name}: {' '.join(str(exc).split())}") from None
    # the sections the page's controls show, with the scenario's own defaults for what the
    # file leaves out (not the page's: an autoscaler restored without delays runs Ray's
    # 30 s / 600 s, as `servelab simulate` would run the file)
    data = _with_defaults(data, model)
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
    if _get(data, "policy.kind") == "fixed" and _get(data, "policy.timeout_ms") is None:
        raise RestoreError(f"{name}: policy.timeout_ms: none (wait for a full batch): this "
                           "page's control needs a number of ms; run the file with "
                           "`servelab simulate`")
    return data


SECTIONS = ("workload", "policy", "queue", "autoscaling")


def _with_defaults(data: dict[str, Any], model: Any) -> dict[str, Any]:
    """``data`` with each of :data:`SECTIONS` it holds as the validated scenario has it
    (the schema's defaults filled in, unset values left out).
    """
    out = dict(data)
    for section in SECTIONS:
        if isinstance(data.get(section), dict) and getattr(model, section, None) is not None:
            out[section] = getattr(model, section).model_dump(exclude_none=True, mode="json")
    return out


def _clean(node: Any) -> Any:
    """``node`` without None values in its mappings (at any depth, lists included)."""
    if isinstance(node, dict):
        return {k: _clean(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def unshown_fields(loaded: dict[str, Any], scenario: dict[str, Any]) -> list[str]:
    """The restored file's fields (``loaded``: as :func:`restorable` returns it, its
    shown sections with the schema's defaults) the page's scenario does not hold as the
    file has them (no control for them, or a control that rounds: a whole-second duration):
    what a user must be told was left behind. Both sides are compared as the simulator
    fills them in; a field unset (None) on either side counts as absent.
    """
    from sim.scenario.schema import load_scenario

    try:  # the page's run as the simulator fills it in
        page = _with_defaults(scenario, load_scenario(scenario))
    except (UserError, TypeError, OSError, ValueError):
        page = scenario
    have = _flat(_clean(page))
    out = []
    for key, value in _flat(_clean(loaded)).items():
        if key == "name" or value is None:
            continue
        got = have.get(key)
        same = (math.isclose(float(value), float(got), rel_tol=1e-9, abs_tol=1e-12)
                if isinstance(value, int | float) and isinstance(got, int | float)
                and not isinstance(value, bool) and not isinstance(got, bool)
                else value == got)
        if not same:
            out.append(key)
    return out
