"""The comparison directories the Verify page lists, and what each one measured.

``servelab compare`` writes ``compare.json`` with ``live-i/`` run directories (the servelab
executor ran the model); ``servelab compare --endpoint`` writes the same ``compare.json``
with ``bench-i/`` run directories, measured against a server (vLLM for an LLM scenario, Ray
Serve or KServe for a request-level one) whose identity each run's ``meta.json`` records:
the endpoint URL and API, and what the server said about itself (``/v1/models``'
``owned_by``, a KServe v2 model's ``platform``). This module finds them and labels them;
no streamlit here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# what servers call themselves -> how the page names them
SERVER_NAMES = {"vllm": "vLLM", "servelab-stub": "servelab stub server",
                "ray": "Ray Serve", "ray-serve": "Ray Serve", "rayserve": "Ray Serve",
                "kserve": "KServe"}
API_NAMES = {"openai-completions": "OpenAI completions", "openai-chat": "OpenAI chat",
             "kserve-v2": "KServe v2", "http-json": "HTTP JSON"}
RUN_GLOBS = ("live-*", "bench-*")


def compare_dirs(root: Path, depth: int = 3) -> list[Path]:
    """Directories under ``root`` (``root`` itself included, at most ``depth`` levels down)
    that hold a comparison: a ``compare.json``, or ``rho-*/compare.json`` (a sweep, listed
    once as its parent). Sorted by path.
    """
    found: set[Path] = set()
    if not root.is_dir():
        return []
    for level in range(depth + 1):
        for marker in root.glob("/".join(["*"] * level + ["compare.json"])):
            here = marker.parent
            found.add(here.parent if here.name.startswith("rho-") else here)
    return sorted(found)


def run_dirs(path: Path) -> list[Path]:
    """A comparison's measured runs: ``live-i/`` (executor) and ``bench-i/`` (endpoint)."""
    return sorted(d for pattern in RUN_GLOBS for d in path.glob(pattern) if d.is_dir())


def _first_compare(path: Path) -> Path | None:
    if (path / "compare.json").is_file():
        return path
    loads = sorted(path.glob("rho-*/compare.json"))
    return loads[0].parent if loads else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def server_name(meta: dict[str, Any]) -> str | None:
    """What the server measured by a run called itself (None: not recorded)."""
    for key in ("server", "server_name"):
        if isinstance(meta.get(key), str) and meta[key]:
            return SERVER_NAMES.get(meta[key].lower(), str(meta[key]))
    models = (meta.get("server_models") or {}).get("data") or []
    owners = [m.get("owned_by") for m in models if isinstance(m, dict) and m.get("owned_by")]
    if owners:
        return SERVER_NAMES.get(str(owners[0]).lower(), str(owners[0]))
    platform = (meta.get("server_model_metadata") or {}).get("platform")
    if platform:
        return SERVER_NAMES.get(str(platform).lower(), str(platform))
    return None


def measured_by(path: Path) -> dict[str, Any]:
    """What a comparison directory measured: ``{"kind": "endpoint" | "live", "server",
    "label"}``, from its ``compare.json`` and its first run's ``meta.json``.
    """
    where = _first_compare(path) or path
    data = _read_json(where / "compare.json")
    runs = run_dirs(where)
    meta = _read_json(runs[0] / "meta.json") if runs else {}
    device = meta.get("device") or {}
    endpoint = data.get("endpoint") or device.get("url")
    if data.get("driver") == "bench" or device.get("kind") == "endpoint" or (
            runs and runs[0].name.startswith("bench-")):
        server = server_name(meta) or server_name(data) or "a server"
        api = API_NAMES.get(str(device.get("api")), device.get("api"))
        return {"kind": "endpoint", "server": server, "api": api, "endpoint": endpoint}
    name = device.get("name") or device.get("kind") or "the local device"
    return {"kind": "live", "server": "servelab executor", "device": name}


def label(info: dict[str, Any], tr: Callable[[str], str] = str) -> str:
    """One line for :func:`measured_by`'s answer, its words passed through ``tr`` (the
    dashboard's translation): ``endpoint: vLLM (OpenAI completions) at http://…`` or
    ``live: servelab executor on cpu``.
    """
    if info["kind"] == "endpoint":
        return (f"{tr('endpoint')}: {tr(info['server'])}"
                + (f" ({tr(info['api'])})" if info.get("api") else "")
                + (f" {tr('at')} {info['endpoint']}" if info.get("endpoint") else ""))
    return f"{tr('live')}: {tr('servelab executor')} {tr('on')} {info['device']}"


def listing(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(directory, :func:`measured_by`) of every comparison under ``root``: the live ones
    first, then those measured against a server, each by name.
    """
    rows = [(d, measured_by(d)) for d in compare_dirs(root)]
    rows.sort(key=lambda r: (r[1]["kind"] != "live", str(r[0])))
    return rows
