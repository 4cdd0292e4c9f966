"""``servelab compare --endpoint`` on an ``llm_roofline`` scenario (no step profile, so no
probes): against the stub server.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.executor.test_compare_roofline import roofline_scenario


def test_compare_endpoint_with_llm_roofline(stub_url: str, tmp_path: Path) -> None:
    from executor.endpoint.compare_endpoint import compare_endpoint

    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(roofline_scenario()))
    data = compare_endpoint(path, stub_url, tmp_path / "cmp", repeats=1,
                            model="timed:30:5", probe_mode="full")
    assert data["service"] == "llm_roofline" and data["profile"] is None
    assert data["probe_mode"] == "off" and not data["probed"]
    rows = {r["metric"]: r for r in data["rows"]}
    # the stub sends the first token 30 ms after it got the request and token i at 30 + 5 i
    # ms (due times: a late token is followed by earlier ones catching up), and a sleep never
    # ends early: per request, TTFT (from the send) is at least 30 ms and the whole stream at
    # least 30 + 5 (n - 1) ms, whatever the machine's load
    req = pd.read_parquet(tmp_path / "cmp" / "bench-1" / "requests.parquet")
    ok = req[req["status"] == "ok"]
    assert len(ok) == 6
    ttft_ms = (ok["first_token_s"] - ok["arrival_s"]).to_numpy() * 1e3
    e2e_ms = (ok["finish_s"] - ok["arrival_s"]).to_numpy() * 1e3
    assert (ttft_ms >= 30).all(), ttft_ms
    assert (e2e_ms >= 30 + 5 * (ok["output_tokens"].to_numpy() - 1)).all(), e2e_ms
    # the compare's row is the median of that run's TTFTs
    assert rows["ttft_ms.p50"]["live_median"] == pytest.approx(float(np.median(ttft_ms)))
    assert math.isfinite(rows["ttft_ms.p50"]["sim"]) and rows["ttft_ms.p50"]["sim"] > 0
    assert (tmp_path / "cmp" / "bench-1" / "requests.parquet").exists()
