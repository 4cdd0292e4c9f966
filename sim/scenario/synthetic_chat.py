"""A synthetic multi-turn chat trace in the Qwen-Bailian format (clearly not real traffic).

Each session picks a shared system prompt (Zipf popularity), then sends turns: a turn's prompt
is the system prompt, every earlier user message and answer, and the new user message, so
turn ``t + 1`` extends turn ``t``'s prompt with its answer. Tokens are unique integers per
segment (system prompt, message, answer); blocks of ``block_size`` tokens are named by ids
interned from (parent id, block tokens), the partial last block included, as the Bailian
traces name theirs (a chained hash remapped to sequential integers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _lognormal(rng: np.random.Generator, mean: float, cv: float, cap: int) -> int:
    sigma2 = np.log1p(cv * cv)
    value = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2))
    return int(min(cap, max(1, round(value))))


def synthetic_chat_trace(rng: np.random.Generator, *, sessions: int = 400,
                         session_rate_rps: float = 1.0, system_prompts: int = 8,
                         zipf_s: float = 1.2, system_tokens_mean: float = 800,
                         mean_turns: float = 3.0, max_turns: int = 8,
                         user_tokens_mean: float = 120, output_tokens_mean: float = 200,
                         think_s_mean: float = 30.0, block_size: int = 16
                         ) -> list[dict[str, Any]]:
    """Rows ``{chat_id, parent_chat_id, timestamp, input_length, output_length, type, turn,
    hash_ids}`` sorted by timestamp (seconds from 0).
    """
    next_token = 0

    def segment(n: int) -> range:
        nonlocal next_token
        seg = range(next_token, next_token + n)
        next_token += n
        return seg

    weights = 1.0 / np.arange(1, system_prompts + 1) ** zipf_s
    weights /= weights.sum()
    systems = [segment(_lognormal(rng, system_tokens_mean, 0.5, 4000))
               for _ in range(system_prompts)]
    table: dict[tuple[int, tuple[int, ...]], int] = {}
    rows: list[dict[str, Any]] = []
    start = np.cumsum(rng.exponential(1.0 / session_rate_rps, size=sessions))
    for t0 in start:
        context: list[int] = list(systems[int(rng.choice(system_prompts, p=weights))])
        turns = min(max_turns, int(rng.geometric(1.0 / mean_turns)))
        t, parent = float(t0), -1
        for turn in range(1, turns + 1):
            context.extend(segment(_lognormal(rng, user_tokens_mean, 1.0, 2000)))
            ids, pid = [], -1
            for b in range(0, len(context), block_size):
                pid = table.setdefault((pid, tuple(context[b:b + block_size])), len(table))
                ids.append(pid)
            out = _lognormal(rng, output_tokens_mean, 1.0, 1024)
            chat_id = len(rows)
            rows.append({"chat_id": chat_id, "parent_chat_id": parent,
                         "timestamp": round(t, 3), "input_length": len(context),
                         "output_length": out, "type": "text", "turn": turn,
                         "hash_ids": ids})
            context.extend(segment(out))
            parent = chat_id
            t += float(rng.exponential(think_s_mean))
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSON lines."""
    p = Path(path)
    with p.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, separators=(",", ":")) + "\n")
    return p
