"""Per-request costs outside the engine's steps (``service.overheads``; for ``llm_roofline``
the coefficient set's, unless the service gives its own), applied around the clock-free
core as BLIS applies its α terms: the core sees each request ``request_ms`` after its
arrival (API and tokenisation before the scheduler), and the tables the run reports put
each output token ``index × per_output_token_ms`` later than its step ended (detokenisation
and streaming add to every gap the client sees) and each response ``post_decode_ms`` after
its last token. All default to 0, which leaves a run unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from sim.scenario.llm import LlmScenario


class Overheads(NamedTuple):
    """A run's per-request overheads, in seconds."""

    request_s: float = 0.0
    per_token_s: float = 0.0
    post_decode_s: float = 0.0


def overheads_s(scenario: LlmScenario) -> Overheads:
    """(request, per output token, post-decode) overheads of the scenario's service, in
    seconds: ``service.overheads``, or an ``llm_roofline`` service's coefficient set's.
    """
    cfg = getattr(scenario.service, "overheads", None)
    if cfg is None and scenario.service.kind == "llm_roofline":
        from sim.scenario.roofline.service import roofline_overheads

        cfg = roofline_overheads(scenario.service)
    if cfg is None:
        return Overheads()
    return Overheads(cfg.request_ms / 1e3, cfg.per_output_token_ms / 1e3,
                     cfg.post_decode_ms / 1e3)


def apply_overheads(requests: pd.DataFrame, tokens: pd.DataFrame, token_s: np.ndarray,
                    token_offset: np.ndarray, arrival_s: np.ndarray, per_token_s: float,
                    post_decode_s: float = 0.0,
                    ) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """The tables as the client sees them: arrivals back at their scheduled times (the core
    saw them later by the request overhead), token ``k`` of each request
    ``k × per_token_s`` later, and each finished response ``post_decode_s`` after its last
    token.

    Args:
        requests: The core's requests table (its ``arrival_s`` shifted).
        tokens: One row per output token (``id``, ``index``, ``time_s``).
        token_s: Every token's time, request by request (``token_offset`` delimits them).
        token_offset: Start of each request's tokens in ``token_s`` (one more than requests).
        arrival_s: Every request's scheduled arrival (before the shift).
        per_token_s: Added per output token after the first.
        post_decode_s: Added to each response's finish (not to its tokens).

    Returns:
        The requests, tokens and token times, adjusted (new objects).
    """
    requests = requests.copy()
    requests["arrival_s"] = arrival_s[: len(requests)]
    token_s = np.array(token_s, dtype=float, copy=True)
    n = len(requests)
    if per_token_s and n:
        counts = np.diff(token_offset[: n + 1])
        index = np.arange(int(token_offset[n])) - np.repeat(token_offset[:n], counts)
        token_s[: int(token_offset[n])] += index * per_token_s
        tokens = tokens.copy()
        tokens["time_s"] = tokens["time_s"] + tokens["index"] * per_token_s
        out = requests["output_tokens"].to_numpy(float)
        requests["finish_s"] = requests["finish_s"] + np.maximum(out - 1, 0) * per_token_s
    if post_decode_s and n:  # NaN (unfinished) stays NaN
        requests["finish_s"] = requests["finish_s"] + post_decode_s
    return requests, tokens, token_s
