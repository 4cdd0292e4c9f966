"""Prompts of an exact token count for the chat API (``--api openai-chat``).

A chat request's prompt is the server's chat template wrapped around the message text, so its
token count is the template's fixed overhead plus the text's own tokens, and the text's count
depends on the server's tokenizer. Measured once before a run, from the server's own
``usage.prompt_tokens`` (any OpenAI-compatible server that reports usage):

* the overhead: a one-token request whose message is empty;
* units that are one token each: short strings (letters, digits) joined by spaces, which a
  byte-level BPE's pre-tokenizer keeps apart (``" a"``, ``" 7"``); all candidates are sent
  in one message, and the set is accepted when the count grows by exactly one per unit
  (otherwise each candidate is checked alone, and the single-token ones kept).

A prompt of ``P`` tokens is then ``P - overhead`` random units: unique per request, so a
prefix cache shares no more than the template. The run still checks every request's
``usage.prompt_tokens`` against ``P`` and counts mismatches
(``summary.client.prompt_token_mismatches``).
"""

from __future__ import annotations

import json
import string
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.endpoint.server_info import BAD_JSON, HTTP_ERRORS, EndpointError, read_capped

CANDIDATES = tuple(string.ascii_lowercase + string.digits)
# Enough units for prompts unique per request: two random prompts of k units share their
# first m tokens with probability k**-m, and a prefix cache shares only whole blocks (16 to
# 128 tokens): with 4 units, 4**-16 = 2e-10. The test server's tiny BPE tokenizer has 7
# (a, b, l, m, p, s, t); real tokenizers have all 36.
MIN_UNITS = 4


@dataclass(frozen=True)
class ChatPrompts:
    """The chat template's overhead (tokens) and the one-token units of the server's
    tokenizer.
    """

    overhead_tokens: int
    units: tuple[str, ...]

    def text(self, prompt_tokens: int, rng: np.random.Generator) -> str:
        """A message whose chat prompt has ``prompt_tokens`` tokens.

        Raises:
            EndpointError: ``prompt_tokens`` is not above the template's overhead.
        """
        n = prompt_tokens - self.overhead_tokens
        if n < 1:
            raise EndpointError(
                f"workload.prompt_tokens {prompt_tokens}: the server's chat template alone "
                f"takes {self.overhead_tokens} tokens; use prompts of at least "
                f"{self.overhead_tokens + 1} tokens, or --api openai-completions")
        picks = rng.integers(len(self.units), size=n)
        return " ".join(self.units[int(i)] for i in picks)


def _prompt_tokens(url: str, model: str, content: str) -> int:
    """``usage.prompt_tokens`` of a one-token chat request with ``content``."""
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 1, "max_completion_tokens": 1, "stream": False,
            "temperature": 0.0}
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer: Any = json.loads(read_capped(resp, f"POST {url}"))
    except (*HTTP_ERRORS, *BAD_JSON) as exc:
        raise EndpointError(f"POST {url}: measuring the chat template's tokens failed: "
                            f"{' '.join(str(exc).split())[:160]}") from None
    usage = answer.get("usage") if isinstance(answer, dict) else None
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(count, int):
        raise EndpointError(f"POST {url}: the server reports no usage.prompt_tokens, so the "
                            "chat prompts' lengths cannot be set; use --api "
                            "openai-completions (token-id prompts)")
    return count


def measure(url: str, model: str) -> ChatPrompts:
    """Measure the chat template's overhead and the one-token units (module docstring).

    Raises:
        EndpointError: the server reports no usage, or too few one-token units were found.
    """
    overhead = _prompt_tokens(url, model, "")
    together = _prompt_tokens(url, model, " ".join(CANDIDATES)) - overhead
    if together == len(CANDIDATES):
        units = CANDIDATES
    else:
        units = tuple(c for c in CANDIDATES
                      if _prompt_tokens(url, model, f"{c} {c}") - overhead == 2)
    if len(units) < MIN_UNITS:
        raise EndpointError(f"POST {url}: only {len(units)} of {len(CANDIDATES)} letters and "
                            "digits are one token each in this server's tokenizer, too few "
                            "for random prompts of exact length; use --api "
                            "openai-completions")
    return ChatPrompts(overhead, units)
