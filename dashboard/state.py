"""Cached simulations and shared widgets for the dashboard pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import streamlit as st
import yaml

import sim
from calibration.profile import LatencyProfile, ProfileError, builtin_profiles
from dashboard.i18n import t, translator
from sim.scenario.schema import ScenarioError

MAX_REQUESTS = 200_000
MAX_UPLOAD_BYTES = 2_000_000


@st.cache_data(show_spinner=False, max_entries=64)
def simulate(scenario_json: str, records: str = "full") -> sim.Result:
    """Simulate a scenario (cached on its JSON text and ``records``)."""
    return sim.run(json.loads(scenario_json), records=records)


def run_scenario(scenario: dict[str, Any], records: str = "full") -> sim.Result | None:
    """Validate, cap and simulate; show errors in the page (never a traceback). The pages'
    figures read the tables, so runs keep full records whatever the scenario says;
    ``records="summary"``: the result has its summary only (for pages that plot summaries).
    """
    try:
        validated = sim.load_scenario(scenario)
    except (ScenarioError, ValueError) as exc:
        st.error(f"Invalid scenario: {exc}")
        return None
    expected = estimated_requests(validated)
    if expected > MAX_REQUESTS:
        st.warning(f"This would simulate about {expected:,.0f} requests; the dashboard caps "
                   f"runs at {MAX_REQUESTS:,}. Shorten the duration or lower the rate "
                   "(or use `servelab simulate` for big runs).")
        return None
    try:
        with st.spinner("simulating…"):
            return simulate(json.dumps(validated.model_dump(mode="json"), sort_keys=True),
                            records)
    except (ProfileError, ValueError) as exc:
        st.error(f"Could not simulate: {exc}")
        return None


@st.cache_data(show_spinner=False, max_entries=64)
def simulate_llm(scenario_json: str) -> Any:
    """Simulate an LLM scenario (cached on its JSON text)."""
    import sim.llm

    return sim.llm.run(json.loads(scenario_json))


def run_llm_scenario(scenario: dict[str, Any]) -> Any:
    """Validate and simulate an LLM scenario; show errors in the page (never a traceback)."""
    from sim.scenario.llm import load_llm_scenario
    from sim.scenario.workloads import WorkloadError

    try:
        validated = load_llm_scenario(scenario)
    except (ScenarioError, ValueError) as exc:
        st.error(f"Invalid scenario: {exc}")
        return None
    try:
        with st.spinner("simulating…"):
            return simulate_llm(json.dumps(validated.model_dump(mode="json", exclude_none=True),
                                           sort_keys=True))
    except (WorkloadError, ValueError) as exc:
        st.error(f"Could not simulate: {exc}")
        return None


def estimated_requests(scenario: sim.Scenario) -> float:
    """Rough request count of a scenario (for the cap)."""
    w = scenario.workload
    n = getattr(w, "n_requests", None)
    if n:
        return float(n)
    rate = getattr(w, "rate_rps", None) or (max(w.rates_rps) if hasattr(w, "rates_rps") else 0)
    duration = getattr(w, "duration_s", None) or 0
    if w.kind == "closed":
        return 0.0  # set by the clients' round trips; not known before running
    return float(rate) * float(duration)


MAX_YAML_NODES = 100_000
MAX_UPLOAD_DEPTH = 100  # nesting levels; real scenarios and profiles use fewer than 10


class UploadError(ValueError):
    """An uploaded file cannot be used; the message is one line naming the file."""


def parse_upload(data: bytes, name: str) -> Any:
    """Parse an uploaded JSON or YAML file safely.

    Size-limited (:data:`MAX_UPLOAD_BYTES`), UTF-8 only, safe loaders only; YAML aliases are
    refused (a "billion laughs" file expands a few lines into gigabytes once anything walks
    it), and so are files of more than :data:`MAX_YAML_NODES` nodes or nested deeper than
    :data:`MAX_UPLOAD_DEPTH` levels (a deep file exhausts Python's recursion limit).

    Raises:
        UploadError: one line naming the file and what is allowed.
    """
    if len(data) > MAX_UPLOAD_BYTES:
        raise UploadError(f"{name}: {len(data):,} bytes; the limit is {MAX_UPLOAD_BYTES:,}")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise UploadError(f"{name}: not a UTF-8 text file (JSON or YAML expected)") from None
    too_deep = UploadError(f"{name}: nested more than {MAX_UPLOAD_DEPTH} levels deep")
    if name.endswith(".json"):
        if _json_depth(text) > MAX_UPLOAD_DEPTH:
            raise too_deep
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UploadError(f"{name}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        except RecursionError:
            raise too_deep from None
    try:
        depth = 0
        for nodes, event in enumerate(yaml.parse(text, Loader=yaml.SafeLoader)):
            if isinstance(event, yaml.AliasEvent):
                raise UploadError(f"{name}: YAML aliases (*name) are not allowed in uploads")
            if nodes >= MAX_YAML_NODES:
                raise UploadError(f"{name}: more than {MAX_YAML_NODES:,} YAML nodes")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_UPLOAD_DEPTH:
                    raise too_deep
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f", line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UploadError(f"{name}: not valid YAML ({problem}{line})") from None


def _json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in a JSON text (brackets inside strings skipped),
    found without recursion.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def profile_choice(key: str, label: str = "latency profile",
                   default: str | None = None) -> str | None:
    """A profile picker: shipped profiles, or an uploaded JSON saved to a temp file."""
    options = [f"builtin:{n}" for n in builtin_profiles()]
    wanted = default if default in options else "builtin:minilm-cpu"
    index = options.index(wanted) if wanted in options else 0
    choice = st.selectbox(t(label), [*options, "upload…"], index=index, format_func=translator(),
                          key=key)
    if choice != "upload…":
        return str(choice)
    upload = st.file_uploader(t("profile JSON"), type=["json"], key=f"{key}-upload")
    if upload is None:
        return None
    try:
        data = parse_upload(upload.getvalue(), upload.name)
        LatencyProfile.from_dict(data, source=upload.name)
    except (ValueError, ProfileError, UnicodeDecodeError) as exc:
        st.error(f"Not a usable profile: {exc}")
        return None
    path = Path(st.session_state.setdefault("_tmpdir", _tmpdir())) / f"{key}.json"
    path.write_text(json.dumps(data))
    return str(path)


def _tmpdir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="servelab-dash-")


def fmt(value: float, digits: int = 1, unit: str = "") -> str:
    """A number for a KPI card (– for NaN); no decimals from 1,000 on, where they only
    widen the card (``55,932 ms``, not ``55,931.8 ms``).
    """
    if value is None or value != value:
        return "–"
    if abs(value) >= 1000:
        digits = 0
    return f"{value:,.{digits}f}{unit}"


# KPI cards: Streamlit cuts a value wider than its column with an ellipsis ("102.8 …"); let
# the font shrink with the viewport and wrap as the last resort, so a number is never cut.
CARD_CSS = """<style>
[data-testid="stMetricValue"] { font-size: clamp(1.05rem, 1.55vw, 2rem); }
[data-testid="stMetricValue"], [data-testid="stMetricValue"] *,
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] * {
  overflow: visible !important; text-overflow: clip !important;
  white-space: normal !important; overflow-wrap: anywhere; }
</style>"""


def inject_styles() -> None:
    """The dashboard's CSS (KPI cards fitted to their values)."""
    st.html(CARD_CSS)
