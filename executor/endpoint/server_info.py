"""What a server tells about itself: ``/v1/models`` and the Prometheus ``/metrics`` page
(vLLM: ``vllm:cache_config_info`` with block size, KV capacity and prefix caching; counters
and histogram sums such as ``vllm:time_to_first_token_seconds_sum``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from sim.errors import UserError

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# the most of one answer to a look-up or a 1-request test (model list, metadata, /metrics, a
# preflight) that is read: vLLM's /metrics page is ~100 KiB, the rest a few KiB; a server
# that sends more (a wrong port, a broken proxy, an endless body) is refused, not buffered
MAX_INFO_BYTES = 16 * 2**20
# what a broken server can make urllib raise besides URLError/OSError: a status line that is
# not HTTP (BadStatusLine), a body cut short (IncompleteRead), a bad chunk size
HTTP_ERRORS = (urllib.error.URLError, OSError, http.client.HTTPException)
# what json.loads raises on a body that is not JSON we can read: malformed, or nested
# deeper than Python's stack (RecursionError)
BAD_JSON = (ValueError, RecursionError)


class EndpointError(UserError):
    """The endpoint cannot be used as given (unreachable, wrong path, refuses the request)."""


def base_url(endpoint: str) -> str:
    """``http://host:port`` from what a user passes (a trailing ``/`` or ``/v1`` dropped).

    Raises:
        EndpointError: not an http(s) URL (no host, a port outside 1-65535, user
            credentials, a query or fragment: each request's path is appended to it).
    """
    url = endpoint.strip().rstrip("/")
    bad = f"--endpoint {endpoint!r}: expected an http(s) URL such as http://127.0.0.1:8000"
    if not re.match(r"^https?://[^/\s]+", url):
        raise EndpointError(bad)
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when not a number in 0-65535
    except ValueError as exc:
        raise EndpointError(f"{bad} ({exc})") from None
    if not parts.hostname or port == 0:
        raise EndpointError(f"{bad} (a host, and a port in 1-65535)")
    if parts.username is not None or parts.password is not None:
        raise EndpointError(f"{bad}: user credentials in the URL are not sent")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise EndpointError(f"{bad}: no query or fragment (request paths are appended to "
                            "the base URL)")
    return url[:-3] if url.endswith("/v1") else url


def unreachable(url: str, exc: BaseException) -> str:
    """The one line for a request that got no usable answer: not reached, or (an
    ``http.client`` error) an answer that is not HTTP or was cut short.
    """
    if isinstance(exc, http.client.HTTPException):
        return f"{url}: not a complete HTTP answer: {_reason(exc)}"
    return f"cannot reach {url}: {_reason(exc)}"


def read_capped(resp: Any, url: str, limit: int = MAX_INFO_BYTES) -> bytes:
    """At most ``limit`` bytes of a urllib answer's body.

    Raises:
        EndpointError: the body is longer (never buffered whole: a server can send forever).
    """
    data = bytes(resp.read(limit + 1))
    if len(data) > limit:
        raise EndpointError(f"{url}: the answer is longer than {limit // 2**20} MiB (a "
                            "look-up or 1-request test answers a few KiB): is --endpoint "
                            "the server's base URL?")
    return data


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "reason", None)
    text = str(inner if inner is not None else exc)
    if "Connection refused" in text or isinstance(inner, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.HTTPException):  # not HTTP, or cut short: name which
        text = f"{type(exc).__name__}: {text}"
    # one line of printable text: a garbage answer's bytes must not reach the terminal
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:160]


def get_text(url: str, timeout_s: float = 10.0) -> tuple[int, str]:
    """(HTTP status, body) of a GET; status 0 when the server cannot be reached.

    Raises:
        EndpointError: the server cannot be reached.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), read_capped(resp, url).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except HTTP_ERRORS as exc:
        raise EndpointError(unreachable(url, exc)) from None


def models(base: str) -> dict[str, Any] | None:
    """The server's ``/v1/models`` answer (None when it has none); its ``data`` holds only
    the entries that name a model (an object with a non-empty string ``id``).
    """
    status, body = get_text(f"{base}/v1/models")
    if status != 200:
        return None
    try:
        data = json.loads(body)
    except BAD_JSON:
        return None
    if not isinstance(data, dict):
        return None
    listed = data.get("data")
    data["data"] = [m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)
                    and m["id"]] if isinstance(listed, list) else []
    return data


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
