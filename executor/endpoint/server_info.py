"""What a server tells about itself: ``/v1/models`` and the Prometheus ``/metrics`` page
(vLLM: ``vllm:cache_config_info`` with block size, KV capacity and prefix caching; counters
and histogram sums such as ``vllm:time_to_first_token_seconds_sum``).
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request
from typing import Any

from sim.errors import UserError

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class EndpointError(UserError):
    """The endpoint cannot be used as given (unreachable, wrong path, refuses the request)."""


def base_url(endpoint: str) -> str:
    """``http://host:port`` from what a user passes (a trailing ``/`` or ``/v1`` dropped).

    Raises:
        EndpointError: not an http(s) URL.
    """
    url = endpoint.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise EndpointError(f"--endpoint {endpoint!r}: expected an http(s) URL such as "
                            "http://127.0.0.1:8000")
    return url[:-3] if url.endswith("/v1") else url


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "reason", None)
    text = str(inner if inner is not None else exc)
    if "Connection refused" in text or isinstance(inner, ConnectionRefusedError):
        return "connection refused"
    return " ".join(text.split())[:160]


def get_text(url: str, timeout_s: float = 10.0) -> tuple[int, str]:
    """(HTTP status, body) of a GET; status 0 when the server cannot be reached.

    Raises:
        EndpointError: the server cannot be reached.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except (urllib.error.URLError, OSError) as exc:
        raise EndpointError(f"cannot reach {url}: {_reason(exc)}") from None


def models(base: str) -> dict[str, Any] | None:
    """The server's ``/v1/models`` answer (None when it has none)."""
    status, body = get_text(f"{base}/v1/models")
    if status != 200:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_metrics(text: str) -> dict[str, Any]:
    """The ``vllm:`` samples of a Prometheus page: ``info`` (each ``*_info`` metric's labels)
    and ``values`` (each metric name's samples summed over their labels; histogram
    ``_bucket`` lines left out of it) and ``buckets`` (each histogram's cumulative counts by
    upper bound, ``le`` as written, summed over the other labels: e.g. vLLM's
    ``iteration_tokens_total``, the tokens of each engine step).
    """
    info: dict[str, dict[str, str]] = {}
    values: dict[str, float] = {}
    buckets: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        match = SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.group(1), match.group(3) or "", match.group(4)
        if name.endswith("_info"):
            info[name.removeprefix("vllm:")] = dict(LABEL.findall(labels))
            continue
        if name.endswith("_bucket"):
            le = dict(LABEL.findall(labels)).get("le")
            hist = buckets.setdefault(name.removeprefix("vllm:").removesuffix("_bucket"), {})
            with contextlib.suppress(ValueError):
                if le is not None:
                    hist[le] = hist.get(le, 0.0) + float(value)
            continue
        try:
            values[name.removeprefix("vllm:")] = values.get(name.removeprefix("vllm:"), 0.0) \
                + float(value)
        except ValueError:
            continue
    return {"info": info, "values": values, "buckets": buckets}


def metrics(base: str) -> dict[str, Any] | None:
    """The parsed ``/metrics`` page (None when the server has none)."""
    try:
        status, body = get_text(f"{base}/metrics")
    except EndpointError:
        return None
    return parse_metrics(body) if status == 200 else None


def histogram_mean(before: dict[str, Any] | None, after: dict[str, Any] | None,
                 names: tuple[str, ...]) -> float | None:
    """The mean of the first of the server's histograms ``names`` that moved between two
    ``/metrics`` pages (None: not exposed).
    """
    if not before or not after:
        return None
    for name in names:
        s0, s1 = before["values"].get(f"{name}_sum"), after["values"].get(f"{name}_sum")
        c0, c1 = before["values"].get(f"{name}_count"), after["values"].get(f"{name}_count")
        if None not in (s0, s1, c0, c1) and c1 > c0:
            return float((s1 - s0) / (c1 - c0))
    return None


def scheduling_config(metrics_page: dict[str, Any] | None) -> dict[str, Any]:
    """The scheduling knobs a vLLM server exposes: block size, KV blocks and capacity in
    tokens, prefix caching.
    """
    if not metrics_page:
        return {}
    cache = metrics_page["info"].get("cache_config_info", {})
    out: dict[str, Any] = {"cache_config_info": cache}
    if cache.get("block_size", "").isdigit():
        out["block_size"] = int(cache["block_size"])
    blocks = cache.get("num_gpu_blocks") or cache.get("num_cpu_blocks")
    if blocks and blocks.isdigit():
        out["num_blocks"] = int(blocks)
    if cache.get("kv_cache_size_tokens", "").isdigit():
        out["kv_capacity_tokens"] = int(cache["kv_cache_size_tokens"])
    if "enable_prefix_caching" in cache:
        out["enable_prefix_caching"] = cache["enable_prefix_caching"] == "True"
    return out
