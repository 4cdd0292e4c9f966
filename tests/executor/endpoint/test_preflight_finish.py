"""bench's preflight with ``finish``: it reads the 1-token stream to its end, so the server
has finished (and counted) the request when it returns; a stream that breaks is an error.
Without it, the preflight hangs up once it has the status, and a server aborts the request,
counting it or not by timing (:mod:`executor.endpoint.prefix_check`).
"""

from __future__ import annotations

import time

import pytest

from executor.endpoint.bench import preflight
from executor.endpoint.server_info import EndpointError

DELAY_S = 1.0  # the stub's wait between the headers and the first token ("slow:SECONDS")


def test_a_finished_preflight_waits_for_the_end_of_the_stream(stub_url: str) -> None:
    url = f"{stub_url}/v1/completions"
    t0 = time.perf_counter()
    preflight(url, "openai-completions", f"slow:{DELAY_S}", finish=True)
    assert time.perf_counter() - t0 >= DELAY_S  # the stub sleeps this long before its token
    preflight(url, "openai-completions", "instant", finish=True)


def test_a_finished_preflight_names_a_broken_stream(stub_url: str) -> None:
    with pytest.raises(EndpointError, match="1-token test request's stream broke"):
        preflight(f"{stub_url}/v1/completions", "openai-completions", "cut", finish=True)
    preflight(f"{stub_url}/v1/completions", "openai-completions", "cut")  # status only
