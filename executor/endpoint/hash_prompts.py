"""Token-id prompts that realise a hash-block trace's sharing on a real server.

A trace names each ``block_size``-token block of a prompt by an id, equal ids meaning equal
content (:mod:`sim.scenario.hash_trace`). Sent to a server, a prompt is made of the *content*
of its ids: each id stands for ``block_size`` token ids drawn from a generator seeded by
(``seed``, id), so the same id always gives the same tokens and two ids almost surely differ
(``block_size`` draws from ``hi - lo`` values). The server's prefix cache then sees the trace's
sharing whatever its own block size: vLLM hashes its blocks (128 tokens on the CPU backend)
over their token ids, chained to the parent block, so a server block is shared exactly when
the trace blocks it covers are, which is what the simulator's regrouping
(:func:`sim.scenario.hash_trace.engine_block_keys`) assumes. Tokens past the trace's ids (a
prompt longer than its ids cover) are drawn per request, so they are never shared, as the
simulator keys no block there.

A different ``seed`` gives every id new content: repeated runs against one server then start
from a cold cache for this run's content (the old blocks are only evictable, never hits),
without restarting the server or using vLLM's development-mode ``/reset_prefix_cache``.
"""

from __future__ import annotations

import numpy as np


class BlockContents:
    """The token ids each trace block id stands for (memoised)."""

    def __init__(self, block_size: int, token_ids: tuple[int, int], seed: int) -> None:
        self.block_size = block_size
        self.lo, self.hi = token_ids
        self.seed = seed
        self._memo: dict[int, np.ndarray] = {}

    def of(self, block_id: int) -> np.ndarray:
        """The ``block_size`` token ids of ``block_id``."""
        got = self._memo.get(block_id)
        if got is None:
            rng = np.random.default_rng([self.seed, 32, int(block_id)])
            got = rng.integers(self.lo, self.hi, size=self.block_size)
            self._memo[block_id] = got
        return got


def hash_prompt(ids: tuple[int, ...], prompt_tokens: int, contents: BlockContents,
                rng: np.random.Generator) -> list[int]:
    """The prompt of ``prompt_tokens`` token ids whose blocks are ``ids``' contents (the last
    one cut to what is left); tokens past the ids come from ``rng`` (private to the request).
    """
    bs = contents.block_size
    n_ids = min(len(ids), -(-prompt_tokens // bs))
    parts = [contents.of(i) for i in ids[:n_ids]]
    tokens = np.concatenate(parts)[:prompt_tokens] if parts else np.empty(0, np.int64)
    if tokens.size < prompt_tokens:
        extra = rng.integers(contents.lo, contents.hi, size=prompt_tokens - tokens.size)
        tokens = np.concatenate((tokens, extra))
    return [int(v) for v in tokens]


def hash_prompts(trace_ids: list[tuple[int, ...]], prompt_tokens: np.ndarray,
                 block_size: int, token_ids: tuple[int, int], seed: int) -> list[list[int]]:
    """Every request's prompt (:func:`hash_prompt`), content seeded by ``seed``."""
    contents = BlockContents(block_size, token_ids, seed)
    rng = np.random.default_rng([seed, 33])
    return [hash_prompt(ids, int(n), contents, rng)
            for ids, n in zip(trace_ids, prompt_tokens, strict=True)]


__all__ = ["BlockContents", "hash_prompt", "hash_prompts"]
