"""``servelab compare --endpoint`` on an ``llm_roofline`` scenario (no step profile, so no
probes): against the stub server.
"""

from __future__ import annotations

import math
from pathlib import Path

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
    # the stub answers the first token 30 ms after the request, then one every 5 ms
    assert rows["ttft_ms.p50"]["live_median"] == pytest.approx(30, abs=25)
    assert math.isfinite(rows["ttft_ms.p50"]["sim"]) and rows["ttft_ms.p50"]["sim"] > 0
    assert (tmp_path / "cmp" / "bench-1" / "requests.parquet").exists()
