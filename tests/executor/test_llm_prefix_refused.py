"""A live LLM run with prefix caching on is refused (the live engine does not share KV yet)."""

from __future__ import annotations

import pytest

from executor.live_llm import live_llm
from executor.live_requests import LiveError


def test_live_refuses_prefix_caching_with_the_field_named() -> None:
    with pytest.raises(LiveError, match=r"policy\.enable_prefix_caching"):
        live_llm("builtin:llm-prefix-cache", replay=True)
