"""Hash-block traces: LLM requests that carry their prompt's content as block hash ids.

Published traces record prefix sharing without the text: each prompt is cut into blocks of
``block_size`` tokens and each block named by an id, equal ids meaning equal content. Read:

* **Qwen-Bailian** (alibaba-edu/qwen-bailian-usagetraces-anon, Apache-2.0) JSON lines
  ``{chat_id, parent_chat_id, timestamp (s), input_length, output_length, type, turn,
  hash_ids}`` with 16-token blocks;
* **Mooncake** (kvcache-ai/Mooncake ``FAST25-release/traces``) JSON lines ``{timestamp (ms),
  input_length, output_length, hash_ids}`` with 512-token blocks;
* **CSV** with columns ``timestamp`` (s), ``input_length``, ``output_length`` and ``hash_ids``
  (ids separated by spaces, or a JSON list); its block size must be given.

:func:`engine_block_keys` turns a request's trace ids into the keys of the engine's *full*
KV blocks, each chained to its parent as vLLM's block hash is (``hash(parent_hash, tokens)``,
vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``), regrouping when the engine's block
size is a multiple of the trace's or splitting when it divides it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.scenario.workloads import WorkloadError, data_path

FORMATS = ("auto", "bailian", "mooncake", "csv")
DEFAULT_BLOCK_SIZE = {"bailian": 16, "mooncake": 512}


@dataclass(frozen=True)
class HashTrace:
    """Requests of a hash-block trace, in arrival order.

    Attributes:
        arrival_s: Arrival times (s, ascending).
        prompt_tokens: Prompt length per request.
        output_tokens: Output length per request.
        hash_ids: Per request, its prompt's block ids (the last one may name a partial block).
        block_size: Tokens per trace block.
        fmt: The format read (``bailian``, ``mooncake`` or ``csv``).
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[tuple[int, ...]]
    block_size: int
    fmt: str

    def __len__(self) -> int:
        return int(self.arrival_s.size)


def _ids(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, str):
        text = value.strip()
        value = json.loads(text) if text.startswith("[") else text.split()
    if not isinstance(value, list):
        raise WorkloadError(f"{where}: hash_ids must be a list of integers")
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: hash_ids must be a list of integers") from None


def _positive(value: Any, name: str, where: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: {name} must be an integer >= 1, got {value!r}") from None
    if number < 1:
        raise WorkloadError(f"{where}: {name} must be an integer >= 1, got {value!r}")
    return number


def _rows_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for k, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"workload.path: {str(path)!r} line {k} is not JSON "
                                    f"({exc.msg})") from None
            if not isinstance(row, dict):
                raise WorkloadError(f"workload.path: {str(path)!r} line {k} is not an object")
            rows.append(row)
    return rows


def _rows_csv(path: Path) -> list[dict[str, Any]]:
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype={"hash_ids": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"workload.path: {str(path)!r} is not a readable CSV "
                            f"({str(exc).splitlines()[0]})") from None
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def read_hash_trace(path: str | Path, fmt: str = "auto",
                    block_size: int | None = None) -> HashTrace:
    """Read a hash-block trace.

    Args:
        path: A ``.jsonl`` or ``.csv`` file, or ``builtin:NAME``.
        fmt: ``auto`` (Bailian when rows have ``chat_id``, Mooncake for other JSON lines,
            CSV by extension), ``bailian``, ``mooncake`` or ``csv``.
        block_size: Tokens per hash block (default: 16 Bailian, 512 Mooncake; required for
            CSV).

    Raises:
        WorkloadError: missing file or field, a bad value, an unknown format.
    """
    if fmt not in FORMATS:
        raise WorkloadError(f"workload.format {fmt!r}: allowed: {', '.join(FORMATS)}")
    p = data_path(path)
    if not p.is_file():
        raise WorkloadError(f"workload.path: file {str(p)!r} not found")
    is_csv = fmt == "csv" or (fmt == "auto" and p.suffix.lower() == ".csv")
    rows = _rows_csv(p) if is_csv else _rows_jsonl(p)
    if not rows:
        raise WorkloadError(f"workload.path: {str(p)!r} holds no requests")
    if is_csv:
        fmt = "csv"
    elif fmt == "auto":
        fmt = "bailian" if "chat_id" in rows[0] else "mooncake"
    if block_size is None:
        if fmt == "csv":
            raise WorkloadError("workload.block_size: a CSV trace does not state its block "
                                "size; give the tokens per hash id (e.g. 16)")
        block_size = DEFAULT_BLOCK_SIZE[fmt]
    scale = 1e-3 if fmt == "mooncake" else 1.0  # Mooncake's timestamps are milliseconds
    n = len(rows)
    arrival = np.empty(n)
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    ids: list[tuple[int, ...]] = []
    for k, row in enumerate(rows):
        where = f"{p.name} request {k + 1}"
        for name in ("timestamp", "input_length", "output_length", "hash_ids"):
            if name not in row:
                raise WorkloadError(f"{where}: field {name!r} missing (a {fmt} trace has "
                                    "timestamp, input_length, output_length, hash_ids)")
        try:
            arrival[k] = float(row["timestamp"]) * scale
        except (TypeError, ValueError):
            raise WorkloadError(f"{where}: timestamp must be a number, got "
                                f"{row['timestamp']!r}") from None
        if not math.isfinite(arrival[k]) or arrival[k] < 0:
            raise WorkloadError(f"{where}: timestamp must be finite and >= 0")
        prompt[k] = _positive(row["input_length"], "input_length", where)
        output[k] = _positive(row["output_length"], "output_length", where)
        ids.append(_ids(row["hash_ids"], where))
    order = np.argsort(arrival, kind="stable")
    return HashTrace(arrival[order], prompt[order], output[order], [ids[i] for i in order],
                     int(block_size), fmt)


def engine_block_keys(hash_ids: tuple[int, ...], prompt_tokens: int, trace_block_size: int,
                      engine_block_size: int, table: dict[tuple[int, Any], int]
                      ) -> tuple[int, ...]:
    """Keys of the engine's full prompt blocks, each naming its whole prefix.

    A key is interned in ``table`` from (parent key, block content), so equal keys mean equal
    prefixes (vLLM's chained block hash). Only blocks the prompt fills are keyed.

    Raises:
        WorkloadError: neither block size is a multiple of the other.
    """
    t, e = trace_block_size, engine_block_size
    if e % t == 0:
        g = e // t
        full_trace = min(len(hash_ids), prompt_tokens // t)
        contents: list[Any] = [hash_ids[k * g:(k + 1) * g] for k in range(full_trace // g)]
    elif t % e == 0:
        g = t // e
        n = min(prompt_tokens // e, len(hash_ids) * g)
        contents = [(hash_ids[k // g], k % g) for k in range(n)]
    else:
        raise WorkloadError(f"policy.block_size {e} and the trace's block size {t}: one must "
                            "be a multiple of the other")
    keys = []
    parent = -1
    for content in contents:
        parent = table.setdefault((parent, content), len(table))
        keys.append(parent)
    return tuple(keys)


def trace_keys(trace: HashTrace, engine_block_size: int) -> list[tuple[int, ...]]:
    """Every request's engine block keys (one interning table for the whole trace)."""
    table: dict[tuple[int, Any], int] = {}
    return [engine_block_keys(ids, int(n), trace.block_size, engine_block_size, table)
            for ids, n in zip(trace.hash_ids, trace.prompt_tokens, strict=True)]
